"""The step number of a script's events (engine/launch/report.py): the script's own once it passes
`step=` (as wandb.log(step=) and SummaryWriter's global_step take it), the optimizer steps counted
before that and on a rank that never passes one; the hook's count is never mixed into a rank's
own numbering. The shim runs as a real process around a real script (tests/engine/test_launch_shim.py's
launcher), then a 2-rank script under the real supervisor as nanoGPT logs: rank 0 only, 0-based.
"""
from __future__ import annotations

from tests.engine.test_launch_run import ddp_script, ended, kinds, script_cfg
from tests.engine.test_launch_run import launch as launch_run
from tests.engine.test_launch_shim import launch, script

LOOP = """
    import time
    import numpy as np
    import torch
    import torchdeck
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for it in range(40):  # 0-based, as nanoGPT's iter_num
        loss = model(torch.randn(8, 4)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if it % 5 == 0:
            torchdeck.log({"loss": float(it)}, step={step})
        time.sleep(0.01)
    torchdeck.log({"loss": -1.0})  # no step=: still the script's numbering, its last step
"""


def series(events) -> list[int]:
    return [e["step"] for e in events]


def test_an_explicit_step_is_the_ranks_step_from_then_on(tmp_path):
    """step=it*10 (0, 50, ... 350: neither the call count nor the optimizer count), given as a numpy
    or a 0-d tensor integer as iter_num often is (taken, not skipped). The hook's events between
    the calls (every 0.05 s here, with steps/s) carry the script's last step, not its own count;
    the exit's flush and a later log() without step= too. Before the first step= the optimizer
    count (the first optimizer step: 1)."""
    path = script(tmp_path, LOOP.replace("{step}", "np.int64(it * 10) if it % 2 else torch.tensor(it * 10)"))
    run = launch([str(path)], cwd=tmp_path, env={"TORCHDECK_LOG_EVERY_S": "0"})
    assert run.rc == 0, run.stderr
    steps = run.kinds("step")
    first = next(i for i, e in enumerate(steps) if e.get("loss") == 0.0)
    assert series(steps[:first]) == [1], "before the first step=: the optimizer steps counted"
    logged = [e for e in steps if e.get("loss") is not None]
    assert series(logged) == [it * 10 for it in range(0, 40, 5)] + [350]
    assert logged[-1]["loss"] == -1.0 and not any(e.get("skipped") for e in logged)
    after = steps[first:]
    hooks = [e for e in after if e.get("loss") is None]
    assert hooks and all(e["steps_per_s"] is not None for e in hooks[:-1])  # the hook's pace still comes
    assert series(after) == sorted(series(after)), f"a rank's steps go back: {series(after)}"
    assert set(series(after)) <= {it * 10 for it in range(0, 40, 5)}, (
        f"rule 'an explicit step= is the rank's step; the hook's count is not mixed in': {series(after)}")


def test_nanogpt_style_rank_0_logging_0_based_steps_under_launch(tmp_path):
    """2 ranks under the real supervisor, 16 optimizer steps each; rank 0 calls
    torchdeck.log(step=step - 1) (0-based, as nanoGPT's iter_num) every 5 steps and at the last,
    rank 1 never: rank 0's series never goes back once it said a step and ends at 15 (its own
    last number, not the hook's 16); rank 1's is the optimizer count, ending at 16."""
    after = ("if rank == 0 and (step % 5 == 1 or step == 16): "
             "torchdeck.log({'loss': loss.item()}, step=step - 1, samples=len(x))")
    path = ddp_script(tmp_path, after=after)
    path.write_text("import torchdeck\n" + path.read_text())
    every = {"TORCHDECK_STEP_EVERY_S": "0.01", "TORCHDECK_LOG_EVERY_S": "0"}  # hook events between the calls
    run = launch_run(tmp_path, script_cfg(tmp_path, path, env=every))
    final = ended(run)
    assert final["status"] == "finished", (final, run.supervisor_log.read_text())
    steps = kinds(run, "step")
    r0, r1 = [e for e in steps if e["rank"] == 0], [e for e in steps if e["rank"] == 1]
    first = next(i for i, e in enumerate(r0) if e.get("loss") is not None)
    assert series(r0[:first]) in ([], [1])  # the hook's first, at rank 0's first optimizer step
    assert series(r0[first:]) == sorted(series(r0[first:])) and r0[-1]["step"] == 15, series(r0)
    assert [e["step"] for e in r0 if e.get("loss") is not None] == [0, 5, 10, 15]
    assert set(series(r0[first:])) <= {0, 5, 10, 15}, (
        f"rule 'an explicit step= is the rank's step; the hook's count is not mixed in': {series(r0)}")
    assert r1[-1]["step"] == 16 and series(r1) == sorted(series(r1))


HELD = """
    import os, time
    import torchdeck
    def burst(last):  # inside one 50 ms window: only the first call goes out at once
        for i in range(1, last + 1):
            torchdeck.log({"loss": 1.0 / i}, step=i, samples=8)
    burst(30)
    pid = os.fork()
    if pid == 0:  # a forked child reports on its own (its own flusher: threads do not survive a fork)
        os.environ["RANK"] = "5"
        burst(20)
        time.sleep(0.5)
        os._exit(0)
    os.waitpid(pid, 0)
    burst(40)
    time.sleep(0.5)  # then the rank hangs: the held numbers must not wait for a next call
    os._exit(0)  # ended without the shim's exit flush, as a SIGKILL or a script's own os._exit
"""


def test_held_log_numbers_go_out_within_the_window_without_a_next_call_or_an_exit(tmp_path):
    """Coalesced numbers were held until the next call or the exit: a rank that logged step=30 then
    hung and was stopped showed step 1 (issue 35 bug 12). The flusher thread sends them at the
    window's end; in a forked child too."""
    run = launch([str(script(tmp_path, HELD))], cwd=tmp_path, env={"TORCHDECK_LOG_EVERY_S": "0.05"})
    assert run.rc == 0, run.stderr
    steps = run.kinds("step")
    mine, child = [e for e in steps if e["rank"] == 1], [e for e in steps if e["rank"] == 5]
    assert child and child[-1]["step"] == 20 and child[-1]["loss"] == 1.0 / 20, series(child)
    assert mine[-1]["step"] == 40 and mine[-1]["loss"] == 1.0 / 40, series(mine)
    assert 30 in series(mine), series(mine)  # the first burst's last, before the second's first went out
    assert all(e["samples_per_s"] is None or e["samples_per_s"] > 0 for e in mine)
