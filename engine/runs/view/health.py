"""The watchdog's rules read from the view: stale and slow ranks, a lost run's ranks, the ETA."""
from __future__ import annotations

from ...rundir.status import Status
from .records import (KILLED, SLOW_MIN_S, SLOW_MULTIPLE, SLOW_WINDOWS, STALE_INTERVALS,
                      STALE_MIN_S, RankState)


class Health:
    """RunView's rules about its ranks' health (a mixin over the view's fields)."""

    def ended_badly(self, st: RankState) -> bool:
        """A rank that ended on its own with an error or a signal; not one the user's stop ended
        (SIGTERM, then SIGKILL, is how a stop ends a script's ranks): its figures still count."""
        if not st.failed_exit:
            return False
        return not (self.status == Status.STOPPED and st.exited in ("signal SIGTERM", "signal SIGKILL", KILLED))

    def stale_after(self, st: RankState) -> float:
        return max(STALE_MIN_S, STALE_INTERVALS * (st.interval or 0.0))

    def is_stale(self, st: RankState, now: float) -> bool:
        """No news of a rank for longer than it normally takes, while the run should be busy. A
        rank that said its script body ended (the shim's `exiting` phase) is not silent: what
        follows is its exit (atexit, a framework's teardown; 8 s at load 7, over STALE_MIN_S
        under more), and it ignores stack requests by then (engine/launch/shim.py), so the
        watchdog's dump would show nothing; its end is the supervisor's to see."""
        if self.status != Status.RUNNING or st.exited is not None or st._exiting or st.last_seen is None:
            return False
        seen = st.last_seen
        if st._step_t is None and self.first_step_t is not None:  # not stepping yet: its start-up
            seen = max(seen, self.first_step_t)  # (a script's torch import, rendezvous) is not silence
        return now - seen > self.stale_after(st)

    def stale_ranks(self, now: float) -> list[RankState]:
        return [r for r in self.rank_list() if self.is_stale(r, now)]

    def median_window(self, st: RankState) -> float | None:
        """Median seconds of the rank's step windows (log_every_n_steps steps), once measured."""
        w = sorted(st._windows)
        return w[len(w) // 2] if len(w) >= SLOW_WINDOWS else None

    def slow_ranks(self, now: float) -> list[tuple[RankState, float, float]]:
        """(rank, seconds in this window, median window) of the ranks whose step window in progress
        has taken over SLOW_MULTIPLE times their median (and SLOW_MIN_S): a hang or a straggling
        step seen long before the rank turns stale, never while it evaluates or saves, nor once the
        run is ending (a rank's last step done, its script body returned, a rank ended): a
        framework's shutdown after its last step was called slow at every run's end."""
        out = []
        ranks = self.rank_list()
        if self.status != Status.RUNNING or any(r.exited is not None for r in ranks):
            return out  # a rank ended: the others are ending too (a shutdown is no slow step)
        for st in ranks:
            med = self.median_window(st)
            if st.from_report or st._paused or st._exiting or med is None:
                continue
            if st.total_steps and st.step >= st.total_steps:
                continue  # its last step is done: what follows is the end of the loop, not a step
            took = now - st._step_t
            if took > max(SLOW_MIN_S, SLOW_MULTIPLE * med):
                out.append((st, took, med))
        return out

    def is_gone(self, st: RankState) -> bool:
        """The run is over but this rank never said it ended (a lost run): its numbers are old."""
        return self.final and st.exited is None and self.status == Status.LOST

    def eta(self, now: float) -> float | None:
        """Seconds left at the pace the slowest rank kept since the first step; None if unknown,
        or while a rank is stale (the pace says nothing then)."""
        ranks = [r for r in self.rank_list() if r.total_steps]
        if self.final or not ranks or self.first_step_t is None or self.stale_ranks(now):
            return None
        slowest = min(ranks, key=lambda r: r.step)
        done, spent = slowest.step - self.first_step, now - self.first_step_t
        if done <= 0 or spent <= 0:
            return None
        return max(0.0, (slowest.total_steps - slowest.step) * spent / done)
