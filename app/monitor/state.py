"""What the Monitor screen knows about a run, reduced from its events (no Textual, no torch).

`RunState.feed(ev)` folds one event in; a reader thread feeds every event and hands the UI a
`RunState.snapshot()` a few times a second, so the UI never sees (or pays for) single events.
Everything is derived from events alone, so re-attaching to a live run or opening a finished
one is the same thing: replay the file from the start.
"""
from __future__ import annotations

import copy
import time
from collections import deque
from dataclasses import dataclass, field

from engine.progress import fmt_duration  # noqa: F401  (the panes import it from here)

STALE_MIN_S = 10.0  # a rank is stale after max(this, STALE_INTERVALS x its reporting interval)
STALE_INTERVALS = 5
STEP_HISTORY = 600  # points kept of the per-step loss curve (older ones are thinned, not dropped)
LOG_LINES = 500
FINAL = ("finished", "failed", "stopped", "lost")  # lost: supervisor gone without a final status


@dataclass
class RankState:
    rank: int
    host: str = ""
    node_rank: int | None = None
    device: str = ""
    pid: int | None = None
    epoch: int = 0
    step: int = 0
    total_steps: int = 0
    loss: float | None = None
    acc: float | None = None
    samples_per_s: float = 0.0
    data_wait: float | None = None  # share of the step time spent waiting for data, 0..1
    device_mem_mb: float | None = None
    last_seen: float | None = None  # event time of the newest news about this rank
    interval: float | None = None  # typical seconds between its reports (smoothed)
    exited: str | None = None  # "exit 0", "exit 1", "signal SIGKILL"
    from_report: bool = False  # known only through rank 0's rank_report (another node)
    _step_t: float | None = None

    @property
    def failed_exit(self) -> bool:
        return self.exited is not None and self.exited != "exit 0"


@dataclass
class LogLine:
    t: float
    level: str  # info | warning | error | output (a line from a worker's log file)
    rank: int | None
    text: str
    detail: str = ""  # a traceback, for errors


@dataclass
class EpochPoint:
    epoch: int
    step: int
    train_loss: float | None
    train_acc: float | None
    val_loss: float | None
    val_acc: float | None


class _Thinned:
    """A bounded series that keeps the whole run: when full, every other point goes and new
    points are kept at half the rate, so a long run's curve keeps its shape."""

    def __init__(self, cap: int):
        self.cap, self.stride, self.n, self.points = cap, 1, 0, []

    def add(self, x, y) -> bool:
        self.n += 1
        if (self.n - 1) % self.stride:
            if self.points:
                self.points[-1] = (x, y)  # keep the newest point visible until its slot comes
            return True
        self.points.append((x, y))
        if len(self.points) > self.cap:
            self.points = self.points[::2]
            self.stride *= 2
        return True


def _f(v) -> float | None:
    try:
        return None if v is None else float(v)
    except (TypeError, ValueError):
        return None


def _i(v, default: int = 0) -> int:
    try:
        return int(v)
    except (TypeError, ValueError):
        return default


@dataclass
class RunState:
    run: str = ""
    strategy: str = "?"
    world_size: int = 0
    num_nodes: int = 1
    global_batch: int | None = None
    devices: list = field(default_factory=list)
    host: str = ""
    supervisor_pid: int | None = None
    total_steps: int = 0
    status: str = "starting"  # starting | running | finished | failed | stopped | lost
    started_t: float | None = None
    finished_t: float | None = None
    root_cause: str | None = None
    ranks: dict = field(default_factory=dict)
    epochs: dict = field(default_factory=dict)  # epoch -> EpochPoint (rank 0's, else the first)
    errors: list = field(default_factory=list)  # LogLine(level="error") with the traceback in detail
    _traceback_lines: dict = field(default_factory=dict)  # rank -> lines of its error events' tracebacks
    logs: deque = field(default_factory=lambda: deque(maxlen=LOG_LINES))
    log_seq: int = 0  # lines ever added; the UI writes those it has not seen
    events: int = 0
    version: int = 0  # bumps on every change the UI could show
    curve_version: int = 0  # bumps when a curve gains a point
    stop_requested: bool = False
    first_step_t: float | None = None
    first_step: int = 0
    last_t: float | None = None  # newest event time
    steps: _Thinned = field(default_factory=lambda: _Thinned(STEP_HISTORY))  # (step, train loss)
    step_acc: _Thinned = field(default_factory=lambda: _Thinned(STEP_HISTORY))  # (step, train batch accuracy)
    _curve_rank: int | None = None

    # ------------------------------------------------------------------ reducing
    def rank(self, r) -> RankState:
        if isinstance(r, bool) or not isinstance(r, (int, float, str)):
            raise ValueError(f"bad rank {r!r}")
        r = int(r)  # a rank that is not a number makes the event malformed (skipped)
        st = self.ranks.get(r)
        if st is None:
            st = self.ranks[r] = RankState(r, total_steps=self.total_steps)
        return st

    def _log(self, t, level, rank, text, detail="") -> None:
        self.logs.append(LogLine(t, level, rank, text, detail))
        self.log_seq += 1

    def feed(self, ev: dict) -> bool:
        """Fold one event in; False for kinds this version does not know (they are skipped)."""
        if not isinstance(ev, dict):
            return False
        handler = getattr(self, "_on_" + str(ev.get("kind")), None)
        if handler is None:
            return False
        t = _f(ev.get("t")) or time.time()
        self.last_t = max(self.last_t or t, t)
        try:
            handler(ev, t)
        except (TypeError, ValueError, AttributeError, KeyError):
            return False  # a malformed event must not take the monitor down
        self.events += 1
        self.version += 1
        return True

    def feed_all(self, evs) -> int:
        return sum(self.feed(ev) for ev in evs)

    def _on_run_started(self, ev, t) -> None:
        self.run = ev.get("run") or self.run
        self.strategy = ev.get("strategy") or self.strategy
        self.world_size = _i(ev.get("world_size"))
        self.num_nodes = _i(ev.get("num_nodes"), 1)
        self.global_batch = ev.get("global_batch")
        self.devices = list(ev.get("devices") or [])
        self.host = ev.get("host") or ""
        self.supervisor_pid = ev.get("pid")
        self.total_steps = _i(ev.get("total_steps"))
        self.started_t = t
        if self.status not in FINAL:
            self.status = "running"
        for st in self.ranks.values():
            st.total_steps = st.total_steps or self.total_steps

    def _on_rank_ready(self, ev, t) -> None:
        st = self.rank(ev.get("rank"))
        st.device = str(ev.get("device") or "")
        st.host = ev.get("host") or st.host
        st.pid = ev.get("pid")
        st.from_report = False
        st.last_seen = t

    def _seen(self, st: RankState, t: float) -> None:
        if st._step_t is not None and t > st._step_t:
            gap = t - st._step_t
            st.interval = gap if st.interval is None else 0.8 * st.interval + 0.2 * gap
        st._step_t = t
        st.last_seen = t if st.last_seen is None else max(st.last_seen, t)

    def _on_step(self, ev, t) -> None:
        st = self.rank(ev.get("rank"))
        st.from_report = False
        st.epoch = _i(ev.get("epoch"), st.epoch)
        st.step = _i(ev.get("step"), st.step)
        st.total_steps = _i(ev.get("total_steps")) or st.total_steps or self.total_steps
        st.loss = _f(ev.get("loss"))
        acc = _f(ev.get("accuracy"))
        st.acc = acc if acc is not None else st.acc
        st.samples_per_s = _f(ev.get("samples_per_s")) or 0.0
        wait, comp = _f(ev.get("data_wait_s")) or 0.0, _f(ev.get("compute_s")) or 0.0
        st.data_wait = wait / (wait + comp) if wait + comp > 0 else None
        self._seen(st, t)
        if self.first_step_t is None:
            self.first_step_t, self.first_step = t, st.step
        if self.status == "starting":
            self.status = "running"
        if self._curve_rank is None or st.rank < self._curve_rank:
            self._curve_rank = st.rank  # the lowest rank's loss is the curve
        if st.rank == self._curve_rank and st.loss is not None:
            self.steps.add(st.step, st.loss)
            if acc is not None:
                self.step_acc.add(st.step, acc)
            self.curve_version += 1

    def _on_epoch_end(self, ev, t) -> None:
        r = _i(ev.get("rank"), -1)
        epoch = _i(ev.get("epoch"))
        st = self.rank(r)
        st.epoch = max(st.epoch, epoch)
        st.last_seen = t if st.last_seen is None else max(st.last_seen, t)
        have = self.epochs.get(epoch)
        if have is None or r == 0:
            self.epochs[epoch] = EpochPoint(epoch, _i(ev.get("step")), _f(ev.get("train_loss")),
                                            _f(ev.get("train_acc")), _f(ev.get("val_loss")), _f(ev.get("val_acc")))
            self.curve_version += 1
        if have is None:
            p = self.epochs[epoch]
            self._log(t, "info", None, f"epoch {epoch} done at step {p.step}: train loss {_num(p.train_loss)} "
                                        f"acc {_pct(p.train_acc)}, val loss {_num(p.val_loss)} acc {_pct(p.val_acc)}")

    def _on_checkpoint(self, ev, t) -> None:
        self._log(t, "info", ev.get("rank"), f"checkpoint saved: {ev.get('path')} (step {ev.get('step')})")

    def _on_log(self, ev, t) -> None:
        level = str(ev.get("level") or "info")
        msg = str(ev.get("message", ""))
        if ev.get("rank") is None and msg.startswith("stop requested"):
            self.stop_requested = True
        self._log(t, level, ev.get("rank"), msg)

    def _on_error(self, ev, t) -> None:
        rank = ev.get("rank")
        text = (f"rank {rank} on {ev.get('host') or '?'} (pid {ev.get('pid') or '?'}): "
                f"{ev.get('exception') or 'Error'}: {ev.get('message', '')}")
        line = LogLine(t, "error", rank, text, str(ev.get("traceback") or "").rstrip())
        self.errors.append(line)
        self._traceback_lines.setdefault(rank, set()).update(ln.rstrip() for ln in line.detail.splitlines())
        self.logs.append(line)
        self.log_seq += 1
        if rank is not None:
            self.rank(rank).last_seen = t

    def _on_rank_exited(self, ev, t) -> None:
        st = self.rank(ev.get("rank"))
        sig = ev.get("signal")
        st.exited = f"signal {sig}" if sig else f"exit {ev.get('exitcode')}"
        if st.failed_exit:
            self._log(t, "warning", st.rank, f"rank {st.rank} ended: {st.exited}")

    def _on_run_finished(self, ev, t) -> None:
        self.status = str(ev.get("status") or "failed")
        self.root_cause = ev.get("root_cause")
        self.finished_t = t
        if self.started_t is None and _f(ev.get("elapsed_s")) is not None:
            self.started_t = t - _f(ev.get("elapsed_s"))
        text = f"run {self.status}" + (f": {self.root_cause}" if self.root_cause else "")
        self._log(t, "error" if self.status == "failed" else "info", None, text)

    def _on_rank_report(self, ev, t) -> None:
        """Rank 0's periodic summary of every rank: the only news of ranks on other nodes."""
        for rep in ev.get("reports") or []:
            if not isinstance(rep, dict) or rep.get("rank") is None:
                continue
            st = self.rank(rep.get("rank"))
            rt = _f(rep.get("t")) or t
            mem = _f(rep.get("device_mem_mb"))
            if mem is not None:
                st.device_mem_mb = mem
            if rep.get("node_rank") is not None:
                st.node_rank = _i(rep.get("node_rank"))
            if rep.get("host") and not st.host:
                st.host = rep["host"]
            if st.last_seen is not None and not st.from_report:
                continue  # a rank of this node: its own events say more, and sooner
            st.from_report = True
            st.epoch = _i(rep.get("epoch"), st.epoch)
            st.step = _i(rep.get("step"), st.step)
            st.total_steps = st.total_steps or self.total_steps
            st.samples_per_s = _f(rep.get("samples_per_s")) or 0.0
            wait = _f(rep.get("data_wait"))
            if wait is not None:
                st.data_wait = wait if wait <= 1.0 else None
            self._seen(st, rt)
        if self.status == "starting":
            self.status = "running"

    # ------------------------------------------------------------------ outside news
    def add_output(self, rank: int | None, text: str, t: float | None = None) -> None:
        """A line a worker (or the supervisor) printed to its log file. The traceback a failing
        rank prints there is already shown with its error event: not a second time."""
        if text.strip() and text.rstrip() in self._traceback_lines.get(rank, ()):
            return
        self._log(t or self.last_t or time.time(), "output", rank, text)
        self.version += 1

    def mark_lost(self, why: str) -> None:
        """The supervisor is gone without a run_finished: the run is over. Called "lost", as the
        Runs list and `torchdeck runs` call it (nothing recorded how it ended)."""
        if self.status in FINAL:
            return
        self.status = "lost"
        self.root_cause = self.root_cause or why
        self.finished_t = self.finished_t or self.last_t or time.time()
        self._log(self.finished_t, "error", None, f"run lost: {why}")
        self.version += 1

    # ------------------------------------------------------------------ derived
    @property
    def final(self) -> bool:
        return self.status in FINAL

    def rank_list(self) -> list[RankState]:
        return [self.ranks[k] for k in sorted(self.ranks) if k >= 0]

    def elapsed(self, now: float) -> float | None:
        if self.started_t is None:
            return None
        return max(0.0, (self.finished_t or now) - self.started_t)

    def eta(self, now: float) -> float | None:
        """Seconds left at the pace the slowest rank kept since the first step; None if unknown."""
        ranks = [r for r in self.rank_list() if r.total_steps]
        if self.final or not ranks or self.first_step_t is None:
            return None
        slowest = min(ranks, key=lambda r: r.step)
        done, spent = slowest.step - self.first_step, now - self.first_step_t
        if done <= 0 or spent <= 0:
            return None
        return max(0.0, (slowest.total_steps - slowest.step) * spent / done)

    def global_samples_per_s(self) -> float:
        if self.final:
            return 0.0
        return sum(r.samples_per_s for r in self.rank_list() if r.exited is None)

    def stale_after(self, st: RankState) -> float:
        return max(STALE_MIN_S, STALE_INTERVALS * (st.interval or 0.0))

    def is_stale(self, st: RankState, now: float) -> bool:
        """No news of a rank for longer than it normally takes, while the run should be busy."""
        if self.status != "running" or st.exited is not None or st.last_seen is None:
            return False
        return now - st.last_seen > self.stale_after(st)

    def rank_spread(self) -> tuple[RankState, RankState] | None:
        """(slowest, fastest) rank by samples/s (their last figures, once the run is over)."""
        live = [r for r in self.rank_list() if not r.failed_exit and r.samples_per_s > 0
                and (r.exited is None or self.final)]
        if len(live) < 2:
            return None
        return min(live, key=lambda r: r.samples_per_s), max(live, key=lambda r: r.samples_per_s)

    def rank_pids(self) -> dict:
        """pid -> rank for the run's processes (the supervisor as None), for the host and GPU panes."""
        out = {}
        if self.supervisor_pid:
            out[self.supervisor_pid] = None
        for st in self.rank_list():
            if st.pid and not st.from_report:
                out[st.pid] = st.rank
        return out

    def snapshot(self) -> "RunState":
        """A copy the UI can read while this one keeps changing in the reader thread."""
        snap = copy.copy(self)
        snap.ranks = {k: copy.copy(v) for k, v in self.ranks.items()}
        snap.epochs = dict(self.epochs)
        snap.errors = list(self.errors)
        snap.logs = deque(self.logs, maxlen=LOG_LINES)
        snap.steps = _Thinned(STEP_HISTORY)
        snap.steps.points = list(self.steps.points)
        snap.step_acc = _Thinned(STEP_HISTORY)
        snap.step_acc.points = list(self.step_acc.points)
        return snap


def _num(v) -> str:
    return "-" if v is None else f"{v:.4f}"


def _pct(v) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


