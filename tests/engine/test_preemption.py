"""SLURM preemption's first step: USR1 to a supervisor stops the run with a checkpoint, as 'preempted'.
The whole path (the batch script, every node, the requeue and the resume to the same weights) runs
on the real local cluster: tests/slurm/test_slurm_job.py."""
from __future__ import annotations

import signal
import subprocess
import sys
import time

from torchdeck.engine import events
from torchdeck.engine.rundir.layout import RunDir
from tests.engine.helpers import small_cfg


def test_usr1_to_the_supervisor_stops_with_a_checkpoint_as_preempted(tmp_path):
    """`torchdeck run` inside a SLURM allocation: the supervisor takes USR1 the same way."""
    from torchdeck.engine import config as cfgmod
    from tests.engine.helpers import ROOT

    run = tmp_path / "run"
    run.mkdir()
    cfgmod.save(cfgmod.from_dict(small_cfg(strategy="ddp", devices=2, **{
        "train.max_steps": 0, "train.epochs": 1000, "train.log_every_n_steps": 1})), run / "config.yaml")
    sup = subprocess.Popen([sys.executable, "-m", "torchdeck.engine.supervisor", str(run)], cwd=ROOT,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not any(e["kind"] == "step" for e in events.read_all(run / "events.jsonl")):
            assert sup.poll() is None and time.monotonic() < deadline, "no training step seen"
            time.sleep(0.05)
        sup.send_signal(signal.SIGUSR1)
        assert sup.wait(timeout=60) == 0
    finally:
        if sup.poll() is None:
            sup.kill()
    assert RunDir(run).status() == "preempted"
    assert any(e["kind"] == "checkpoint" for e in events.read_all(run / "events.jsonl"))
