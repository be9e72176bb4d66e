"""Fixtures the engine tests share (helper functions are in helpers.py)."""
from __future__ import annotations

import pytest

from torchdeck.engine.runs import control
from tests.engine.helpers import Run


@pytest.fixture
def runs():
    """Supervisors a test started (helpers.Run); any still alive at the end are killed."""
    started: list[Run] = []
    yield started
    for r in started:
        r.kill()


@pytest.fixture
def cleanup():
    """Whatever run a failed test leaves is killed."""
    started = []
    yield started
    for run in started:
        if control.run_processes(run):
            control.kill(run)
