"""One config through the launch (issue 36 item 6): validated once, where it is made; the run
directory's config.yaml is read back by the supervisor without the rules, its ranks get that
RunConfig itself, and a rank re-checks only what differs on its host (here: its GPUs)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from torchdeck.engine import config as cfgmod
from torchdeck.engine import events, preflight
from torchdeck.engine.rundir.config import load_validated
from tests.engine.helpers import ROOT, small_cfg


def _supervise(run) -> subprocess.CompletedProcess:
    """`python -m torchdeck.engine.supervisor RUN_DIR`, as `torchdeck run` starts it."""
    return subprocess.run([sys.executable, "-m", "torchdeck.engine.supervisor", str(run)], cwd=ROOT,
                          capture_output=True, text=True, timeout=180)


def _judged_elsewhere(tmp_path):
    """A config.yaml whose one oddity the rules refuse (pinned memory on a CPU run: it would never
    be used) although it runs as well without: as if its maker had judged it under other rules."""
    data = small_cfg(**{"data.pin_memory": True, "train.max_steps": 2})
    cfg, problems = cfgmod.build(data)
    assert not problems
    run = tmp_path / "run"
    run.mkdir()
    cfgmod.save(cfg, run / "config.yaml")
    return run


def test_the_run_directorys_config_is_read_back_without_the_rules(tmp_path):
    run = _judged_elsewhere(tmp_path)
    with pytest.raises(cfgmod.ConfigError, match="data.pin_memory: pinned memory only helps"):
        preflight.load(run / "config.yaml")  # the full rules, as where a config is made
    assert load_validated(run / "config.yaml").data.pin_memory is True
    (run / "config.yaml").write_text("train:\n  batch_size: many\n")  # no config any more: still refused
    with pytest.raises(cfgmod.ConfigError, match="train.batch_size"):
        load_validated(run / "config.yaml")


@pytest.mark.slow
def test_neither_the_supervisor_nor_its_ranks_judge_the_config_again(tmp_path):
    """Before: the supervisor re-ran every rule (and each rank the schema's) on what the CLI had
    already validated; a config.yaml refused by the rules failed the run before any rank."""
    run = _judged_elsewhere(tmp_path)
    proc = _supervise(run)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    st = json.loads((run / "status.json").read_text())
    assert st["status"] == "finished", st
    assert any(e["kind"] == "step" for e in events.read_all(run / "events.jsonl"))


@pytest.mark.slow
def test_a_gpu_this_host_lacks_is_refused_at_the_rank_in_its_own_words(tmp_path):
    """A config made for another host (validated there, or with no host: for another node) names
    GPU 99: the rank, on the host that runs it, refuses it before touching the device, naming it
    and what this host has (before: torch's own error from set_device)."""
    cfg = preflight.from_dict(small_cfg(strategy="gpu", accelerator="cuda", devices=[99]))
    run = tmp_path / "run"
    run.mkdir()
    cfgmod.save(cfg, run / "config.yaml")
    import torch

    if torch.cuda.device_count() > 99:
        pytest.skip("this host has a GPU 99")
    proc = _supervise(run)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    cause = json.loads((run / "status.json").read_text())["root_cause"]
    assert cause.startswith("rank 0 (") and "ConfigError: devices: GPU 99 does not exist on host" in cause, cause
    assert "(local rank 0): it has" in cause, cause
    evs = events.read_all(run / "events.jsonl")
    assert not any(e["kind"] in ("rank_ready", "step") for e in evs)
