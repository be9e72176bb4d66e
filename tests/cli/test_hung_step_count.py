"""Without torchdeck.log a rank's steps are the optimizer hook's count, sent at most once a window
(TORCHDECK_STEP_EVERY_S, 1 s): a rank that stepped, then hung, kept its last window unsent, so a
hang run showed `step 1` after 29 quick steps and 9 after 10 steps of 0.3 s (issue 35, QA of the
fix). The one background sender (engine/launch/report.py's flusher) now sends the hook's count at
the window's end too."""
import re

from tests.cli.test_held_log_numbers import _wait_for, last_steps, torchdeck
from torchdeck.engine.rundir.layout import RunDir

# rank 0: 29 quick steps inside the first window; rank 1: 10 steps of 0.3 s; then both hang
HANG = """\
import os, time
import torch
rank = int(os.environ["RANK"])
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for i in range(29 if rank == 0 else 10):
    model(torch.randn(8, 4)).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()
    if rank == 1:
        time.sleep(0.3)
print("hanging", flush=True)
time.sleep(120)
"""


def test_a_rank_that_steps_then_hangs_and_is_stopped_shows_every_optimizer_step(tmp_path):
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
        # sent while the ranks hang, at the end of the hook's 1 s window (a few seconds on a busy host)
        _wait_for(lambda: last_steps(run) == {0: 29, 1: 10}, "the last window's steps sent while the ranks hang",
                  deadline_s=15, seen=lambda: last_steps(run))
    finally:  # stopped whatever happens: a rank left sleeping would outlive the test
        stop = torchdeck("stop", run.name, "--wait", "60", cwd=tmp_path)
    assert stop.returncode == 0 and "run stopped" in stop.stdout, stop.stdout + stop.stderr
    out = torchdeck("attach", run.name, cwd=tmp_path).stdout
    steps = {int(m.group(1)): int(m.group(2)) for m in re.finditer(r"^rank\s+(\d+)\s+step\s+(\d+)", out, re.M)}
    assert steps == {0: 29, 1: 10}, f"rank 0 did 29 optimizer steps and rank 1 10 before they hung:\n{out}"
    assert "steps done: rank 0 29 (signal SIGTERM), rank 1 10 (signal SIGTERM)" in out, out
