"""SLURM preemption: the exported sbatch script, run by bash with stand-ins for srun and scontrol
(for machines without the local cluster of tests/slurm), gets a real USR1: the batch shell passes
it to the node's supervisor, the ranks checkpoint and stop, the run records 'preempted', the job
requeues itself, and the requeued job continues the same run directory to the same weights as an
uninterrupted run."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from torchdeck.cli import main as cli
from torchdeck.engine import events
from torchdeck.engine.rundir.layout import RunDir
from tests.engine.helpers import assert_same_weights, final_model, run_in_process, small_cfg

SRUN = '#!/bin/bash\nwhile [[ "$1" == --* ]]; do shift; done\nSLURM_NODEID=0 SLURM_PROCID=0 exec "$@"\n'
SCONTROL = '#!/bin/bash\nif [ "$1" = requeue ]; then echo "$@" >> "$TD_TEST_REQUEUES"; else echo 127.0.0.1; fi\n'


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_usr1_checkpoints_records_preempted_requeues_and_resumes_to_the_same_weights(tmp_path, capsys):
    steps = 300
    cfg = small_cfg(strategy="ddp", devices=2, **{"train.batch_size": 16, "train.max_steps": steps,
                                                  "train.epochs": 100, "train.log_every_n_steps": 1,
                                                  "nodes.master_port": _free_port()})
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(cfg))
    assert cli.main(["export", str(tmp_path / "job.yaml"), "--sbatch"]) == 0
    script = capsys.readouterr().out
    assert "#SBATCH --signal=B:USR1@120" in script and "#SBATCH --requeue" in script
    (tmp_path / "job.sbatch").write_text(script)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("srun", SRUN), ("scontrol", SCONTROL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    requeues = tmp_path / "requeues.log"
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
               SLURM_SUBMIT_DIR=str(tmp_path), SLURM_JOB_ID="4242", SLURM_NNODES="1", SLURM_JOB_NODELIST="n1",
               TORCHDECK_VENV=str(Path(sys.executable).parent.parent), TD_TEST_REQUEUES=str(requeues),
               PYTHONPATH=os.pathsep.join([str(Path(cli.__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")]))
    runs = tmp_path / "runs"

    job = subprocess.Popen(["bash", str(tmp_path / "job.sbatch")], cwd=tmp_path, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while not any(e["kind"] == "step" and e["step"] >= 3 for p in runs.glob("*/events.jsonl")
                      for e in events.read_all(p)):
            assert job.poll() is None and time.monotonic() < deadline, "no training step seen"
            time.sleep(0.05)
        job.send_signal(signal.SIGUSR1)  # what --signal=B:USR1@120 sends the batch shell
        out, _ = job.communicate(timeout=120)
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode == 0, out[-3000:]
    assert requeues.read_text().split() == ["requeue", "4242"]
    (first,) = runs.iterdir()  # <time>-eq-job4242: the job's own, found again when it is requeued
    assert first.name.endswith("-eq-job4242")
    final = json.loads((first / "status.json").read_text())
    assert final["status"] == "preempted" and RunDir(first).status() == "preempted"
    saved = [e["step"] for e in events.read_all(first / "events.jsonl") if e["kind"] == "checkpoint"]
    assert saved and 3 <= saved[-1] < steps  # stopped early, after a checkpoint

    # SLURM reruns the script under the same job id, SLURM_RESTART_COUNT=1
    proc = subprocess.run(["bash", str(tmp_path / "job.sbatch")], cwd=tmp_path, capture_output=True, text=True,
                          env=dict(env, SLURM_RESTART_COUNT="1"), timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert requeues.read_text().split() == ["requeue", "4242"]  # finished: not requeued again
    (again,) = runs.iterdir()  # the same run, continued
    assert json.loads((again / "status.json").read_text())["status"] == "finished"
    assert json.loads((again / "status.attempt0.json").read_text())["status"] == "preempted"
    evs = events.read_all(again / "events.jsonl")
    requeued = next(i for i, e in enumerate(evs) if "SLURM requeued job 4242" in e.get("message", ""))
    first_step = min(e["step"] for e in evs[requeued:] if e["kind"] == "step")
    assert first_step == saved[-1] + 1  # resumed, not started over
    run_in_process(tmp_path / "one", small_cfg(**{"train.batch_size": 32, "train.max_steps": steps, "train.epochs": 100}))
    assert_same_weights(final_model(again)["model"], final_model(tmp_path / "one")["model"])


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
