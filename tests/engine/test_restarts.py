"""Restarts after a failure (train.max_restarts, torchrun's --max-restarts): our loop resumes from
its newest checkpoint, a user's script starts over with TORCHELASTIC_RESTART_COUNT set; each attempt
is one more part of the same run; a stop by the user is never restarted."""
from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from torchdeck.engine import metrics
from torchdeck.engine.events import read_all
from torchdeck.engine.models import mlp
from torchdeck.engine.runs import control
from tests.engine.helpers import (assert_same_weights, cli_cmd, ddp_cfg, env_for, final_model, run_supervised,
                                  start_cli, the_run, wait_for)


def killer(info, marker: str, at: int = 60, rank: str = "1"):
    """SIGKILLs its own rank in the forward of its `at`-th step, once (the marker file says it did)."""
    net = mlp(info, 32)
    calls = [0]

    def hook(mod, args):
        if mod.training:
            calls[0] += 1
            if calls[0] == at and os.environ.get("RANK") == rank and not Path(marker).exists():
                Path(marker).touch()
                os.kill(os.getpid(), signal.SIGKILL)
    net.register_forward_pre_hook(hook)
    return net


def kinds(run_dir, kind):
    return [e for e in read_all(Path(run_dir) / "events.jsonl") if e.get("kind") == kind]


def test_a_rank_killed_at_step_60_resumes_from_the_newest_checkpoint_with_the_same_weights(tmp_path):
    marker = tmp_path / "killed"
    cfg = ddp_cfg(**{"train.epochs": 10, "train.max_steps": 80, "train.log_every_n_steps": 10,
                     "checkpoint.every_n_steps": 10, "train.max_restarts": 2, "logging.tensorboard": True,
                     "model": {"name": "tests.engine.test_restarts:killer", "kwargs": {"marker": str(marker)}}})
    r = run_supervised(tmp_path / "restarted", cfg, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert marker.exists()  # rank 1 was killed once
    final = json.loads((tmp_path / "restarted" / "status.json").read_text())
    assert final["status"] == "finished", final
    (restart,) = kinds(tmp_path / "restarted", "restart")
    assert restart["attempt"] == 1 and restart["max_restarts"] == 2 and restart["resume_step"] == 50, restart
    assert "rank 1 killed by signal 9 (SIGKILL)" in restart["cause"], restart
    assert restart["lost_s"] >= 0 and restart["checkpoint"].endswith(".pt"), restart
    evs = read_all(tmp_path / "restarted" / "events.jsonl")
    after = [e["step"] for e in evs[evs.index(restart):] if e["kind"] == "step" and e["rank"] == 0]
    assert after[0] == 60 and after[-1] == 80  # from the checkpoint of step 50 on, not from the start
    if metrics.tensorboard_available():  # the live TensorBoard files: the attempt after the restart is a
        # session of its own from its first step (TensorBoard drops the lost attempt's points past it)
        from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

        starts = [e.step for f in sorted((tmp_path / "restarted" / "tensorboard").iterdir())
                  for e in EventFileLoader(str(f)).Load() if e.HasField("session_log") and e.session_log.status == 1]
        assert starts == [10, 60], starts
    r = run_supervised(tmp_path / "straight", cfg, timeout=300)  # the marker is there: nothing is killed
    assert r.returncode == 0, r.stdout + r.stderr
    assert not kinds(tmp_path / "straight", "restart")
    a, b = final_model(tmp_path / "restarted"), final_model(tmp_path / "straight")
    assert a["step"] == b["step"] == 80
    assert_same_weights(a["model"], b["model"], atol=1e-6)


RAISES = """
import os
n = os.environ["TORCHELASTIC_RESTART_COUNT"]
with open("counts.txt", "a") as fh:
    fh.write(f"{n} {os.environ['TORCHELASTIC_MAX_RESTARTS']}\\n")
raise RuntimeError(f"boom on attempt {n}")
"""


def test_a_script_that_raises_every_time_fails_after_3_attempts_each_said_in_attach(tmp_path):
    (tmp_path / "train.py").write_text(RAISES)
    r = subprocess.run(cli_cmd() + ["launch", "--max-restarts", "2", "--nproc-per-node", "1", "train.py"],
                       cwd=tmp_path, env=env_for(tmp_path), capture_output=True, text=True, timeout=180,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 1, r.stdout + r.stderr
    assert (tmp_path / "counts.txt").read_text().split("\n")[:-1] == ["0 2", "1 2", "2 2"]
    run = the_run(tmp_path)
    assert json.loads(run.status_path.read_text())["status"] == "failed"
    assert "boom on attempt 2" in json.loads(run.status_path.read_text())["root_cause"]
    restarts = kinds(run.path, "restart")
    assert [e["attempt"] for e in restarts] == [1, 2]
    assert ["boom on attempt 0" in restarts[0]["cause"], "boom on attempt 1" in restarts[1]["cause"]] == [True, True]
    shown = subprocess.run(cli_cmd() + ["attach", str(run.path)], cwd=tmp_path, env=env_for(tmp_path),
                           capture_output=True, text=True, timeout=60)
    out = shown.stdout + shown.stderr
    for attempt in (1, 2):
        line = next(ln for ln in out.splitlines() if f"restart {attempt}/2 after a failure" in ln)
        assert f"boom on attempt {attempt - 1}" in line and "from the start" in line, line
    assert "boom on attempt 2" in out and "restarted 2 times after a failure (max 2)" in out, out
    from torchdeck.app.monitor.panes import header_text
    from torchdeck.engine.runs import progress
    from torchdeck.engine.runs.view import RunView

    view = RunView.replay(read_all(run.events_path))
    assert [(a, m) for a, m, *_ in view.restarts] == [(1, 2), (2, 2)]
    assert "restart 2/2" in header_text(view, view.last_t, run.name, 120).plain  # the Monitor's header
    assert "restart 2/2" in progress.header(view, view.last_t, 120)  # attach's and run's


SLEEPS = """
import time
open("started", "w").close()
while True:
    time.sleep(0.1)
"""


def test_a_stop_by_the_user_is_not_restarted(tmp_path, cleanup):
    (tmp_path / "train.py").write_text(SLEEPS)
    proc, log = start_cli(tmp_path, "launch", "--max-restarts", "2", "--nproc-per-node", "1", "train.py")
    run = the_run(tmp_path)
    cleanup.append(run)
    wait_for(lambda: (tmp_path / "started").exists(), 60, "the script to start")
    control.request_stop(run)
    wait_for(lambda: proc.poll() is not None, 90, "the launch to end")
    assert json.loads(run.status_path.read_text())["status"] == "stopped", log.read_text()
    assert not kinds(run.path, "restart"), log.read_text()


def test_restarts_of_several_nodes_are_refused_with_one_message(tmp_path):
    (tmp_path / "train.py").write_text("print('never runs')\n")
    r = subprocess.run(cli_cmd() + ["launch", "--max-restarts", "1", "--nnodes", "2", "--master-port", "29999",
                                    "train.py"], cwd=tmp_path, env=env_for(tmp_path), capture_output=True,
                       text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.strip() == ("torchdeck launch: --max-restarts: restarts are for one node: several nodes would "
                                "all have to restart together, which torchdeck does not do yet; use one node, or "
                                "no restarts (resume a failed run with torchdeck resume)"), r.stderr
