"""A rank reuses freed tensor buffers (engine.worker.keep_freed_buffers): measured as the page
faults a real rank takes when it frees and reallocates a 40 MiB buffer."""
from __future__ import annotations

import json

import pytest

from torchdeck.engine.worker import keep_freed_buffers
from tests.engine.helpers import run_supervised, small_cfg

PAGES = (40 << 20) // 4096  # what one round costs when its buffer comes fresh from mmap


def _rounds(tmp_path, env=None):
    out = tmp_path / "seen"
    out.mkdir()
    cfg = small_cfg(**{"model.name": "tests.engine.probes:faults_model", "model.kwargs": {"out": str(out)},
                       "train.max_steps": 1})
    proc = run_supervised(tmp_path / "run", cfg, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads((out / "faults0.json").read_text())


def test_a_rank_reallocates_a_freed_40_mib_buffer_without_faulting_it_in_again(tmp_path):
    rounds = _rounds(tmp_path)
    # glibc's default: ~PAGES every round (>32 MiB is always mmap). One round may still fault its buffer
    # in afresh: when another thread of the rank holds the main arena's lock at that moment, malloc serves
    # the block from another arena (seen once in a fresh-clone CI run: [10152, 0, 10241, 0, 0, ...])
    assert sorted(rounds[2:])[-2] < PAGES // 10, rounds


def test_the_users_malloc_settings_win(tmp_path, monkeypatch):
    monkeypatch.setenv("MALLOC_ARENA_MAX", "2")
    assert keep_freed_buffers() is False
    rounds = _rounds(tmp_path, env={"MALLOC_MMAP_THRESHOLD_": str(1 << 20)})
    assert min(rounds[2:]) > PAGES // 2, rounds  # the user's 1 MiB threshold: every round mapped afresh
