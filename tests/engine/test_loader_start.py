"""How a rank's DataLoader workers start (data.worker_start). A rank that
torch.multiprocessing.spawn started would start its workers by spawn too, each importing torch
afresh (seconds on a small machine before the first batch); auto starts them from a fork server
that imported torch once (forking the rank itself can hang on Python 3.11). Real supervised runs:
each worker writes down how it began."""
from __future__ import annotations

import json
import sys

import pytest

from torchdeck.engine import config as cfgmod
from torchdeck.engine.cache import worker_start
from torchdeck.engine.events import read_all
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
def test_auto_forks_the_loader_workers_from_a_fork_server(tmp_path):
    starts, evs = _starts(tmp_path, "auto")
    assert starts == ["fork server"]
    phases = [e["phase"] for e in evs if e["kind"] == "phase"]
    assert phases[-2:] == ["batch", "steps"]  # the first batch is a start-up phase of its own
    assert any(e["kind"] == "log" and "1 loader worker(s) per rank, forked from a fork server" in e["message"]
               for e in evs)


@pytest.mark.parametrize("setting, how", [("spawn", "afresh"), ("fork", "forked")])
def test_spawn_and_fork_start_them_as_asked(tmp_path, setting, how):
    starts, _ = _starts(tmp_path, setting)
    assert starts == [how]


def test_the_setting_maps_to_dataloaders_multiprocessing_context(monkeypatch):
    assert worker_start("spawn", 2) == {"multiprocessing_context": "spawn"}
    assert worker_start("auto", 0) == {} and worker_start("fork", 0) == {}  # no workers: nothing to start
    monkeypatch.setattr(sys, "platform", "linux")
    assert worker_start("auto", 2) == {"multiprocessing_context": "forkserver"}
    monkeypatch.setattr(sys, "platform", "darwin")
    assert worker_start("auto", 2) == {}  # the platform's own default (spawn on macOS)


def test_validate_and_the_summary_say_how_the_workers_will_start(tmp_path, monkeypatch):
    from torchdeck.engine import cache

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.setattr(sys, "platform", "linux")
    line = lambda start: cache.plan(cfgmod.from_dict(small_cfg(**{
        "data.dataset": "imagefolder", "data.root": str(tmp_path), "data.cache": "none", "data.num_workers": 2,
        "data.worker_start": start})), nproc=1).line
    assert "by 2 loader workers per rank, forked from a fork server (data.cache: none)" in line("auto")
    assert "by 2 loader workers per rank, started by spawn (data.cache: none)" in line("spawn")


def test_fork_on_windows_and_unknown_values_are_refused(monkeypatch):
    with pytest.raises(cfgmod.ConfigError, match="data.worker_start: must be one of auto, fork, spawn"):
        cfgmod.from_dict(small_cfg(**{"data.worker_start": "thread"}))
    monkeypatch.setattr(sys, "platform", "win32")
    with pytest.raises(cfgmod.ConfigError, match="data.worker_start: fork is not available on Windows; use auto or spawn"):
        cfgmod.from_dict(small_cfg(**{"data.worker_start": "fork"}))


@linux
@pytest.mark.timeout(300)
def test_an_image_folder_rank_and_its_workers_server_do_not_import_torchvision_or_dynamo(tmp_path):
    """A folder read every epoch (data.cache none) by workers from a fork server: the rank reads the
    pictures and the server preloads without torchvision, whose import brings torch._dynamo (seconds
    of CPU in each, on every start). Checked in a real run, after its optimizer steps."""
    from tests.engine.test_cache import pngs

    root = pngs(tmp_path / "pngs", per_class=8, size=(16, 16))
    out = tmp_path / "seen.json"
    cfg = small_cfg(**{"model.name": "tests.engine.probes:modules_model", "model.kwargs": {"out": str(out)},
                       "data.dataset": "imagefolder", "data.root": str(root), "data.image_size": 16,
                       "data.cache": "none", "data.num_workers": 1, "data.augment": "crop+flip",
                       "train.batch_size": 4, "train.max_steps": 3})
    proc = run_supervised(tmp_path / "run", cfg)
    assert proc.returncode == 0, proc.stderr[-2000:]
    evs = read_all(tmp_path / "run" / "events.jsonl")
    assert any(e["kind"] == "log" and "forked from a fork server" in e["message"] for e in evs)
    assert json.loads(out.read_text()) == {"server": [], "rank": []}
