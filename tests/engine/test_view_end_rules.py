"""Rules of the run view (engine.runs.view) about a run's end: hand-made events in, verdicts out."""
from __future__ import annotations

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
