"""A framework run's normal shutdown after its last step tripped the watchdog's "slow" rule: every
Accelerate and Lightning run ended with `stacks (ranks 0,1 slow: 2.2 s in a step window, 43x the
median window (0.05 s)): ... no dump` (issue 35, QA). What follows a script's body (atexit
handlers, a framework's teardown) is its exit, not a step (engine/launch/shim.py says so, the view
calls nothing slow after it, nor once a rank ended, nor after a rank's last step).

Nor silent: at load 17 the same run's exit took over STALE_MIN_S and the watchdog dumped stacks
for "ranks 0,1 silent for 10 s" (a rank that said `exiting` ignores stack requests: the dump
shows nothing). The stale rule exempts a rank that said it is exiting, as one that exited."""
import json

from torchdeck.engine.runs.view import STALE_MIN_S, RunView
from tests.cli.test_held_log_numbers import torchdeck
from tests.run_events import ev

# every step logged quickly (coalesced into 50 ms windows: a tiny median), then ~3 s to exit, as a
# framework's teardown takes after the script's last line
QUICK_THEN_SLOW_EXIT = """\
import atexit, time
import torch
import torchdeck
atexit.register(time.sleep, 3.0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for i in range(1, 61):
    loss = model(torch.randn(8, 4)).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    torchdeck.log({"loss": loss.item()}, samples=8)
    time.sleep(0.01)
print("training done", flush=True)
"""


def test_a_script_that_takes_seconds_to_exit_after_its_last_step_gets_no_stacks_warning(tmp_path):
    (tmp_path / "train.py").write_text(QUICK_THEN_SLOW_EXIT)
    r = torchdeck("launch", "--nproc-per-node", "2", "train.py", cwd=tmp_path)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "stacks" not in out, f"rule 'a script's exit is not a slow step':\n{out}"
    (run,) = (tmp_path / "runs").iterdir()
    kinds = [json.loads(line).get("kind") for line in (run / "events.jsonl").read_text().splitlines() if line]
    assert "stacks" not in kinds, kinds


def _recorded_exit(exiting: bool) -> list[dict]:
    """The events of the run above, as recorded at load 7 (times from run_started; the steps
    between 4 and 58 left out): both ranks said `exiting` at 12.2 s and exited at 20.5 s."""
    out = [ev("run_started", 0.0, run="r1", strategy="script", world_size=2, nproc_per_node=2, node_rank=0,
              num_nodes=1, global_batch=None, devices=["cpu", "cpu"], master_addr="127.0.0.1", master_port=34981,
              pid=31334, host="vm", threads_per_rank=1, run_kind="script", command=["python", "train.py"],
              total_steps=None)]
    out += [ev("rank_ready", 0.36 + 0.04 * r, rank=r, local_rank=r, device=None, pid=31337 + r, host="vm",
               threads=1, cpus=None) for r in (0, 1)]
    for r, t0 in ((1, 11.43), (0, 11.57)):
        out.append(ev("step", t0, rank=r, step=1, steps_per_s=None, epoch=None, loss=None))
        out += [ev("step", t0 + 0.01 * i, rank=r, step=i, epoch=None, loss=0.5, metrics={}, steps_per_s=None,
                   samples_per_s=480.0, tokens_per_s=None) for i in (1, 4)]
    for r, t in ((1, 12.14), (0, 12.25)):
        out.append(ev("step", t, rank=r, step=60, epoch=None, loss=0.03, metrics={}, steps_per_s=85.0,
                      samples_per_s=680.0, tokens_per_s=None))
        if exiting:
            out.append(ev("phase", t + 0.01, rank=r, phase="exiting"))
    return out


def test_a_rank_that_said_it_is_exiting_is_not_silent_however_long_its_exit_takes():
    """The stale rule, fed the recorded run with a fixed clock: no load needed. Without the
    `exiting` phase the same silence is stale (the rule still catches a rank that went quiet)."""
    view = RunView()
    view.feed_all(_recorded_exit(exiting=True))
    assert view.status == "running"
    for late in (STALE_MIN_S + 1, 60.0, 600.0):
        now = view.last_t + late
        assert view.stale_ranks(now) == [], f"rule 'an exiting rank is not silent' ({late:g} s after exiting)"
    quiet = RunView()
    quiet.feed_all(_recorded_exit(exiting=False))
    assert [r.rank for r in quiet.stale_ranks(quiet.last_t + STALE_MIN_S + 1)] == [0, 1]
    view.feed(ev("rank_exited", 20.5, rank=0, exitcode=0, signal=None))
    assert view.stale_ranks(view.last_t + 60.0) == []  # one exited, the other exiting: neither is silent
