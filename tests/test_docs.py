"""The docs site: a strict MkDocs build (warnings are errors: a broken link, a page missing from
the nav, a snippet that is not there), and the pages made from the code follow the code."""
from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NO_MKDOCS = "mkdocs with the Material theme is not installed (pip install -e '.[docs]'; make test installs it)"


def _gen(page: str, pythonpath: Path | None = None) -> str:
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    return subprocess.run([sys.executable, str(ROOT / "docs" / "gen_pages.py"), page], cwd=ROOT, env=env,
                          capture_output=True, text=True, check=True, timeout=120).stdout


@pytest.mark.skipif(not (importlib.util.find_spec("mkdocs") and importlib.util.find_spec("material")),
                    reason=NO_MKDOCS)
def test_docs_site_builds_strict(tmp_path):
    out = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                         cwd=ROOT, env=dict(os.environ, NO_MKDOCS_2_WARNING="1"), capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    reference = (tmp_path / "site" / "reference" / "config" / "index.html").read_text()
    assert "<code>train.batch_size</code>" in reference and "<!-- generated" not in reference
    for name in ("ddp", "fsdp", "script"):
        assert f'id="{name}"' in (tmp_path / "site" / "reference" / "strategies" / "index.html").read_text()


def test_config_reference_follows_the_schema(tmp_path):
    """A copy of the schema with a default and a rule changed: the generated page says the new ones."""
    assert "| `train.batch_size` | `64` | per process" in _gen("config")
    copy = tmp_path / "copy"
    shutil.copytree(ROOT / "engine", copy / "engine", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "torchdeck", copy / "torchdeck", ignore=shutil.ignore_patterns("__pycache__"))
    schema = copy / "engine" / "config.py"
    text = schema.read_text()
    for old, new in (("    batch_size: int = 64", "    batch_size: int = 48"),
                     ('p.at_least("train.batch_size", t.batch_size, 1)', 'p.at_least("train.batch_size", t.batch_size, 8)')):
        assert old in text, f"the test's edit no longer applies to engine/config.py: {old!r}"
        text = text.replace(old, new)
    schema.write_text(text)
    page = _gen("config", pythonpath=copy)
    row = next(line for line in page.splitlines() if line.startswith("| `train.batch_size` |"))
    assert row.startswith("| `train.batch_size` | `48` |") and row.endswith("| must be at least 8 |"), row


def test_strategy_table_covers_the_registry():
    from torchdeck.engine.strategies import get_strategy, names

    page = _gen("strategies")
    for name in names():
        assert f"## `{name}`" in page and get_strategy(name).summary in page, name


def test_presets_table_lists_every_shipped_preset():
    """The table the README kept by hand had lost lm-cpu and lm-gpu; made from presets/ it cannot."""
    page = _gen("presets")
    for path in (ROOT / "presets").glob("*.yaml"):
        assert f"| `{path.stem}`" in page, path.stem


def test_readme_is_a_front_page():
    """Under 150 lines, with the Monitor's picture (made by docs/screenshots.py) and the tour's steps."""
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) < 150
    picture = "docs/images/monitor-140x45.svg"
    assert f"]({picture})" in text and (ROOT / picture).stat().st_size > 10_000
    for step in ("torchdeck run quickstart", "torchdeck launch", "torchdeck compare", "torchdeck env"):
        assert step in text, step
