"""A run survives what goes wrong (issue 5): stop, Ctrl-C, a lost terminal, a killed rank, a busy port.

Each test drives the real `torchdeck` command with a real 2-rank gloo run and asserts the
outcome within a bound and that no process of the run is left (psutil, by the run's session).
"""
import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from torchdeck.engine.runs import control
from torchdeck.engine.events import read_all
from tests.engine.helpers import LEFT_WITHIN_S, LONG, _as_in_a_terminal, assert_nothing_left, cli_cmd, env_for, port_free, port_of, preset, rank_pids, start_cli, steps_seen, the_run, wait_for  # noqa: F401  (shared)

pytestmark = pytest.mark.slow


def slow_preset(tmp_path):
    """preset()'s run with ranks that sleep 50 ms a training step (usermodels:slow): a test that only
    waits to stop the run need not pay for two ranks training flat out until it does."""
    from tests.engine.helpers import USER_MODELS

    (tmp_path / "usermodels.py").write_text(USER_MODELS)
    p = preset(tmp_path)
    p.write_text(p.read_text().replace("model: {name: mlp, hidden: 32}", "model: {name: 'usermodels:slow'}"))
    return p


def test_graceful_stop_with_torchdeck_stop(tmp_path):
    r = subprocess.run(cli_cmd() + ["run", str(slow_preset(tmp_path)), "--detach"], cwd=tmp_path,
                       env=env_for(tmp_path), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "torchdeck attach" in r.stdout
    run = the_run(tmp_path)
    wait_for(lambda: steps_seen(run), 120, "training steps")
    pids = list(rank_pids(run).values()) + [run.supervisor_pid()]
    port = port_of(run)

    t0 = time.monotonic()
    r = subprocess.run(cli_cmd() + ["stop", run.name, "--wait", "60"], cwd=tmp_path, env=env_for(tmp_path),
                       capture_output=True, text=True, timeout=90)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "stop requested" in r.stdout and "run stopped" in r.stdout
    assert json.loads(run.status_path.read_text())["status"] == "stopped"
    assert_nothing_left(run, pids, within=max(1.0, 30 - (time.monotonic() - t0)))
    ckpts = [e for e in read_all(run.events_path) if e["kind"] == "checkpoint"]
    assert ckpts and Path(ckpts[-1]["path"]).is_file(), "the stop wrote a checkpoint"
    assert port_free(port), "the master port is free again"


def test_ctrl_c_in_torchdeck_run_stops_gracefully(tmp_path):
    proc, log = start_cli(tmp_path, "run", str(slow_preset(tmp_path)))
    run = the_run(tmp_path)
    wait_for(lambda: steps_seen(run), 120, "training steps")
    pids = list(rank_pids(run).values()) + [run.supervisor_pid()]
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)  # what Ctrl-C sends to the foreground process
    code = proc.wait(timeout=60)
    out = log.read_text()
    assert code == 0, out
    assert "stopping: finishing the step and checkpointing; Ctrl-C again to kill" in out
    assert "run stopped" in out
    assert "Traceback" not in out
    assert run.final_status()["status"] == "stopped"
    assert any(e["kind"] == "checkpoint" for e in read_all(run.events_path))
    assert_nothing_left(run, pids, within=max(1.0, 30 - (time.monotonic() - t0)))


def test_lost_terminal_run_goes_on_and_attach_shows_it_and_busy_port_is_replaced(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc, log = start_cli(tmp_path, "run", str(preset(tmp_path, epochs=1, max_steps=40, port=port)))
        run = the_run(tmp_path)
        wait_for(lambda: run.supervisor_pid() and "run directory:" in log.read_text(), 30, "the launch")
        proc.send_signal(signal.SIGHUP)  # the SSH connection drops
        assert proc.wait(timeout=10) == -signal.SIGHUP
        assert run.status() in ("running", "starting")

        r = subprocess.run(cli_cmd() + ["attach", "latest"], cwd=tmp_path, env=env_for(tmp_path),
                           capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"attached to {run.path}" in r.stdout
    assert f"port {port} in use; using" in r.stdout, "the run says which port it picked instead"
    assert port_of(run) != port
    assert "run finished" in r.stdout
    assert run.final_status()["status"] == "finished"
    steps = [e["step"] for e in read_all(run.events_path) if e["kind"] == "step"]
    assert max(steps) == 40
    assert_nothing_left(run, rank_pids(run).values(), within=15)


def test_sigkill_of_a_rank_fails_the_run_and_leaves_nothing(tmp_path):
    proc, log = start_cli(tmp_path, "run", str(preset(tmp_path)))
    run = the_run(tmp_path)
    wait_for(lambda: steps_seen(run) and len(rank_pids(run)) == 2, 120, "training steps")
    pids = rank_pids(run)
    t0 = time.monotonic()
    os.kill(pids[1], signal.SIGKILL)  # as the OOM killer does
    code = proc.wait(timeout=60)
    out = log.read_text()
    assert code == 1, out
    assert "rank 1 killed by signal 9" in out
    assert run.final_status()["status"] == "failed"
    assert "rank 1 killed by signal 9" in run.final_status()["root_cause"]
    assert_nothing_left(run, list(pids.values()) + [run.supervisor_pid()],
                        within=max(1.0, LEFT_WITHIN_S - (time.monotonic() - t0)))


SLEEPY = """\
import os, time
from pathlib import Path
from torchdeck.engine.models import mlp


def net(info, folder):
    \"\"\"The mlp, whose training forward falls asleep for 10 minutes once folder/slow exists: a
    step far longer than the supervisor's stop grace period, so a graceful stop cannot finish.\"\"\"
    model = mlp(info, 32)
    folder = Path(folder)

    def hook(mod, args):
        if mod.training and (folder / "slow").exists():
            (folder / f"asleep-{os.environ['RANK']}").touch()
            time.sleep(600)
    model.register_forward_pre_hook(hook)
    return model
"""


def test_second_ctrl_c_kills(tmp_path):
    """The first Ctrl-C asks for a graceful stop that cannot finish (a rank is inside a 10-minute step,
    the other inside it too or waiting for it in the step's all-reduce); the second kills every process
    of the run at once: no waiting out the stop grace period."""
    from torchdeck.engine.supervisor import STOP_GRACE_S

    (tmp_path / "sleepy.py").write_text(SLEEPY)
    p = preset(tmp_path)
    p.write_text(p.read_text().replace("model: {name: mlp, hidden: 32}",
                                       f"model: {{name: 'sleepy:net', kwargs: {{folder: '{tmp_path}'}}}}"))
    proc, log = start_cli(tmp_path, "run", str(p))
    run = the_run(tmp_path)
    try:
        wait_for(lambda: steps_seen(run), 120, "training steps")
        pids = list(rank_pids(run).values()) + [run.supervisor_pid()]
        (tmp_path / "slow").touch()
        # Not both: a rank that began its step before `slow` appeared waits in that step's all-reduce
        # for the one asleep, and never reaches the hook (CI once waited 30 s for both).
        wait_for(lambda: (tmp_path / "asleep-0").exists() or (tmp_path / "asleep-1").exists(), 30,
                 "a rank inside its long step")
        time.sleep(1.0)  # the other rank's step reaches the collective (or the hook) it will wait in
        proc.send_signal(signal.SIGINT)
        wait_for(lambda: "Ctrl-C again to kill" in log.read_text(), 10, "the stop message")
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=STOP_GRACE_S + 30)
        took = time.monotonic() - t0
        out = log.read_text()
        final = run.final_status()
        assert (code, final["status"], final.get("killed")) == (130, "stopped", True), (final, out)  # not failed
        assert "killed by the user" in final["root_cause"], final
        killed = [ln for ln in out.splitlines() if ln.startswith("killed ") and "process(es) of the run" in ln]
        assert killed and int(killed[0].split()[1]) >= 3, out  # the supervisor and both ranks
        assert took < 10, f"{took:.1f} s from the second Ctrl-C to exit (the grace period is {STOP_GRACE_S:.0f} s)"
        assert_nothing_left(run, pids, within=5)
    finally:
        if proc.poll() is None:
            proc.kill()
        if control.run_processes(run):  # a failed assertion must not leave a sleeping run behind
            control.kill(run)
