"""Rules of the run view (engine.runs.view) about a run's end: hand-made events in, verdicts out."""
from __future__ import annotations

import pytest

from torchdeck.engine.runs.view import RunView
from tests.run_events import T0, ev, started, step


def _stepped(total=100, last=10):
    st = RunView()
    st.feed(started(total=total))
    st.feed_all([step(r, i, 0.05 * i, total=total) for i in range(1, last + 1) for r in (0, 1)])  # 0.05 s windows
    return st


def test_the_watchdog_calls_no_rank_slow_once_the_run_is_ending():
    """Every framework run ended with a false `ranks 0,1 slow: 2.2 s in a step window, 43x the
    median window (0.05 s)`: its shutdown after the last step was timed as a step window."""
    st = _stepped()
    assert [r.rank for r, *_ in st.slow_ranks(T0 + 0.5 + 2.5)] == [0, 1]  # the rule still fires mid-run
    exiting = _stepped()
    exiting.feed(ev("phase", 0.5, rank=0, phase="exiting"))  # the shim: rank 0's script body returned
    assert [r.rank for r, *_ in exiting.slow_ranks(T0 + 0.5 + 2.5)] == [1], "rule 'an exiting rank is not slow'"
    ended = _stepped()
    ended.feed(ev("rank_exited", 0.6, rank=0, exitcode=0))
    assert ended.slow_ranks(T0 + 0.5 + 2.5) == [], "rule 'once a rank ended, the others are ending'"
    done = _stepped(total=10)
    assert done.slow_ranks(T0 + 0.5 + 2.5) == [], "rule 'after its last step a rank is not slow'"


def _hook(rank, s, t, **kw):
    """A script's step-hook event (torch.optim's counted steps, no loss)."""
    return ev("step", t, rank=rank, step=s, epoch=None, loss=None, steps_per_s=kw.pop("sps", None), **kw)


def test_a_ranks_mean_steps_per_s_is_over_its_stepping_time_not_until_its_exit():
    """Rank 1 raised after its 30th step; rank 0, which did the same 30 steps with it, sat 3.5 s in
    the failing collective before its last event: it showed 8.2 steps/s, rank 1 341.9."""
    st = RunView()
    st.feed(ev("run_started", 0.0, run="r1", strategy="script", world_size=2, nproc_per_node=2, node_rank=0,
               num_nodes=1, devices=["cpu"] * 2, master_addr="127.0.0.1", master_port=29500, pid=4000, host="box"))
    for r in (0, 1):
        st.feed(_hook(r, 1, 0.0))
    st.feed(_hook(1, 30, 0.1, sps=290.0))  # rank 1's exit flush, right after its last step
    st.feed(_hook(0, 30, 3.6, sps=290.0, step_t=T0 + 0.1))  # rank 0's, after 3.5 s in the collective
    st.feed(_hook(1, 30, 3.7, sps=290.0))  # a step said again (no step_t) does not move its time on
    st.feed(ev("run_finished", 3.8, status="failed", exit_codes=[1, 1], root_cause="rank 1 raised", elapsed_s=3.8))
    r0, r1 = st.rank_list()
    assert r0.steps_per_s == pytest.approx(290.0) and r1.steps_per_s == pytest.approx(290.0), (
        f"rule 'a rank's mean pace is over its stepping time, first to last step': {r0.steps_per_s} {r1.steps_per_s}")
