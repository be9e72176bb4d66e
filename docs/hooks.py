"""MkDocs hook: a page's `<!-- generated: NAME -->` line becomes docs/gen_pages.py's page NAME at
build time, so the config reference and the strategy table are always the code's own."""
from __future__ import annotations

import re
import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent
for folder in (_HERE, _HERE.parent):  # gen_pages, and torchdeck from the checkout
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

import gen_pages  # noqa: E402

_MARK = re.compile(r"^<!-- generated: (\w+) -->$", re.M)


def on_page_markdown(markdown: str, page, config, files) -> str:
    return _MARK.sub(lambda m: gen_pages.PAGES[m.group(1)](), markdown)
