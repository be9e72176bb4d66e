"""The run seen from outside, reduced from its events: the one reducer the CLI and the app render.

`RunView.feed(ev)` folds one event in. Everything is derived from events (and, through the
follower, from what the run directory says about its processes), so re-attaching to a live run
and opening a finished one are the same thing: replay the file from the start. An events file is
input like any other: a malformed or unknown event is counted and skipped, never raised.

Epochs are counted from 1 here (events carry the engine's 0-based index; events.epoch_number):
people read "epoch 3 of 3", not "epoch 2".

The reducers live in rooms per event family (steps, ranks, epochs, logs, lifecycle) and the rules
read from them in two more (health, rates); RunView holds the fields and composes them.
Replaying from the start is what a view means, not what a reader must pay: checkpoint.py saves a
view's state with the byte offset of the events it covers (view.ckpt.json), and a reader folds
only the events after it into the view read back.
"""
from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field

from ..fleet import Fleet
from ...rundir.status import FINAL, Status
from .epochs import Epochs
from .health import Health
from .lifecycle import Lifecycle
from .logs import Logs
from .parse import Malformed, rank_of, real
from .rates import Rates
from .ranks import Ranks
from .records import (BALANCE_MIN_STEPS, EXITING, KILLED, KILLED_EXIT, LOG_LINES, PHASES, SLOW_MIN_S,
                      SLOW_MULTIPLE, SLOW_WINDOWS, STALE_INTERVALS, STALE_MIN_S, STEP_HISTORY, EpochPoint,
                      LogLine, RankState, Thinned, epoch_text)
from .steps import Steps

__all__ = ["BALANCE_MIN_STEPS", "EXITING", "KILLED", "KILLED_EXIT", "LOG_LINES", "PHASES", "SLOW_MIN_S",
           "SLOW_MULTIPLE", "SLOW_WINDOWS", "STALE_INTERVALS", "STALE_MIN_S", "STEP_HISTORY", "EpochPoint",
           "LogLine", "Malformed", "RankState", "RunView", "Thinned", "epoch_text"]


@dataclass
class RunView(Steps, Ranks, Epochs, Logs, Lifecycle, Health, Rates):
    run: str = ""
    strategy: str = "?"
    world_size: int = 0
    num_nodes: int = 1
    node_rank: int = 0  # the node whose run directory this is (run_started)
    global_batch: int | None = None
    devices: list = field(default_factory=list)
    host: str = ""
    supervisor_pid: int | None = None
    run_kind: str = ""  # "script": a user's script (torchdeck launch); "": torchdeck's own loop
    killed: bool = False  # the user killed it (torchdeck kill, a second Ctrl-C): status stopped, exit KILLED_EXIT
    command: list = field(default_factory=list)  # a script run's command line (run_started's)
    total_steps: int = 0
    total_epochs: int | None = None
    status: Status = Status.STARTING
    started_t: float | None = None
    finished_t: float | None = None
    root_cause: str | None = None
    ranks: dict = field(default_factory=dict)
    epochs: dict = field(default_factory=dict)  # 1-based epoch -> EpochPoint (rank 0's, else the first)
    errors: list = field(default_factory=list)  # LogLine(level="error") with the traceback in detail
    logs: list = field(default_factory=list)  # LogLine, in time order, the newest LOG_LINES
    log_seq: int = 0  # lines ever added; a pane writes those it has not seen
    log_rewrites: int = 0  # bumps when a line went in before others: redraw the log from scratch
    events: int = 0  # events folded in
    skipped: int = 0  # events that were malformed or of a kind this version does not know
    version: int = 0  # bumps on every change a front end could show
    curve_version: int = 0  # bumps when a curve gains a point
    stop_requested: bool = False
    first_step_t: float | None = None
    first_step: int = 0
    last_t: float | None = None  # newest event time
    steps: Thinned = field(default_factory=Thinned)  # (step, train loss)
    step_acc: Thinned = field(default_factory=Thinned)  # (step, train batch accuracy)
    step_t: Thinned | None = None  # (step, (event time, rank)) of each point of `steps`: replay(timed=True)
    best_val_acc: float | None = None
    best_val_loss: float | None = None
    has_accuracy: bool | None = None  # the task is classification: True once an accuracy came, False once a loss came without one
    loss_rule: str = ""  # the loss the run decided on, as it said it (run_started's loss, or rank 0's "loss: ..." line)
    step_metrics: dict = field(default_factory=dict)  # name -> Thinned (step, value): the curve rank's extra metrics
    elapsed_s: float | None = None  # how long the run took, as it recorded it (run_finished)
    phase_t: dict = field(default_factory=dict)  # phase -> when the first rank entered it
    stacks: dict | None = None  # the newest `stacks` event: {t, reason, summary, groups}
    fleet: Fleet = field(default_factory=Fleet)  # every node's GPUs and host (node_sample events)
    lost_nodes: dict = field(default_factory=dict)  # node rank -> what node 0 said of it (node_lost events)
    start_step: int = 0  # where a resumed run starts: its checkpoint's step, shown before its first step event
    exit_codes: list | None = None  # per local rank, as the run ended (run_finished, else status.json)
    failed_local_rank: int | None = None  # the index in exit_codes of the rank the root cause names
    restarts: tuple = ()  # one (attempt, max_restarts, cause, lost_s, resume_step, t) per `restart` event
    _traceback_lines: dict = field(default_factory=dict)  # rank -> lines of its error tracebacks
    _curve_rank: int | None = None
    _finished_event: bool = False

    def rank(self, r) -> RankState:
        r = rank_of(r)
        st = self.ranks.get(r)
        if st is None:
            st = self.ranks[r] = RankState(r, total_steps=self.total_steps, step=self.start_step)
        return st

    def feed(self, ev) -> bool:
        """Fold one event in; False (and counted in `skipped`) for what cannot be used."""
        handler = getattr(self, "_on_" + str(ev.get("kind")), None) if isinstance(ev, dict) else None
        if handler is None:
            self.skipped += 1
            return False
        t = real(ev.get("t"))
        if t is None or t != t or t in (float("inf"), float("-inf")):
            t = self.last_t or time.time()
        self.last_t = max(self.last_t or t, t)
        try:
            handler(ev, t)
        except (TypeError, ValueError, AttributeError, KeyError, OverflowError):
            self.skipped += 1  # a malformed event must not take its reader down
            return False
        self.events += 1
        self.version += 1
        return True

    def feed_all(self, evs) -> int:
        return sum(self.feed(ev) for ev in evs)

    @property
    def final(self) -> bool:
        return self.status in FINAL

    def rank_list(self) -> list[RankState]:
        return [self.ranks[k] for k in sorted(self.ranks) if k >= 0]

    def progress(self) -> tuple[int, int]:
        """(step of the slowest rank, total steps): where the run as a whole is."""
        ranks = self.rank_list()
        step = min((r.step for r in ranks), default=self.start_step)
        total = max((r.total_steps for r in ranks), default=0) or self.total_steps  # the ranks know best
        return step, total

    def epoch(self) -> int:
        """The 1-based epoch in progress (the slowest rank's); 0 before any rank is known."""
        ranks = self.rank_list()
        return min((r.epoch for r in ranks), default=0)

    def timed_losses(self) -> list[tuple[int, float, float]]:
        """The loss curve with its times: (step, event time, loss) of the lowest rank's step events
        (the points of `steps`, thinned alike unless replayed with every point); a view that does not
        keep the times (the live one: replay(timed=True) does) has none."""
        if self.step_t is None:
            return []
        return [(step, when, loss) for (step, loss), (_, (when, rank)) in zip(self.steps.points, self.step_t.points)
                if rank == self._curve_rank and when is not None]

    @classmethod
    def replay(cls, evs, timed: bool = False) -> "RunView":
        """A view of events read back whole (a finished run, a comparison's row). `timed` also keeps
        the time of each loss point (timed_losses) and every curve point instead of STEP_HISTORY: a
        one-off read for overlaying runs, which the live Monitor does not pay for."""
        view = cls()
        if timed:
            view.steps, view.step_acc, view.step_t = Thinned(1 << 62), Thinned(1 << 62), Thinned(1 << 62)
        view.feed_all(evs)
        return view

    def snapshot(self) -> "RunView":
        """A copy a UI thread can read while this one keeps changing in the reader thread."""
        snap = copy.copy(self)
        snap.ranks = {k: copy.copy(v) for k, v in self.ranks.items()}
        snap.epochs = dict(self.epochs)
        snap.errors = list(self.errors)
        snap.logs = list(self.logs)
        snap.steps = self.steps.copy()
        snap.step_acc = self.step_acc.copy()
        snap.step_t = None if self.step_t is None else self.step_t.copy()
        snap.fleet = self.fleet.copy()
        snap.lost_nodes = dict(self.lost_nodes)
        snap.step_metrics = {k: v.copy() for k, v in self.step_metrics.items()}
        return snap
