"""Steps and their windows: a rank's step events (and rank 0's rank_report for ranks on other
nodes) move its step, pace, rates, waits and memory, and the curves."""
from __future__ import annotations

from ...events import epoch_number
from ...kinds import kind_of
from ...rundir.status import Status
from .parse import Malformed, as_text, numbers, read_memory, real, whole
from .records import RankState, Thinned


class Steps:
    """RunView's step reducers (a mixin: they read and write the view's fields)."""

    def _seen(self, st: RankState, t: float) -> None:
        if st._step_t is not None and t > st._step_t:
            gap = t - st._step_t
            st.interval = gap if st.interval is None else 0.8 * st.interval + 0.2 * gap
        st._step_t = t
        st.last_seen = t if st.last_seen is None else max(st.last_seen, t)

    @staticmethod
    def _window(st: RankState, t: float, pause: bool) -> None:
        """The time one log window of training steps took, unless the rank paused (evaluation, a
        checkpoint) between this step event and the last: what `slow_ranks` compares with."""
        if st._step_t is not None and not st._paused and t > st._step_t:
            st._windows.append(t - st._step_t)
            del st._windows[:-64]
        st._paused = pause

    def _stepping(self, t: float, step: int) -> None:
        if self.first_step_t is None:
            self.first_step_t, self.first_step = t, step
            self.phase_t.setdefault("step", t)
            took = self.startup_breakdown()
            if took:
                total = sum(s for _, s in took)
                head = "first step" if step <= 1 else f"first steps (1-{step}) done"
                self._log(t, "info", None, f"{head} {total:.1f} s after the supervisor started: "
                                           + ", ".join(f"{what} {s:.1f} s" for what, s in took))
        if self.status == Status.STARTING:
            self.status = Status.RUNNING

    def _on_step(self, ev, t) -> None:
        st = self.rank(ev.get("rank"))
        st.from_report = False
        self._node(st, ev)
        st.epoch = epoch_number(ev.get("epoch"), st.epoch)
        reported = whole(ev.get("step"), st.step)
        # a rank's step is the highest it reported: a script's torchdeck.log(step=i) counted from 0
        # after the step hook's count from 1 must not take it back (nor the order events are read in)
        st.step = max(st.step, reported)
        self._pace(st, ev, t, reported)
        st.total_steps = whole(ev.get("total_steps")) or st.total_steps or self.total_steps
        loss = real(ev.get("loss"))
        script_hook = loss is None and "steps_per_s" in ev  # a script's step hook: loss null between log() calls
        st.loss = st.loss if script_hook else loss
        acc = real(ev.get("accuracy"))
        st.acc = acc if acc is not None else st.acc
        if acc is not None:
            self.has_accuracy = True
        elif loss is not None and self.has_accuracy is None and not kind_of(self).is_script:
            self.has_accuracy = False  # the loop says a batch's accuracy wherever the task has one
        self._rates(st, ev, t)
        metrics = numbers(ev.get("metrics"))
        if metrics:
            st.metrics = {**st.metrics, **metrics}  # a new dict: a snapshot keeps the one it copied
        read_memory(st, ev)  # the loop's step events carry each rank's memory (issue 31; before: rank_report)
        self._waits(st, ev)
        self._window(st, t, bool(ev.get("pause")))  # before _seen moves _step_t on
        self._seen(st, t)
        self._stepping(t, st.step)
        self._curves(st, t, acc, metrics, script_hook)

    @staticmethod
    def _pace(st: RankState, ev: dict, t: float, reported: int) -> None:
        """The mean pace is over its stepping time, first step to last: an event sent later (the
        hook's count at its window's end or the exit, after the rank sat in a failing collective)
        says when its last step was (step_t), and a step said again does not move its time on."""
        done_t = real(ev.get("step_t"))
        done_t = t if done_t is None or done_t > t else done_t
        if st._pace_from is None:
            st._pace_from = (t, reported)
        if st._pace_to is None or reported > st._pace_to[1]:
            st._pace_to = (max(done_t, st._pace_from[0]), reported)

    @staticmethod
    def _rates(st: RankState, ev: dict, t: float) -> None:
        """Its samples/s, steps/s, tokens/s and MFU, each rate weighed by the window it is over."""
        wait_s, comp_s = real(ev.get("data_wait_s")), real(ev.get("compute_s"))
        script = "steps_per_s" in ev  # a script's step hook or torchdeck.log
        st._script = st._script or script
        if wait_s is not None and comp_s is not None:
            window = wait_s + comp_s  # the loop's window: its rate is samples / this
        elif script and "samples_per_s" in ev:  # torchdeck.log: its rates are over the time since its last event
            window = None if st._rate_t is None else t - st._rate_t
            st._rate_t = t
        else:
            window = None
        rate = real(ev.get("samples_per_s"))
        if rate is not None or not script:  # the hook's null: the last log() rate stands
            st.add_rate(rate or 0.0, window)
        sps = real(ev.get("steps_per_s"))
        st.steps_per_s = sps if sps is not None else st.steps_per_s
        tok = real(ev.get("tokens_per_s"))
        if tok is not None:
            st.add_tokens(tok, window)
        mfu = real(ev.get("mfu"))
        st.mfu = mfu if mfu is not None else st.mfu

    @staticmethod
    def _waits(st: RankState, ev: dict) -> None:
        """Its shares of the step time waiting for data and in the all-reduce, and its timed window."""
        wait_s, comp_s = real(ev.get("data_wait_s")), real(ev.get("compute_s"))
        wait, comp = wait_s or 0.0, comp_s or 0.0
        st.data_wait = wait / (wait + comp) if wait + comp > 0 else None
        if wait_s is not None and comp_s is not None:  # a window it timed
            st.add_window(st.step, wait_s + comp_s, wait_s)
        comm = real(ev.get("comm_s"))
        st.comm_wait = min(1.0, max(0.0, comm / (wait + comp))) if comm is not None and wait + comp > 0 else None

    def _curves(self, st: RankState, t: float, acc, metrics: dict, script_hook: bool) -> None:
        """A point per loss the lowest rank said (its accuracy alongside), and its extra metrics."""
        if self._curve_rank is None or st.rank < self._curve_rank:
            self._curve_rank = st.rank  # the lowest rank's loss is the curve
        if st.rank == self._curve_rank and st.loss is not None and not script_hook:
            self.steps.add(st.step, st.loss)
            if self.step_t is not None:
                self.step_t.add(st.step, (t, st.rank))
            if acc is not None:
                self.step_acc.add(st.step, acc)
            self.curve_version += 1
        if st.rank == self._curve_rank and metrics:  # a script logs metrics without a loss too
            for name, v in metrics.items():
                self.step_metrics.setdefault(name, Thinned(self.steps.cap)).add(st.step, v)
            self.curve_version += 1

    def _on_rank_report(self, ev, t) -> None:
        """Rank 0's periodic summary of every rank: the only news of ranks on other nodes."""
        reports = ev.get("reports")
        if not isinstance(reports, list):
            raise Malformed("rank_report without reports")
        for rep in reports:
            if not isinstance(rep, dict) or rep.get("rank") is None:
                continue
            st = self.rank(rep.get("rank"))
            rt = real(rep.get("t")) or t
            read_memory(st, rep)
            if rep.get("node_rank") is not None:
                st.node_rank = whole(rep.get("node_rank"))
            if rep.get("host") and not st.host:
                st.host = as_text(rep["host"])
            if st.last_seen is not None and not st.from_report:
                continue  # a rank of this node: its own events say more, and sooner
            st.from_report = True
            st.epoch = epoch_number(rep.get("epoch"), st.epoch)
            st.step = whole(rep.get("step"), st.step)
            st.total_steps = st.total_steps or self.total_steps
            st.add_rate(real(rep.get("samples_per_s")) or 0.0)
            tok = real(rep.get("tokens_per_s"))
            if tok is not None:
                st.add_tokens(tok)
            wait = real(rep.get("data_wait"))
            if wait is not None:
                st.data_wait = wait if 0.0 <= wait <= 1.0 else None
            comm = real(rep.get("comm_wait"))
            st.comm_wait = comm if comm is not None and 0.0 <= comm <= 1.0 else None
            self._seen(st, rt)
            self._stepping(rt, st.step)
