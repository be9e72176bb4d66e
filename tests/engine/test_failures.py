"""Issue 5 gaps: a hung collective, a kill during a checkpoint save, resume after a SIGKILL of the
whole run, a disk that fills up mid-run, and bad arguments that must start nothing.

Every run here is real (a supervisor in its own session, 2 gloo ranks on CPU) and every kill is a
real signal to a real process. Each test asserts its bound, its message, that no process of the
run is left (by the supervisor's session) and, for distributed runs, that the master port is free.
"""
from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path

import psutil
import pytest

from engine import events
from engine import launch
from engine.rundir import RunDir
from tests.engine.test_supervisor import Run, ddp_cfg

FAIL_MODELS = '''
import os, time
from engine.models import mlp


def hang(info, at=3, rank="1"):
    """Blocks forever in the forward of its `at`-th training step on one rank: the other rank's
    next collective waits for it, as with a deadlocked data loader or a stuck GPU."""
    net = mlp(info, 32)
    calls = [0]

    def hook(mod, args):
        if mod.training:
            calls[0] += 1
            if calls[0] == at and os.environ.get("RANK") == rank:
                while True:
                    time.sleep(3600)
    net.register_forward_pre_hook(hook)
    return net
'''


def write_models(tmp_path: Path) -> None:
    (tmp_path / "failmodels.py").write_text(FAIL_MODELS)


def session_left(run_dir: Path) -> list[psutil.Process]:
    """Processes still in the run's session (the supervisor's pid is the session id)."""
    return launch.run_processes(RunDir(run_dir))


def assert_clean(r: Run, within: float = 5.0) -> None:
    """No process of the run is left, by session and by every pid seen, and its port is free."""
    deadline = time.monotonic() + within
    while session_left(r.dir) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not session_left(r.dir), f"left in the run's session: {session_left(r.dir)}"
    r.assert_nothing_left(within=1.0)
    started = [e for e in r.events() if e["kind"] == "run_started"]
    if started:
        assert port_free(started[0]["master_port"]), "the master port is still taken"


def port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
            return True
        except OSError:
            return False


@pytest.fixture
def runs():
    started: list[Run] = []
    yield started
    for r in started:
        r.kill()


# ----------------------------------------------------------------------------- a hung collective


@pytest.mark.slow
def test_hung_collective_ends_at_the_configured_timeout_naming_it(tmp_path, runs):
    write_models(tmp_path)
    r = Run(tmp_path, ddp_cfg(**{"model.name": "failmodels:hang", "train.max_steps": 40,
                                 "nodes.timeout_s": 5}))
    runs.append(r)
    r.wait_for(lambda e: e["kind"] == "step" and e["rank"] == 1 and e["step"] >= 2)
    rc = r.wait(timeout=90)
    ended = time.time()
    assert rc == 1, r.output()
    evs = r.events()
    hung_at = max(e["t"] for e in evs if e["kind"] == "step" and e["rank"] == 1)  # rank 1's last report
    err = next(e for e in evs if e["kind"] == "error")
    assert err["rank"] == 0 and err["host"] == socket.gethostname() and "Traceback" in err["traceback"]
    assert 4.5 <= err["t"] - hung_at <= 5 + 5, "rank 0 gave up at the configured 5 s, not before, not much after"
    assert ended - hung_at < 5 + 15, "the run ended within 15 s of the timeout"
    st = r.status()
    assert st["status"] == "failed" and st["exit_codes"][0] == 1
    cause = st["root_cause"]
    assert cause.startswith("rank 0 (") and "a collective timed out after nodes.timeout_s=5 s" in cause, cause
    assert "rank 1 sent no error and had to be stopped: the likely hang (see rank1.log)" in cause, cause
    assert [e for e in evs if e["kind"] == "run_finished"][0]["root_cause"] == cause
    assert_clean(r)
