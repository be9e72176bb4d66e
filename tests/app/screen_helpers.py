"""Helpers for app tests that read the screen as a person does (not collected as tests)."""
from __future__ import annotations

import html
import re
import time


def screen_text(app) -> str:
    """What the screen shows, as plain text lines (the SVG screenshot's text runs, in order)."""
    return "\n".join(svg_rows(app.export_screenshot()))


def svg_rows(svg: str) -> list[str]:
    """A Textual SVG screenshot's text, row by row, as a person reads it (its <text> runs placed by
    column); docs/screenshots.py reads its pictures with it too."""
    rows: dict[int, list] = {}
    for m in re.finditer(r'<text class="[^"]*" x="([\d.]+)" y="[\d.]+" textLength="[\d.]+" '
                         r'clip-path="url\(#[^)]*-line-(\d+)\)">(.*?)</text>', svg):
        rows.setdefault(int(m.group(2)), []).append((float(m.group(1)), html.unescape(m.group(3))))
    out = []
    for line in sorted(rows):
        s = ""
        for x, txt in sorted(rows[line]):
            s = s.ljust(int(round(x / 12.2))) + txt
        out.append(s.replace("\xa0", " "))
    return out


def inside(inner, outer) -> bool:
    """Whether region `inner` lies wholly within region `outer` (nothing of it clipped)."""
    return (inner.x >= outer.x and inner.y >= outer.y and inner.right <= outer.right
            and inner.bottom <= outer.bottom)


async def until(pilot, cond, timeout: float = 20.0) -> bool:
    """Pause the app until cond() holds (True) or the time is up (False)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        await pilot.pause(0.05)
    return bool(cond())
