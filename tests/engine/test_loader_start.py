"""How a rank's DataLoader workers start (data.worker_start). A rank that
torch.multiprocessing.spawn started would start its workers by spawn too, each importing torch
afresh (seconds on a small machine before the first batch); auto forks them on Linux as a plain
script does. Real supervised runs: each worker writes down whether it was forked from its rank."""
from __future__ import annotations

import sys

import pytest

from engine import config as cfgmod
from engine.cache import worker_start
from engine.events import read_all
from tests.engine.helpers import run_supervised, small_cfg

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="auto forks on Linux only")


def _starts(tmp_path, setting: str) -> tuple[list[str], list[dict]]:
    out = tmp_path / "seen"
    out.mkdir()
    cfg = small_cfg(**{"data.dataset": "tests.engine.probes:start_data", "data.num_workers": 1,
                       "data.worker_start": setting, "train.batch_size": 8, "train.max_steps": 4})
    proc = run_supervised(tmp_path / "run", cfg, env={"PROBE_OUT": str(out)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return [p.read_text() for p in out.glob("start*")], read_all(tmp_path / "run" / "events.jsonl")


@linux
def test_auto_forks_the_loader_workers_of_a_spawned_rank(tmp_path):
    starts, evs = _starts(tmp_path, "auto")
    assert starts == ["forked"]
    phases = [e["phase"] for e in evs if e["kind"] == "phase"]
    assert phases[-2:] == ["batch", "steps"]  # the first batch is a start-up phase of its own
    assert any(e["kind"] == "log" and "1 loader worker(s) per rank, started by fork" in e["message"] for e in evs)


def test_spawn_starts_them_afresh_as_asked(tmp_path):
    starts, _ = _starts(tmp_path, "spawn")
    assert starts == ["afresh"]


def test_the_setting_maps_to_dataloaders_multiprocessing_context(monkeypatch):
    assert worker_start("spawn", 2) == {"multiprocessing_context": "spawn"}
    assert worker_start("auto", 0) == {} and worker_start("fork", 0) == {}  # no workers: nothing to start
    monkeypatch.setattr(sys, "platform", "linux")
    assert worker_start("auto", 2) == {"multiprocessing_context": "fork"}
    monkeypatch.setattr(sys, "platform", "darwin")
    assert worker_start("auto", 2) == {}  # the platform's own default (spawn on macOS)


def test_fork_on_windows_and_unknown_values_are_refused(monkeypatch):
    with pytest.raises(cfgmod.ConfigError, match="data.worker_start: must be one of auto, fork, spawn"):
        cfgmod.from_dict(small_cfg(**{"data.worker_start": "thread"}))
    monkeypatch.setattr(sys, "platform", "win32")
    with pytest.raises(cfgmod.ConfigError, match="data.worker_start: fork is not available on Windows; use auto or spawn"):
        cfgmod.from_dict(small_cfg(**{"data.worker_start": "fork"}))
