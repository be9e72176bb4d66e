"""The docs' pictures (docs/images, made by docs/screenshots.py) are what the app draws today.

Its own file so that, with the suite spread over workers file by file, it runs beside the strict
docs build rather than after it."""
from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _screenshots():
    spec = importlib.util.spec_from_file_location("docs_screenshots", ROOT / "docs" / "screenshots.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_pictures_are_what_the_app_draws():
    """Each committed docs/images picture (5 screens x 80x24 and 140x45) is redrawn in-process from its
    fixed-time run, frozen clock and fake GPUs, and must equal the file but for Rich's per-export ids:
    a screen that changed leaves its picture stale until `python docs/screenshots.py` is run."""
    shots = _screenshots()
    names = shots.picture_names()
    committed = {p.stem for p in (ROOT / "docs" / "images").glob("*.svg")}
    assert len(names) == 10 and committed == set(names), (
        f"docs/images holds {sorted(committed - set(names))} that docs/screenshots.py does not make, "
        f"lacks {sorted(set(names) - committed)}")
    stale = shots.stale(names)
    assert not stale, "pictures no longer match the app (run python docs/screenshots.py):\n" + "\n".join(
        f"  docs/images/{name}.svg: {why}" for name, why in stale)


def test_the_docs_show_every_picture():
    pages = "".join(p.read_text() for p in (ROOT / "docs").glob("*.md"))
    for name in _screenshots().picture_names():
        assert f"](images/{name}.svg)" in pages, name
