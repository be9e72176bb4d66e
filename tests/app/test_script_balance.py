"""A script run's rank balance line in the Monitor (app/monitor/panes.py script_spread_text, the rule
in engine/runs/view.py script_balance): `rank balance: 0 of 2 ranks timing their optimizer steps`
showed on stopped and never-stepping runs, and a 6-step run's ranks, stepping together, read
"13% behind" (issue 35, QA)."""
from __future__ import annotations

from torchdeck.app.monitor.panes import script_spread_text
from torchdeck.engine.runs.view import BALANCE_MIN_STEPS, RunView
from tests.run_events import ev


def _script_run(steps: int, rates=(10.0, 8.7), status="stopped") -> RunView:
    st = RunView()
    st.feed(ev("run_started", 0.0, run="r1", strategy="script", world_size=2, nproc_per_node=2, node_rank=0,
               num_nodes=1, devices=["cpu"] * 2, master_addr="127.0.0.1", master_port=29500, pid=4000, host="box"))
    for r in (0, 1):
        st.feed(ev("rank_ready", 0.5, rank=r, local_rank=r, device="cpu", pid=4001 + r, host="box", threads=1))
        if steps:
            st.feed(ev("step", 1.0, rank=r, step=1, epoch=None, loss=None, steps_per_s=None))
            st.feed(ev("step", 1.0 + (steps - 1) / rates[r], rank=r, step=steps, epoch=None, loss=None,
                       steps_per_s=rates[r]))
    for r in (0, 1):
        st.feed(ev("rank_exited", 9.0, rank=r, exitcode=-15, signal="SIGTERM"))
    st.feed(ev("run_finished", 9.1, status=status, exit_codes=[-15, -15], root_cause=None, elapsed_s=9.1))
    return st


def test_no_balance_is_said_where_no_rank_timed_a_step():
    text = script_spread_text(_script_run(0)).plain
    assert text == "", f"rule 'nothing about balance where nothing was timed': {text!r}"


def test_a_rank_is_called_behind_only_after_enough_timed_steps():
    short = script_spread_text(_script_run(6)).plain
    assert "behind" not in short and "too few steps" in short, f"rule 'a minimum of timed steps': {short!r}"
    long = script_spread_text(_script_run(BALANCE_MIN_STEPS + 1)).plain
    assert long.endswith("13% behind"), long
