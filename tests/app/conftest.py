"""The app tests start a hundred Textual apps in one process. Textual caches a colour lookup per
widget style cache (StylesCache.get_inner_outer, an lru_cache on a method, so keyed by the
instance): up to 1024 of them, with every line they had drawn, outlived their apps, ~17k objects a
Configure start until it was full. Python's full collections walked them all, 2-3 times a test.
Emptied after each test: what one test drew is no load on the next."""
from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _drawn_lines_go_with_their_app():
    yield
    from textual import _styles_cache

    cached = getattr(getattr(_styles_cache, "StylesCache", None), "get_inner_outer", None)
    if hasattr(cached, "cache_clear"):  # a private part of Textual: gone in another version, nothing to do
        cached.cache_clear()
