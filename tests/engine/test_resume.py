"""Resume equals an uninterrupted run: mid-epoch position, LR schedule, optimizer and RNG."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import pytest
import torch

from torchdeck.engine import checkpoint as ckpt
from torchdeck.engine import events
from tests.engine.helpers import ROOT, assert_same_weights, final_model, run_in_process, run_supervised, small_cfg


@pytest.mark.parametrize("opt,sched,precision", [("sgd", "cosine", "32-true"), ("adamw", "onecycle", "32-true"),
                                                ("adam", "step", "bf16-mixed")])
def test_resume_from_mid_epoch_checkpoint_equals_uninterrupted(tmp_path, opt, sched, precision):
    # 256 samples / batch 32 = 8 steps per epoch; 12 steps cross an epoch boundary.
    cfg = small_cfg(**{"train.max_steps": 12, "checkpoint.every_n_steps": 3, "scheduler.name": sched,
                       "scheduler.warmup_steps": 2, "scheduler.min_lr": 0.001, "optimizer.name": opt,
                       "optimizer.lr": 0.01, "train.precision": precision, "train.grad_clip": 1.0})
    if precision == "bf16-mixed":  # the mlp, recording each forward's output dtype
        cfg["model"] = {"name": "tests.engine.probes:recording", "kwargs": {"base": "mlp", "hidden": 32}}
    from tests.engine import probes

    probes.SEEN.clear()
    full = tmp_path / "full"
    ev = run_in_process(full, cfg)
    saved = [e["step"] for e in ev if e["kind"] == "checkpoint"]
    assert saved == [3, 6, 9, 12]
    ref = final_model(full)
    for step in (3, 9):  # mid first epoch; mid second epoch
        path = full / "checkpoints" / ckpt.file_name(step)
        state = ckpt.load(path)
        assert (state["epoch"], state["batches_done"]) == divmod(step, 8)
        resumed = tmp_path / f"from{step}"
        ev = run_in_process(resumed, {**cfg, "checkpoint": {**cfg["checkpoint"], "resume": str(path)}})
        assert any(e["kind"] == "log" and "resumed from" in e["message"] for e in ev)
        first = next(e for e in ev if e["kind"] == "step")
        assert first["step"] > step  # the steps before the checkpoint were not redone
        out = final_model(resumed)
        assert out["step"] == 12
        assert_same_weights(out["model"], ref["model"], atol=1e-6)
        assert out["scheduler"]["_last_lr"] == pytest.approx(ref["scheduler"]["_last_lr"])
    if precision == "bf16-mixed":  # both ways ran under autocast, before and after the resume
        assert len(probes.SEEN) == 12 + 9 + 3 and all(s["output_dtype"] == torch.bfloat16 for s in probes.SEEN)


def test_stop_after_max_steps_then_resume_with_more_steps(tmp_path):
    base = small_cfg(**{"scheduler.name": "step", "scheduler.gamma": 0.5, "train.epochs": 3})
    straight = {**base, "train": {**base["train"], "max_steps": 14}}
    run_in_process(tmp_path / "straight", straight)
    first = {**base, "train": {**base["train"], "max_steps": 5}}
    run_in_process(tmp_path / "first", first)
    part = final_model(tmp_path / "first")
    assert part["step"] == 5
    more = {**straight, "checkpoint": {**base["checkpoint"], "resume": "latest",
                                       "dir": str(tmp_path / "first" / "checkpoints")}}
    evs = run_in_process(tmp_path / "more", more)
    batch = next(e for e in evs if e["kind"] == "phase" and e["phase"] == "batch")
    assert (batch["step"], batch["epoch"]) == (5, 0)  # where it trains from, before its first step event
    a, b = final_model(tmp_path / "first"), final_model(tmp_path / "straight")  # "more" wrote into first's dir
    assert a["step"] == b["step"] == 14
    assert_same_weights(a["model"], b["model"], atol=1e-6)
    assert not torch.allclose(part["model"]["1.weight"], b["model"]["1.weight"])


def test_latest_skips_damaged_and_partial_files(tmp_path):
    d = tmp_path / "ck"
    for step in (1, 2):
        ckpt.save({"model": {"w": torch.full((2,), float(step))}, "step": step}, d, step, keep_last=5)
    (d / ckpt.file_name(3)).write_bytes(b"not a checkpoint: killed mid-write by a non-atomic writer")
    (d / f".{ckpt.file_name(4)}.tmp-123").write_bytes(b"partial")
    path, state = ckpt.latest(d)
    assert path.name == ckpt.file_name(2) and state["step"] == 2
    for step in range(5, 9):
        ckpt.save({"model": {}, "step": step}, d, step, keep_last=2)
    assert [s for s, _ in ckpt.listing(d)] == [7, 8]


def test_run_dir_and_resume_agree_on_the_newest_complete_checkpoint(tmp_path):
    """`torchdeck resume/eval RUN` (RunDir.newest_checkpoint, torch-free) and the resuming rank
    (checkpoint.latest) read one naming rule: a deepspeed folder without its meta file is not
    complete yet, and a name the engine never writes is no checkpoint."""
    from torchdeck.engine.rundir.layout import RunDir

    run = RunDir(tmp_path / "20250101-000000-r")
    d = run.checkpoint_dir
    for step in (4, 8):
        (d / ckpt.dir_name(step)).mkdir(parents=True)
    (d / ckpt.dir_name(4) / ckpt.META_NAME).write_bytes(b"meta")  # ckpt 8: its ranks' parts, no meta yet
    (d / "ckpt-9.pt").write_bytes(b"")
    assert [s for s, _ in ckpt.listing(d, dirs=True)] == [4]
    assert run.newest_checkpoint() == (4, d / ckpt.dir_name(4))


def test_checkpoint_loads_weights_only_and_restores_rng(tmp_path):
    import random

    import numpy as np

    random.seed(1)
    np.random.seed(1)
    torch.manual_seed(1)
    state = {"model": {}, "step": 0, "rng": ckpt.rng_state()}
    ckpt.save(state, tmp_path, 0, keep_last=1)
    expect = (random.random(), float(np.random.rand()), torch.rand(1).item())
    loaded = torch.load(tmp_path / ckpt.file_name(0), weights_only=True)
    ckpt.set_rng_state(loaded["rng"])
    assert (random.random(), float(np.random.rand()), torch.rand(1).item()) == expect


@pytest.mark.slow
def test_graceful_stop_then_resume_latest_equals_uninterrupted_ddp(tmp_path, monkeypatch):
    """Stop a 2-rank run through its stop file at whatever step it is, resume it, and compare with
    an uninterrupted run (one process, batch 2B: equal to DDP, see test_equivalence)."""
    (tmp_path / "slowmlp.py").write_text(SLOW_MODEL)
    env = {"PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    cfg = small_cfg(strategy="ddp", devices=2, **{"train.batch_size": 8, "train.max_steps": 0,
                                                  "train.epochs": 3, "nodes.master_port": 0,
                                                  "checkpoint.every_epoch": True,
                                                  "model.name": "slowmlp:build"})
    run = tmp_path / "stopped"
    run.mkdir()
    from torchdeck.engine import config as cfgmod

    cfgmod.save(cfgmod.from_dict(cfg), run / "config.yaml")
    proc = subprocess.Popen([sys.executable, "-m", "torchdeck.engine.supervisor", str(run)], cwd=ROOT,
                            env=dict(os.environ, **env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if any(e["kind"] == "step" for e in events.read_all(run / "events.jsonl")):
            break
        time.sleep(0.05)
    (run / "stop").touch()
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    assert json_status(run)["status"] == "stopped"
    stopped_at = final_model(run)["step"]
    assert 0 < stopped_at < 48, "stopped too late to test a resume; the stop file was not honoured"

    (run / "stop").unlink()
    cfg["checkpoint"]["resume"] = "latest"
    shutil.move(run / "events.jsonl", run / "events.first.jsonl")
    proc = run_supervised(run, cfg, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    resumed = final_model(run)

    monkeypatch.syspath_prepend(str(tmp_path))
    straight = small_cfg(**{"train.batch_size": 16, "train.max_steps": 0, "train.epochs": 3,
                            "model.name": "slowmlp:build"})
    run_in_process(tmp_path / "straight", straight)
    ref = final_model(tmp_path / "straight")
    assert resumed["step"] == ref["step"] == 48
    assert_same_weights(resumed["model"], ref["model"])


SLOW_MODEL = """
import time
from torchdeck.engine.models import mlp


def build(info):
    net = mlp(info, 32)
    net.register_forward_pre_hook(lambda mod, args: time.sleep(0.04) if mod.training else None)
    return net
"""


def json_status(run):
    import json

    return json.loads((run / "status.json").read_text())


def test_resume_latest_in_a_new_run_dir_continues_the_last_run_of_that_name(tmp_path):
    """A relaunch gets a fresh run directory; `resume: latest` finds the earlier run's checkpoint."""
    from torchdeck.engine import config as cfgmod

    cfg = small_cfg(name="same", **{"train.max_steps": 4})
    for name, c in (("1-same", cfg), ("2-other", small_cfg(name="other", **{"train.max_steps": 7}))):
        (tmp_path / name).mkdir()
        cfgmod.save(cfgmod.from_dict(c), tmp_path / name / "config.yaml")
        run_in_process(tmp_path / name, c)
    again = small_cfg(name="same", **{"train.max_steps": 6, "checkpoint.resume": "latest"})
    (tmp_path / "3-same").mkdir()
    ev = run_in_process(tmp_path / "3-same", again)
    msg = next(e["message"] for e in ev if e["kind"] == "log" and "resumed" in e["message"])
    assert "1-same" in msg and "step 4" in msg
    assert [e["step"] for e in ev if e["kind"] == "step"] == [6]
