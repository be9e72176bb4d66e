"""Issue 37 item 3: a view that follows a live run for days keeps a flat memory. Each structure it
grows as events come is bounded (curves: Thinned, STEP_HISTORY; logs: LOG_LINES; errors:
ERRORS_KEPT; traceback lines: TRACEBACK_LINES; a node's GPU history: fleet.HISTORY; a rank's step
windows: 64), so a run that keeps logging and failing for four times as long takes no more."""
from __future__ import annotations

import json

from bench import fake_run
from torchdeck.engine.runs import fleet
from torchdeck.engine.runs.view import LOG_LINES, STEP_HISTORY, RunView, checkpoint
from torchdeck.engine.runs.view.logs import ERRORS_KEPT, TRACEBACK_LINES
from tests.run_events import T0, ev

NODES, PER_NODE = 2, 4
WORLD = NODES * PER_NODE
TB_LINES = 6  # lines of each error's traceback, every one of them new


def _round(view: RunView, k: int) -> None:
    """One second of a run that keeps going wrong: a step event of every rank, a node sample of
    each node, a log line, and an error with a traceback never seen before."""
    t = T0 + 10 + k
    for r in range(WORLD):
        view.feed(fake_run.step_event(r, k, WORLD, PER_NODE, NODES, t=t, step=(k + 1) * 10))
    for n in range(NODES):
        view.feed(fake_run.node_sample(n, k, NODES, gpus=2, t=t + 0.5))
    view.feed(ev("log", 10 + k + 0.6, rank=k % WORLD, level="warning", message=f"loss spike at step {k}"))
    tb = "Traceback (most recent call last):\n" + "\n".join(f'  File "m.py", line {k * TB_LINES + i}' for i in range(TB_LINES - 1))
    view.feed(ev("error", 10 + k + 0.7, rank=k % 2, host="box", pid=7, exception="RuntimeError",
                 message=f"bad batch {k}", traceback=tb))


def _sizes(view: RunView) -> dict:
    return {"errors": len(view.errors), "logs": len(view.logs), "steps": len(view.steps.points),
            "step_acc": len(view.step_acc.points), "traceback lines": sum(map(len, view._traceback_lines.values())),
            "windows": max(len(st._windows) for st in view.ranks.values()),
            "gpu history": max(len(h) for node in view.fleet.nodes.values() for _, h in node.history),
            "bytes": len(json.dumps(checkpoint.encode(view)))}


def test_a_live_view_stays_flat_however_long_the_run_goes_on():
    view = RunView()
    view.feed(fake_run.started("r", WORLD, PER_NODE, NODES, 4000, "box", T0)[0])
    n = 2 * ERRORS_KEPT + TRACEBACK_LINES // TB_LINES  # past every bound
    for k in range(n):
        _round(view, k)
    first = view.errors[0].text
    early = _sizes(view)
    for k in range(n, 4 * n):
        _round(view, k)
    late = _sizes(view)
    bounds = {"errors": ERRORS_KEPT, "logs": LOG_LINES, "steps": STEP_HISTORY, "step_acc": STEP_HISTORY,
              "traceback lines": 2 * (TRACEBACK_LINES + TB_LINES), "windows": 64, "gpu history": fleet.HISTORY}
    for what, most in bounds.items():
        assert late[what] <= most, (what, late[what], most)
    assert late["bytes"] < 1.5 * early["bytes"], (early, late)  # four times the run, the same state
    assert view.errors[0].text == first and view.errors[-1].text.endswith(f"bad batch {4 * n - 1}")
    view.add_output(1, f'  File "m.py", line {(4 * n - 1) * TB_LINES + 2}')  # the newest traceback: shown once
    assert view.logs[-1].level != "output"
