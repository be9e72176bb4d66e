"""A framework run's normal shutdown after its last step tripped the watchdog's "slow" rule: every
Accelerate and Lightning run ended with `stacks (ranks 0,1 slow: 2.2 s in a step window, 43x the
median window (0.05 s)): ... no dump` (issue 35, QA). What follows a script's body (atexit
handlers, a framework's teardown) is its exit, not a step (engine/launch/shim.py says so, the view
calls nothing slow after it, nor once a rank ended, nor after a rank's last step)."""
import json

from tests.cli.test_held_log_numbers import torchdeck

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
