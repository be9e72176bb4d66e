"""Every package of the repository is in the wheel: pyproject lists them by hand (the folders are
torchdeck.* subpackages at runtime), and a new package left out installs a torchdeck without it
(engine/supervisor/ and engine/runs/view/ were, on 2026-11-28: the wheel's torchdeck could not
start a run). The slow proof is tests/test_wheel.py; this one fails in a second."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_folder_is_listed_in_pyproject():
    text = (ROOT / "pyproject.toml").read_text()  # no tomllib before Python 3.11
    block = re.search(r"(?ms)^packages = \[(.*?)^\]", text).group(1)
    listed = set(re.findall(r'"(torchdeck[\w.]*)"', block))
    found = set()
    for top in ("engine", "app", "cli", "torchdeck"):
        for init in (ROOT / top).rglob("__init__.py"):
            parts = init.parent.relative_to(ROOT).parts
            found.add(".".join(parts if parts[0] == "torchdeck" else ("torchdeck",) + parts))
    assert not found - listed, f"packages missing from pyproject's [tool.setuptools] packages: {sorted(found - listed)}"
