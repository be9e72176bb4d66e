"""The optimizer hook's count goes out at the end of its window without a next step or the exit
(engine/launch/report.py: the flusher thread, the one background sender): a rank that stepped,
then hung, showed the step of its window's start. The shim runs as a real process around a real
script (tests/engine/test_launch_shim.py's launcher)."""
from __future__ import annotations

from tests.engine.test_launch_shim import launch, script

QUICK_THEN_HANG = """
    import os, time
    import torch
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(29):  # inside the first 0.5 s window: only step 1 goes out at once
        model(torch.randn(8, 4)).pow(2).mean().backward()
        opt.step()
    time.sleep(1.5)  # then the rank hangs: the count must not wait for a next step
    os._exit(0)  # ended without the shim's exit flush, as a SIGKILL would
"""


def test_the_hooks_count_goes_out_at_the_windows_end_without_a_next_step_or_an_exit(tmp_path):
    run = launch([str(script(tmp_path, QUICK_THEN_HANG))], cwd=tmp_path, env={"TORCHDECK_STEP_EVERY_S": "0.5"})
    assert run.rc == 0, run.stderr
    steps = [e["step"] for e in run.kinds("step")]
    assert steps[0] == 1 and steps[-1] == 29, f"rule 'the last window's steps are sent at its end': {steps}"
    last = run.kinds("step")[-1]
    assert last["steps_per_s"] is not None and last["steps_per_s"] > 28 / 0.5, (
        f"the rate is over the steps, not the hang after them: {last}")


STEP_AFTER_THE_SENDERS_EVENT = """
    import os, time
    import torch
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    def step():
        model(torch.randn(8, 4)).pow(2).mean().backward()
        opt.step()
    for _ in range(5):  # step 1 goes out at once, 2-5 from the flusher at the 0.5 s window's end
        step()
    time.sleep(0.7)
    step()  # closes the hook's window 0.2 s after the flusher's event: the hook does not send it
    time.sleep(1.5)  # then the rank hangs
    os._exit(0)
"""


def test_a_step_that_closes_the_hooks_window_unsent_still_goes_out():
    """The step closing the hook's window, within a window of the flusher's last event, is not sent
    by the hook: it must wake the flusher (it did not: the rank's last step was lost)."""
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        path = script(Path(d), STEP_AFTER_THE_SENDERS_EVENT)
        run = launch([str(path)], cwd=Path(d), env={"TORCHDECK_STEP_EVERY_S": "0.5"})
    assert run.rc == 0, run.stderr
    steps = [e["step"] for e in run.kinds("step")]
    assert steps[-1] == 6, f"rule 'every step counted goes out within a window': {steps}"
