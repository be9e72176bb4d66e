"""The key bar, drawn with the screen's first frame.

Textual's Footer composes nothing until its screen signals that the bindings are ready, and then
recomposes after the next refresh, so the keys arrive a frame or two after the screen (about
0.1 s at start-up on a 2-core machine: the first thing a user reads is what to press). A screen's
bindings are known when it is composed, so this one draws them at once, then follows binding
changes as Footer does.
"""
from __future__ import annotations

from textual.widgets import Footer


class KeyBar(Footer):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.set_reactive(Footer._bindings_ready, True)
