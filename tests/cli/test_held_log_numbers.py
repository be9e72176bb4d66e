"""torchdeck.log coalesces calls closer than TORCHDECK_LOG_EVERY_S (50 ms) and holds the newest
numbers; a rank that then hangs and is stopped never sent them: a hang run's rank showed step 28
where it did 30 (issue 35 bug 12). Held numbers now go out within the window whatever the script
does next (engine/launch/report.py: a daemon thread, the next hook call, the exit)."""
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from torchdeck.engine import events
from torchdeck.engine.rundir.layout import RunDir

TORCHDECK = Path(sys.executable).with_name("torchdeck")

# rank 1 logs steps 1..30 well inside one window (only step 1 goes out at once), then hangs as a
# rank stuck in a collective would; rank 0 logs to 28 the same way
HANG = """\
import os, time
import torchdeck
rank = int(os.environ["RANK"])
last = 30 if rank == 1 else 28
for i in range(1, last + 1):
    torchdeck.log({"loss": 1.0 / i}, step=i, samples=8)
print("hanging", flush=True)
time.sleep(120)
"""


def torchdeck(*args, cwd, timeout=120):
    cmd = [str(TORCHDECK)] if TORCHDECK.exists() else [sys.executable, "-m", "torchdeck.cli"]
    env = dict(os.environ, TORCHDECK_RUNS=str(Path(cwd) / "runs"), COLUMNS="120")
    return subprocess.run(cmd + list(args), cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def _wait_for(cond, what, deadline_s=60.0, seen=lambda: ""):
    end = time.monotonic() + deadline_s
    while not cond():
        assert time.monotonic() < end, f"no {what} within {deadline_s:g} s; last seen: {seen()!r}"
        time.sleep(0.05)


def last_steps(run) -> dict:
    """Each rank's newest step in events.jsonl."""
    out = {}
    for ev in events.read_all(run.events_path):
        if ev.get("kind") == "step":
            out[ev["rank"]] = ev["step"]
    return out


def test_a_rank_that_logs_then_hangs_and_is_stopped_shows_its_last_logged_step(tmp_path):
    (tmp_path / "train.py").write_text(HANG)
    r = torchdeck("launch", "--detach", "--nproc-per-node", "2", "train.py", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    (path,) = (tmp_path / "runs").iterdir()
    run = RunDir(path)
    try:
        for rank in (0, 1):
            log = run.rank_log(rank)
            _wait_for(lambda: log.exists() and "hanging" in log.read_text(), f"rank {rank} hanging",
                      seen=lambda: log.read_text() if log.exists() else "(no log yet)")
        # sent while the ranks hang (within the 50 ms window, a few seconds allowed on a busy host),
        # so the stop below races nothing
        _wait_for(lambda: last_steps(run) == {0: 28, 1: 30}, "held numbers sent while the ranks hang",
                  deadline_s=10, seen=lambda: last_steps(run))
    finally:  # stopped whatever happens: a rank left sleeping would outlive the test
        stop = torchdeck("stop", run.name, "--wait", "60", cwd=tmp_path)
    assert stop.returncode == 0 and "run stopped" in stop.stdout, stop.stdout + stop.stderr
    r = torchdeck("attach", run.name, cwd=tmp_path)
    out = r.stdout
    steps = {int(m.group(1)): int(m.group(2)) for m in re.finditer(r"^rank\s+(\d+)\s+step\s+(\d+)", out, re.M)}
    assert steps == {0: 28, 1: 30}, f"rank 0 logged step=28 and rank 1 step=30 before they hung:\n{out}"
    assert "steps done: rank 0 28 (signal SIGTERM), rank 1 30 (signal SIGTERM)" in out, out
