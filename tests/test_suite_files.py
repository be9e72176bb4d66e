"""The suite itself: tests/ has no __init__.py, so pytest imports each test file by its basename,
and two files with one name in two folders stop the collection of the whole suite ('import file
mismatch': make test exited 2 from a fresh clone when tests/cli/ and tests/app/ both had a
test_script_runs.py)."""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def test_every_test_file_has_its_own_basename():
    where = defaultdict(list)
    for path in TESTS.rglob("test_*.py"):
        where[path.name].append(str(path.relative_to(TESTS)))
    twice = {name: paths for name, paths in where.items() if len(paths) > 1}
    assert not twice, f"rename one of each: {twice}"


def test_the_files_started_first_exist():
    """tests/conftest.py's LONGEST names files by path: a renamed one would silently start last."""
    from tests.conftest import LONGEST

    gone = [path for path in LONGEST if not (TESTS.parent / path).is_file()]
    assert not gone, f"tests/conftest.py LONGEST names files that are not there: {gone}"
