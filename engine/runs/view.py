"""The run seen from outside, reduced from its events: the one reducer the CLI and the app render.

`RunView.feed(ev)` folds one event in. Everything is derived from events (and, through the
follower, from what the run directory says about its processes), so re-attaching to a live run
and opening a finished one are the same thing: replay the file from the start. An events file is
input like any other: a malformed or unknown event is counted and skipped, never raised.

Epochs are counted from 1 here (events carry the engine's 0-based index; events.epoch_number):
people read "epoch 3 of 3", not "epoch 2".
"""
from __future__ import annotations

import bisect
import copy
import time
from dataclasses import dataclass, field

from ..events import epoch_number
from .. import fmt
from . import metric
from .fleet import Fleet, multi_node, node_of
from ..kinds import kind_of
from ..rundir.status import FINAL, Status, decide

STALE_MIN_S = 10.0  # a rank is stale after max(this, STALE_INTERVALS x its reporting interval)
STALE_INTERVALS = 5
SLOW_MULTIPLE = 10.0  # a rank is slow when its step window takes this many times its median ...
SLOW_MIN_S = 2.0  # ... and at least this long (the watchdog's second trigger, besides stale)
BALANCE_MIN_STEPS = 20  # steps a script's rank has done before its rate can say it is behind
SLOW_WINDOWS = 5  # windows measured before the rule applies (the first ones include warm-up)
STEP_HISTORY = 600  # points kept of the per-step curves (older ones are thinned, not dropped)
LOG_LINES = 500


@dataclass
class RankState:
    rank: int
    host: str = ""
    node_rank: int | None = None
    device: str = ""
    cpus: str = ""  # the cores it is bound to ("0", "0-3"; train.cpu_affinity), "" when not bound
    pid: int | None = None
    epoch: int = 1  # 1-based epoch in progress (a starting rank: the one it starts in)
    step: int = 0
    total_steps: int = 0
    loss: float | None = None
    acc: float | None = None  # training-batch accuracy
    val_acc: float | None = None
    samples_per_s: float = 0.0
    steps_per_s: float | None = None  # a user's script (step hook): optimizer steps/s over its last window
    tokens_per_s: float | None = None  # what its last step event said (the batch carries token ids, or torchdeck.log)
    metrics: dict = field(default_factory=dict)  # {name: float} its step events' extra metrics, the newest of each
    mfu: float | None = None  # model FLOPs utilization its last step event said (train.compile on a GPU)
    data_wait: float | None = None  # share of the step time spent waiting for data, 0..1
    comm_wait: float | None = None  # share in the all-reduce, waiting for the other ranks (None: not measured)
    device_mem_mb: float | None = None
    peak_mem_mb: float | None = None  # the most it held so far (rank_report)
    mem_high_mb: float | None = None  # the same, or its largest device_mem_mb where no peak was sent (older runs)
    last_seen: float | None = None  # event time of the newest news about this rank
    interval: float | None = None  # typical seconds between its reports (smoothed)
    exited: str | None = None  # "exit 0", "exit 1", "signal SIGKILL"
    from_report: bool = False  # known only through rank 0's rank_report (another node)
    phase: str = ""  # what it does while starting (PHASES), until its first step
    _step_t: float | None = None  # event time of its newest step (or report)
    _paused: bool = True  # evaluating or checkpointing after that step event (or not stepping yet)
    _exiting: bool = False  # its script body returned (the shim said so): the watchdog calls nothing slow
    _windows: list = field(default_factory=list)  # seconds between step events, pauses left out
    _rates: int = 0  # step-window rates it reported, and the sum of their inverses: where a window's
    _inv_rate_sum: float = 0.0  # length is not known, each counts as the same samples (harmonic mean)
    _tok_rates: int = 0  # the same for tokens/s
    _inv_tok_sum: float = 0.0
    _samples: float = 0.0  # samples (rate x window length) and seconds of the windows whose length is
    _samples_s: float = 0.0  # known: the mean over the run is their ratio (windows of unequal length:
    _tokens: float = 0.0  # a script's torchdeck.log events, the last one a few ms of a merged call)
    _tokens_s: float = 0.0
    _rate_t: float | None = None  # event time of its last torchdeck.log event: where the next one's window starts
    _pace_from: tuple | None = None  # (event time, step) of its first step event and its newest step: the
    _pace_to: tuple | None = None  # mean steps/s over the run
    warmup_steps: int | None = None  # the step of its first timed window: warm-up, left out of the sums below
    timed_steps: int = 0  # steps of its timed windows after warm-up (the run's rate: engine.runs.compare)
    timed_s: float = 0.0  # their data_wait_s + compute_s (training only: evaluation is in no window)
    timed_wait_s: float = 0.0  # their data_wait_s
    _timed_at: int | None = None  # the step of its newest timed window
    _script: bool = False  # it reports through a script's step hook or torchdeck.log (steps/s is its pace)

    def add_rate(self, samples_per_s: float, window_s: float | None = None) -> None:
        self.samples_per_s = samples_per_s
        if samples_per_s > 0:
            self._rates += 1
            self._inv_rate_sum += 1.0 / samples_per_s
            if window_s is not None and window_s > 0:
                self._samples += samples_per_s * window_s
                self._samples_s += window_s

    @property
    def mean_samples_per_s(self) -> float:
        """Its rate over the run: samples / time of its windows (each window's samples are its
        rate x its length); the harmonic mean where no window said its length (older events)."""
        if self._samples_s > 0:
            return self._samples / self._samples_s
        return self._rates / self._inv_rate_sum if self._rates else 0.0

    def add_tokens(self, tokens_per_s: float, window_s: float | None = None) -> None:
        self.tokens_per_s = tokens_per_s
        if tokens_per_s > 0:
            self._tok_rates += 1
            self._inv_tok_sum += 1.0 / tokens_per_s
            if window_s is not None and window_s > 0:
                self._tokens += tokens_per_s * window_s
                self._tokens_s += window_s

    @property
    def mean_tokens_per_s(self) -> float:
        if self._tokens_s > 0:
            return self._tokens / self._tokens_s
        return self._tok_rates / self._inv_tok_sum if self._tok_rates else 0.0

    @property
    def mean_steps_per_s(self) -> float | None:
        """Steps/s from its first step event to its newest step; None before two."""
        if self._pace_from is None or self._pace_to is None:
            return None
        (t0, s0), (t1, s1) = self._pace_from, self._pace_to
        return (s1 - s0) / (t1 - t0) if t1 > t0 and s1 > s0 else None

    def settle(self) -> None:
        """The run is over: its rates are its means over the run, not its last window's (a
        script's last merged torchdeck.log event can be one step over a few ms)."""
        if self._rates:
            self.samples_per_s = self.mean_samples_per_s
        if self._tok_rates:
            self.tokens_per_s = self.mean_tokens_per_s
        if self.steps_per_s is not None or self._pace_from is not None and self._script:
            pace = self.mean_steps_per_s
            self.steps_per_s = pace if pace is not None else self.steps_per_s

    def add_window(self, step: int, wall_s: float, wait_s: float) -> None:
        """A step event that timed its window (the steps since the one before): the first is warm-up
        (start-up, first iterations, allocator growth) and only marks where timing starts."""
        before, self._timed_at = self._timed_at, step
        if before is None:
            self.warmup_steps = step
        elif step > before:
            self.timed_steps += step - before
            self.timed_s += wall_s
            self.timed_wait_s += wait_s

    @property
    def failed_exit(self) -> bool:
        return self.exited is not None and self.exited != "exit 0"

    @property
    def place(self) -> str:
        """Where it runs, as both front ends label a rank: its device (`cpu@1`: bound to core 1),
        else its node when only that is known."""
        dev = self.device or (f"node {self.node_rank}" if self.node_rank is not None else "?")
        return f"{dev}@{self.cpus}" if self.cpus and self.device else dev


@dataclass
class LogLine:
    t: float
    level: str  # info | warning | error | output (a line from a worker's log file)
    rank: int | None
    text: str
    detail: str = ""  # a traceback, for errors
    seq: int = 0  # order of arrival: a reader shows the lines newer than the last it showed

    @property
    def who(self) -> str:
        return "supervisor" if self.rank is None else f"rank {self.rank}"


@dataclass
class EpochPoint:
    epoch: int  # 1-based
    step: int
    train_loss: float | None
    train_acc: float | None
    val_loss: float | None
    val_acc: float | None
    t: float | None = None  # when it ended (event time)
    rank: int = -1  # whose it is: 0, else -1 (the supervisor's), else the first rank to send it
    val_metrics: dict = field(default_factory=dict)  # {name: float}: perplexity, a loss callable's own
    train_metrics: dict = field(default_factory=dict)


def epoch_text(p: EpochPoint) -> str:
    """An epoch's figures as the log says them: train loss 0.3 acc 91.0%, val loss 0.4 acc 89.5%
    for classification; a task without accuracy names its loss and its own metrics instead
    (train loss 2.1, val loss 1.9 perplexity 6.7)."""
    classify = p.train_acc is not None or p.val_acc is not None

    def part(loss, acc, extra) -> str:
        out = f"loss {fmt.num(loss)}" + (f" acc {fmt.pct(acc)}" if classify else "")
        return out + "".join(f" {metric.label(k)} {metric.show(k, v)}" for k, v in extra.items())

    return f"train {part(p.train_loss, p.train_acc, p.train_metrics)}, val {part(p.val_loss, p.val_acc, p.val_metrics)}"


KILLED = "killed"  # a rank's end when the user killed its run (RankState.exited)
KILLED_EXIT = 128 + 2  # a run the user killed: what a shell reports for a command Ctrl-C ended (torchrun: 1)


# A rank's start-up, in order: the phase events it sends before its first step, and what they mean.
EXITING = "exiting"  # a script's body returned (engine/launch/shim.py): no step follows

PHASES = {"rendezvous": "meeting the other ranks", "script": "the script setting up (after its rendezvous)",
          "data": "building the data set",
          "model": "building the model", "resume": "loading the checkpoint",
          "batch": "waiting for the first batch", "steps": "taking the first steps"}


class Thinned:
    """A bounded series that keeps the whole run: when full, every other point goes and new
    points are kept at half the rate, so a long run's curve keeps its shape."""

    def __init__(self, cap: int = STEP_HISTORY):
        self.cap, self.stride, self.n, self.points = cap, 1, 0, []

    def add(self, x, y) -> None:
        self.n += 1
        if (self.n - 1) % self.stride:
            if self.points:
                self.points[-1] = (x, y)  # keep the newest point visible until its slot comes
            return
        self.points.append((x, y))
        if len(self.points) > self.cap:
            self.points = self.points[::2]
            self.stride *= 2

    def copy(self) -> "Thinned":
        c = Thinned(self.cap)
        c.stride, c.n, c.points = self.stride, self.n, list(self.points)
        return c


class Malformed(ValueError):
    pass


_f = fmt.real  # the one number parser (a local name: the reducer runs it on every event)


def _i(v, default: int = 0) -> int:
    if isinstance(v, bool):
        return default
    try:
        return int(v)
    except (TypeError, ValueError, OverflowError):
        return default


def _rank_of(v) -> int:
    """A rank is a whole number; anything else makes the event malformed."""
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        raise Malformed(f"bad rank {v!r}")
    try:
        r = int(v)
    except (TypeError, ValueError, OverflowError):
        raise Malformed(f"bad rank {v!r}") from None
    if r < -1 or r > 1 << 20:
        raise Malformed(f"bad rank {v!r}")
    return r


def _text(v, default: str = "") -> str:
    return default if v is None else str(v)


def _memory(st, ev: dict) -> None:
    """A rank's device_mem_mb and peak_mem_mb from its step event (or an old run's rank_report row)."""
    mem = _f(ev.get("device_mem_mb"))
    if mem is not None:
        st.device_mem_mb = mem
    peak = _f(ev.get("peak_mem_mb"))
    if peak is not None:
        st.peak_mem_mb = max(peak, st.peak_mem_mb or 0.0)
    high = peak if peak is not None else mem  # runs from before peak_mem_mb
    if high is not None:
        st.mem_high_mb = max(high, st.mem_high_mb or 0.0)


def _numbers(v) -> dict:
    """An event's {name: number} (metrics, val_metrics): the names whose values are numbers."""
    if not isinstance(v, dict):
        return {}
    out = {}
    for k, x in v.items():
        x = _f(x)
        if x is not None:
            out[str(k)] = x
    return out


@dataclass
class RunView:
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
    start_step: int = 0  # where a resumed run starts: its checkpoint's step, shown before its first step event
    exit_codes: list | None = None  # per local rank, as the run ended (run_finished, else status.json)
    failed_local_rank: int | None = None  # the index in exit_codes of the rank the root cause names
    _traceback_lines: dict = field(default_factory=dict)  # rank -> lines of its error tracebacks
    _curve_rank: int | None = None
    _finished_event: bool = False

    # ------------------------------------------------------------------ reducing
    def rank(self, r) -> RankState:
        r = _rank_of(r)
        st = self.ranks.get(r)
        if st is None:
            st = self.ranks[r] = RankState(r, total_steps=self.total_steps, step=self.start_step)
        return st

    def _log(self, t, level, rank, text, detail="") -> None:
        line = LogLine(t, level, rank, text, detail, self.log_seq + 1)
        if self.logs and t < self.logs[-1].t:
            bisect.insort_right(self.logs, line, key=lambda ln: ln.t)
            self.log_rewrites += 1
        else:
            self.logs.append(line)
        if len(self.logs) > LOG_LINES:
            del self.logs[:len(self.logs) - LOG_LINES]
        self.log_seq += 1

    def feed(self, ev) -> bool:
        """Fold one event in; False (and counted in `skipped`) for what cannot be used."""
        handler = getattr(self, "_on_" + str(ev.get("kind")), None) if isinstance(ev, dict) else None
        if handler is None:
            self.skipped += 1
            return False
        t = _f(ev.get("t"))
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

    def _on_run_started(self, ev, t) -> None:
        self.run = _text(ev.get("run")) or self.run
        self.strategy = _text(ev.get("strategy")) or self.strategy
        self.world_size = _i(ev.get("world_size"))
        self.num_nodes = _i(ev.get("num_nodes"), 1)
        self.node_rank = _i(ev.get("node_rank"), 0)  # the node whose run directory this is
        gb = ev.get("global_batch")
        self.global_batch = gb if isinstance(gb, int) and not isinstance(gb, bool) else None
        devs = ev.get("devices")
        self.devices = [str(d) for d in devs] if isinstance(devs, list) else []
        self.host = _text(ev.get("host"))
        self.run_kind = _text(ev.get("run_kind"))
        cmd = ev.get("command")
        self.command = [str(c) for c in cmd] if isinstance(cmd, list) else []
        pid = ev.get("pid")
        self.supervisor_pid = pid if isinstance(pid, int) and not isinstance(pid, bool) else None
        self.total_steps = _i(ev.get("total_steps"))
        # the epoch the run ends in: train.epochs, or the earlier one train.max_steps ends it in
        # (end_epoch, engine.preflight.Length; older run directories carry only epochs)
        self.total_epochs = _i(ev.get("end_epoch"), 0) or _i(ev.get("epochs"), 0) or None
        self.started_t = t
        loss = ev.get("loss")
        self.loss_rule = loss if isinstance(loss, str) and loss else self.loss_rule
        for st in self.ranks.values():
            st.total_steps = st.total_steps or self.total_steps
        port = ev.get("master_port")
        kind = kind_of(self)
        batch = f", global batch {self.global_batch or '?'}" if kind.loop_config else ""  # else the script's own
        what = " ".join(self.command) if kind.ranks_from_shim and self.command else self.strategy
        self._log(t, "info", None, f"run started: {what}, world size {self.world_size}{batch}, devices "
                                   f"{fmt.device_list(self.devices) or '?'}" + (f", master port {port}" if port else ""))

    def _on_rank_ready(self, ev, t) -> None:
        st = self.rank(ev.get("rank"))
        st.device = _text(ev.get("device"))
        st.cpus = _text(ev.get("cpus"))
        st.host = _text(ev.get("host")) or st.host
        self._node(st, ev)
        pid = ev.get("pid")
        st.pid = pid if isinstance(pid, int) and not isinstance(pid, bool) else None
        st.from_report = False
        st.last_seen = t

    @staticmethod
    def _node(st: RankState, ev: dict) -> None:
        """The node a rank's event came from (node 0's supervisor tags other nodes' events)."""
        if ev.get("node_rank") is not None:
            st.node_rank = _i(ev.get("node_rank"), st.node_rank or 0)
        if ev.get("host") and not st.host:
            st.host = _text(ev["host"])

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

    def _on_phase(self, ev, t) -> None:
        st = self.rank(ev.get("rank"))
        phase = _text(ev.get("phase"))
        if phase == EXITING:  # not a start-up phase: the script body ended, the process is exiting
            st._exiting = True
            st.last_seen = t if st.last_seen is None else max(st.last_seen, t)
            return
        if phase not in PHASES:
            raise Malformed(f"unknown phase {phase!r}")
        st.phase = phase
        st.last_seen = t if st.last_seen is None else max(st.last_seen, t)
        self.phase_t.setdefault(phase, t)
        at = ev.get("step")  # "batch": the position it trains from (a resumed rank: its checkpoint's)
        if isinstance(at, int) and not isinstance(at, bool) and at > st.step and self.first_step_t is None:
            st.step = at
            st.epoch = epoch_number(ev.get("epoch"), st.epoch)

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
        reported = _i(ev.get("step"), st.step)
        # a rank's step is the highest it reported: a script's torchdeck.log(step=i) counted from 0
        # after the step hook's count from 1 must not take it back (nor the order events are read in)
        st.step = max(st.step, reported)
        # the mean pace is over its stepping time, first step to last: an event sent later (the
        # hook's count at its window's end or the exit, after the rank sat in a failing collective)
        # says when its last step was (step_t), and a step said again does not move its time on
        done_t = _f(ev.get("step_t"))
        done_t = t if done_t is None or done_t > t else done_t
        if st._pace_from is None:
            st._pace_from = (t, reported)
        if st._pace_to is None or reported > st._pace_to[1]:
            st._pace_to = (max(done_t, st._pace_from[0]), reported)
        st.total_steps = _i(ev.get("total_steps")) or st.total_steps or self.total_steps
        loss = _f(ev.get("loss"))
        script_hook = loss is None and "steps_per_s" in ev  # a script's step hook: loss null between log() calls
        st.loss = st.loss if script_hook else loss
        acc = _f(ev.get("accuracy"))
        st.acc = acc if acc is not None else st.acc
        if acc is not None:
            self.has_accuracy = True
        elif loss is not None and self.has_accuracy is None and not kind_of(self).is_script:
            self.has_accuracy = False  # the loop says a batch's accuracy wherever the task has one
        wait_s, comp_s = _f(ev.get("data_wait_s")), _f(ev.get("compute_s"))
        script = "steps_per_s" in ev  # a script's step hook or torchdeck.log
        st._script = st._script or script
        if wait_s is not None and comp_s is not None:
            window = wait_s + comp_s  # the loop's window: its rate is samples / this
        elif script and "samples_per_s" in ev:  # torchdeck.log: its rates are over the time since its last event
            window = None if st._rate_t is None else t - st._rate_t
            st._rate_t = t
        else:
            window = None
        rate = _f(ev.get("samples_per_s"))
        if rate is not None or not script:  # the hook's null: the last log() rate stands
            st.add_rate(rate or 0.0, window)
        sps = _f(ev.get("steps_per_s"))
        st.steps_per_s = sps if sps is not None else st.steps_per_s
        tok = _f(ev.get("tokens_per_s"))
        if tok is not None:
            st.add_tokens(tok, window)
        mfu = _f(ev.get("mfu"))
        st.mfu = mfu if mfu is not None else st.mfu
        metrics = _numbers(ev.get("metrics"))
        if metrics:
            st.metrics = {**st.metrics, **metrics}  # a new dict: a snapshot keeps the one it copied
        _memory(st, ev)  # the loop's step events carry each rank's memory (issue 31; before: rank_report)
        wait, comp = wait_s or 0.0, comp_s or 0.0
        st.data_wait = wait / (wait + comp) if wait + comp > 0 else None
        if wait_s is not None and comp_s is not None:  # a window it timed
            st.add_window(st.step, wait_s + comp_s, wait_s)
        comm = _f(ev.get("comm_s"))
        st.comm_wait = min(1.0, max(0.0, comm / (wait + comp))) if comm is not None and wait + comp > 0 else None
        self._window(st, t, bool(ev.get("pause")))  # before _seen moves _step_t on
        self._seen(st, t)
        self._stepping(t, st.step)
        if self._curve_rank is None or st.rank < self._curve_rank:
            self._curve_rank = st.rank  # the lowest rank's loss is the curve
        if st.rank == self._curve_rank and st.loss is not None and not script_hook:  # a point per loss said
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

    def _on_epoch_end(self, ev, t) -> None:
        r = _rank_of(ev.get("rank", -1) if ev.get("rank") is not None else -1)
        epoch = epoch_number(ev.get("epoch"), 1)
        st = self.rank(r)
        st.epoch = max(st.epoch, epoch)
        st.last_seen = t if st.last_seen is None else max(st.last_seen, t)
        val_acc = _f(ev.get("val_acc"))
        if val_acc is not None:
            st.val_acc = val_acc
        have = self.epochs.get(epoch)
        if have is None or r == 0:
            p = self.epochs[epoch] = EpochPoint(epoch, _i(ev.get("step")), _f(ev.get("train_loss")),
                                                _f(ev.get("train_acc")), _f(ev.get("val_loss")), val_acc,
                                                t, r, _numbers(ev.get("val_metrics")), _numbers(ev.get("train_metrics")))
            self._best(p)
            self.curve_version += 1
            if have is None:
                of = f"/{self.total_epochs}" if self.total_epochs else ""
                self._log(t, "info", None, f"epoch {epoch}{of} done at step {p.step}: {epoch_text(p)}")

    def _best(self, p: EpochPoint) -> None:
        if p.val_acc is not None or p.train_acc is not None:
            self.has_accuracy = True
        if p.val_acc is not None and (self.best_val_acc is None or p.val_acc > self.best_val_acc):
            self.best_val_acc = p.val_acc
        if p.val_loss is not None and (self.best_val_loss is None or p.val_loss < self.best_val_loss):
            self.best_val_loss = p.val_loss

    def _on_checkpoint(self, ev, t) -> None:
        self._log(t, "info", ev.get("rank") if ev.get("rank") is None else _rank_of(ev.get("rank")),
                  f"checkpoint saved: {_text(ev.get('path'), '?')} (step {_text(ev.get('step'), '?')})")

    def _on_log(self, ev, t) -> None:
        level = _text(ev.get("level"), "info")
        msg = _text(ev.get("message"))
        rank = None if ev.get("rank") is None else _rank_of(ev.get("rank"))
        if rank is None and msg.startswith("stop requested"):
            self.stop_requested = True
        if msg.startswith("loss: ") and rank in (0, None) and level == "info":
            self.loss_rule = msg[6:].strip()  # the loss the run decided on (rank 0 says it once)
        self._log(t, level, rank, msg)

    def _on_error(self, ev, t) -> None:
        rank = None if ev.get("rank") is None else _rank_of(ev.get("rank"))
        text = (f"rank {rank} on {_text(ev.get('host')) or '?'} (pid {_text(ev.get('pid')) or '?'}): "
                f"{_text(ev.get('exception')) or 'Error'}: {_text(ev.get('message'))}")
        detail = _text(ev.get("traceback")).rstrip()
        self._traceback_lines.setdefault(rank, set()).update(ln.rstrip() for ln in detail.splitlines())
        self._log(t, "error", rank, text, detail)
        self.errors.append(next(ln for ln in reversed(self.logs) if ln.seq == self.log_seq))
        if rank is not None:
            st = self.rank(rank)
            st.last_seen = t if st.last_seen is None else max(st.last_seen, t)

    def _on_rank_exited(self, ev, t) -> None:
        st = self.rank(ev.get("rank"))
        sig = ev.get("signal")
        st.exited = f"signal {sig}" if sig else f"exit {_text(ev.get('exitcode'), '?')}"
        if st.failed_exit:
            self._log(t, "warning", st.rank, f"rank {st.rank} ended: {st.exited}")

    def _on_run_finished(self, ev, t) -> None:
        self.status = Status.of_final(ev.get("status"))
        self.root_cause = None if ev.get("root_cause") is None else _text(ev.get("root_cause"))
        self.finished_t = t
        self._finished_event = True
        self._codes(ev)
        self._settle()
        elapsed = _f(ev.get("elapsed_s"))
        if elapsed is not None and elapsed >= 0:
            self.elapsed_s = elapsed  # the run's own figure: every front end shows this one
        if self.started_t is None and elapsed is not None:
            self.started_t = t - elapsed
        text = f"run {self.status}" + (f": {self.root_cause}" if self.root_cause else "")
        self._log(t, "error" if self.status == Status.FAILED else "info", None, text)

    def _on_stacks(self, ev, t) -> None:
        """Where the ranks were when the supervisor looked (a rank went silent, a collective timed out)."""
        groups = ev.get("groups")
        if not isinstance(groups, list):
            raise Malformed("stacks without groups")
        groups = [g for g in groups if isinstance(g, dict)]
        summary = _text(ev.get("summary")) or " | ".join(f"{_text(g.get('who'))}: {_text(g.get('where'))}"
                                                          for g in groups)
        reason = _text(ev.get("reason"), "asked")
        self.stacks = {"t": t, "reason": reason, "summary": summary, "groups": groups}
        self._log(t, "warning", None, f"stacks ({reason}): {summary}")

    def _on_rank_report(self, ev, t) -> None:
        """Rank 0's periodic summary of every rank: the only news of ranks on other nodes."""
        reports = ev.get("reports")
        if not isinstance(reports, list):
            raise Malformed("rank_report without reports")
        for rep in reports:
            if not isinstance(rep, dict) or rep.get("rank") is None:
                continue
            st = self.rank(rep.get("rank"))
            rt = _f(rep.get("t")) or t
            _memory(st, rep)
            if rep.get("node_rank") is not None:
                st.node_rank = _i(rep.get("node_rank"))
            if rep.get("host") and not st.host:
                st.host = _text(rep["host"])
            if st.last_seen is not None and not st.from_report:
                continue  # a rank of this node: its own events say more, and sooner
            st.from_report = True
            st.epoch = epoch_number(rep.get("epoch"), st.epoch)
            st.step = _i(rep.get("step"), st.step)
            st.total_steps = st.total_steps or self.total_steps
            st.add_rate(_f(rep.get("samples_per_s")) or 0.0)
            tok = _f(rep.get("tokens_per_s"))
            if tok is not None:
                st.add_tokens(tok)
            wait = _f(rep.get("data_wait"))
            if wait is not None:
                st.data_wait = wait if 0.0 <= wait <= 1.0 else None
            comm = _f(rep.get("comm_wait"))
            st.comm_wait = comm if comm is not None and 0.0 <= comm <= 1.0 else None
            self._seen(st, rt)
            self._stepping(rt, st.step)

    def _on_node_sample(self, ev, t) -> None:
        """A node's GPUs and host, once a second (node 0's supervisor writes every node's)."""
        gpus, node = ev.get("gpus"), ev.get("node_rank")
        if isinstance(node, bool) or not isinstance(node, int) or node < 0 or not isinstance(gpus, list):
            raise Malformed("node_sample without a node_rank or its gpus")
        stats = ev.get("host_stats")
        self.fleet.add(node, _text(ev.get("host")), gpus, stats if isinstance(stats, dict) else None, t)

    def add_history(self, evs, upto_step: int, source: str) -> None:
        """The curves of the run this one resumed (steps up to its checkpoint), so a resumed run's
        loss and accuracy continue where they left off, and its ranks start at that step (the last
        call's: the run it continues directly). Nothing else of that run comes along."""
        self.start_step = max(0, _i(upto_step))
        for st in self.ranks.values():
            st.step = max(st.step, self.start_step)
        n = 0
        for ev in evs:
            if not isinstance(ev, dict):
                continue
            kind = ev.get("kind")
            try:
                if kind == "step" and ev.get("rank") == 0 and _i(ev.get("step"), upto_step + 1) <= upto_step:
                    loss, acc = _f(ev.get("loss")), _f(ev.get("accuracy"))
                    if loss is not None:
                        self.steps.add(_i(ev.get("step")), loss)
                        if self.step_t is not None:
                            self.step_t.add(_i(ev.get("step")), (_f(ev.get("t")), 0))
                        n += 1
                    if acc is not None:
                        self.step_acc.add(_i(ev.get("step")), acc)
                elif kind == "epoch_end" and ev.get("rank") in (0, None) and _i(ev.get("step"), upto_step + 1) <= upto_step:
                    epoch = epoch_number(ev.get("epoch"), 1)
                    p = self.epochs.setdefault(epoch, EpochPoint(
                        epoch, _i(ev.get("step")), _f(ev.get("train_loss")), _f(ev.get("train_acc")),
                        _f(ev.get("val_loss")), _f(ev.get("val_acc")), val_metrics=_numbers(ev.get("val_metrics")),
                        train_metrics=_numbers(ev.get("train_metrics"))))
                    self._best(p)
            except (TypeError, ValueError, OverflowError):
                continue
        if n:
            self._curve_rank = 0
            self.curve_version += 1
            self.version += 1

    # ------------------------------------------------------------------ news from the follower
    def add_output(self, rank: int | None, text: str, t: float | None = None) -> None:
        """A line a worker (or the supervisor) printed to its log file. The traceback a failing
        rank prints there is already shown with its error event: not a second time."""
        if text.strip() and text.rstrip() in self._traceback_lines.get(rank, ()):
            return
        if rank is None and any(ln.text == text.strip() for ln in self.logs[-20:]):
            return  # the supervisor's log repeats what its events said ("run finished")
        self._log(t or self.last_t or time.time(), "output", rank, text)
        self.version += 1

    def observe(self, final: dict | None, alive: bool, has_pid: bool, quiet_s: float | None, now: float) -> None:
        """What the run directory says about the run's processes (status.json, pid files), for a
        run whose events have not said how it ended. A run_finished event has the last word: the
        follower reads the events again after it sees status.json (written after the event)."""
        if self._finished_event or self.status in FINAL:
            return
        stepped = self.first_step_t is not None
        st = decide(final.get("status") if final else None, alive, has_pid, stepped, quiet_s)
        if st == Status.LOST:
            self.status = Status.LOST
            self.root_cause = self.root_cause or (
                "the supervisor exited without a final status (killed, or its host went down); see supervisor.log"
                if has_pid else "no supervisor pid and no final status: it never started, or ran outside "
                                "torchdeck's supervisor")
            self.finished_t = self.finished_t or self.last_t or now
            self._log(self.finished_t, "error", None, f"run lost: {self.root_cause}")
            self._settle()
            self.version += 1
        elif st.final and final is not None:
            self.status = st
            elapsed = _f(final.get("elapsed_s"))
            self.elapsed_s = elapsed if elapsed is not None and elapsed >= 0 else self.elapsed_s
            rc = final.get("root_cause")
            self.root_cause = self.root_cause or (None if rc is None else str(rc))
            self._codes(final)
            self.finished_t = self.finished_t or self.last_t or now
            self._settle()
            self.version += 1

    def _codes(self, final: dict) -> None:
        codes = final.get("exit_codes")
        if isinstance(codes, list):
            self.exit_codes = [c if isinstance(c, int) and not isinstance(c, bool) else None for c in codes]
        first = final.get("failed_local_rank")
        if isinstance(first, int) and not isinstance(first, bool):
            self.failed_local_rank = first
        if final.get("killed") is True:
            self.killed = True
            for st in self.ranks.values():  # SIGKILLed with their supervisor: no exit of theirs is recorded,
                if st.exited is None:  # and a rank still "running" kept its seen age counting up
                    st.exited = KILLED

    def _settle(self) -> None:
        """Over: every front end's rank lines show each rank's mean over the run (RankState.settle)."""
        for st in self.ranks.values():
            st.settle()

    # ------------------------------------------------------------------ derived
    def exit_code(self) -> int | None:
        """A script run's exit code as torchdeck launch exits with it (cli.main.script_exit_code's
        rule): 0 when it ended well, else the first failing rank's code (failed_local_rank's, else
        the first non-zero), a signal's death as a shell says it (128 + N), 1 when no code says
        more; KILLED_EXIT (130) when the user killed it; None while it runs."""
        if not self.final:
            return None
        if self.killed:
            return KILLED_EXIT
        if self.status.ended_well:
            return 0
        codes = [c for c in self.exit_codes or [] if c is not None]
        first = self.failed_local_rank
        if first is not None and 0 <= first < len(self.exit_codes or []) and self.exit_codes[first] is not None:
            codes.insert(0, self.exit_codes[first])
        for code in codes:
            if code > 0:
                return code if code < 256 else 1
            if code < 0:
                return 128 + (-code)
        return 1

    @property
    def final(self) -> bool:
        return self.status in FINAL

    def rank_list(self) -> list[RankState]:
        return [self.ranks[k] for k in sorted(self.ranks) if k >= 0]

    def elapsed(self, now: float) -> float | None:
        """Seconds the run has been going; once over, the duration it recorded itself (the one
        `torchdeck runs` and the Runs list show from status.json)."""
        if self.final and self.elapsed_s is not None:
            return self.elapsed_s
        if self.started_t is None:
            return None
        return max(0.0, (self.finished_t or now) - self.started_t)

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

    def stale_after(self, st: RankState) -> float:
        return max(STALE_MIN_S, STALE_INTERVALS * (st.interval or 0.0))

    def is_stale(self, st: RankState, now: float) -> bool:
        """No news of a rank for longer than it normally takes, while the run should be busy."""
        if self.status != Status.RUNNING or st.exited is not None or st.last_seen is None:
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

    def global_samples_per_s(self, now: float | None = None) -> float:
        """The ranks' latest rates added up; 0 once over, and 0 while a rank is stale (the others
        wait for it in the next collective, whatever their last figure said)."""
        if self.final or (now is not None and self.stale_ranks(now)):
            return 0.0
        return sum(r.samples_per_s for r in self.rank_list() if r.exited is None)

    def mean_samples_per_s(self) -> float:
        """The whole run's training rate: each rank's mean over its step windows, added up
        (evaluation and checkpoints are not in the windows' rates)."""
        return sum(r.mean_samples_per_s for r in self.rank_list() if not self.ended_badly(r))

    def script_pace(self, now: float | None = None) -> float | None:
        """A script run's pace: the slowest rank's optimizer steps/s (the ranks of one job meet in
        each collective); while it runs its latest window's, None while a rank is stale (the others
        wait for it); once over, its mean over the run (RankState.settle). None before a window."""
        ranks = [r for r in self.rank_list() if not self.ended_badly(r) and (r.exited is None or self.final)]
        rates = [r.steps_per_s for r in ranks if r.steps_per_s is not None]
        if not rates or (not self.final and now is not None and self.stale_ranks(now)):
            return None
        return min(rates)

    def script_balance(self) -> dict | None:
        """A script run's rank balance from its ranks' optimizer steps/s (the step hook's): None
        where no rank timed a step (a hang before its first window, a legacy run: nothing to say);
        `enough` only once every compared rank has done BALANCE_MIN_STEPS steps, the least that
        says one is behind (a 6-step run's ranks, stepping together, read 13% apart)."""
        ranks = [r for r in self.rank_list() if not self.ended_badly(r) and r.steps_per_s]  # a stop's SIGTERM counts
        if not ranks:
            return None
        out = {"timing": len(ranks), "world": self.world_size or len(self.rank_list())}
        if len(ranks) >= 2:
            slow, fast = min(ranks, key=lambda r: r.steps_per_s), max(ranks, key=lambda r: r.steps_per_s)
            out.update(slow=slow, fast=fast, gap=100 * (1 - slow.steps_per_s / fast.steps_per_s),
                       enough=min(r.step for r in ranks) >= BALANCE_MIN_STEPS)
        return out

    def script_pace_text(self, now: float | None = None, number=fmt.steps_rate) -> str:
        """script_pace in words, for `torchdeck launch`/`attach` and the Monitor's header (number:
        the front end's way of writing it, `3.4` in the CLI's narrow lines)."""
        pace = self.script_pace(now)
        return f"{'mean ' if self.final and pace is not None else ''}{number(pace)} steps/s"

    def rate_text(self, now: float | None = None) -> str:
        """The headers' rate: the ranks' latest while it trains, the run's mean once it is over
        (a finished run's header said `0 samples/s`)."""
        mean = self.mean_samples_per_s() if self.final else 0.0
        if mean > 0:
            return f"mean {fmt.rate(mean)} samples/s"
        return f"{fmt.rate(self.global_samples_per_s(now))} samples/s"

    def startup(self, now: float) -> str | None:
        """What a starting run is doing, for the headers; None once it trains (or is over)."""
        if self.status != Status.STARTING:
            return None
        if self.started_t is None:
            return "starting the supervisor"
        ranks = [r for r in self.rank_list() if not r.from_report]
        moving = [r for r in ranks if r.phase]
        if not moving:
            return f"ranks importing torch ({now - self.started_t:.0f} s)"
        order = list(PHASES)
        behind = min(moving, key=lambda r: order.index(r.phase)).phase
        n = sum(r.phase == behind for r in moving)
        world = self.world_size or len(ranks)
        since = self.phase_t.get(behind, now)
        what = PHASES[behind]
        if behind == "rendezvous" and (self.num_nodes or 1) > 1:  # the wait a missing node makes
            what = f"waiting for all {self.num_nodes} nodes to meet"
        return f"{what} ({n}/{world} rank{'s' if world != 1 else ''}, {max(0.0, now - since):.0f} s)"

    def startup_breakdown(self) -> list[tuple[str, float]]:
        """Seconds from the supervisor's start to the first step, by phase (the first rank to enter
        each): where a short run's time goes before it trains."""
        if self.started_t is None:
            return []
        n = self.first_step
        first = kind_of(self).first_phase
        marks = [(first, self.started_t)] + [
            (name, self.phase_t[p]) for p, name in (("rendezvous", "rendezvous"), ("script", "script set-up"),
                                                    ("data", "data"),
                                                    ("model", "model"), ("resume", "checkpoint"),
                                                    ("batch", "first batch"),
                                                    ("steps", f"steps 1-{n}" if n > 1 else "step 1"),
                                                    ("step", "first step")) if p in self.phase_t]
        out = []
        for (what, t0), (_, t1) in zip(marks, marks[1:]):
            out.append((what, max(0.0, t1 - t0)))
        return out

    def latest(self, name: str) -> float | None:
        """The newest epoch's value of a metric: val_acc, val_loss, perplexity, a loss callable's own."""
        for k in sorted(self.epochs, reverse=True):
            v = metric.point_value(self.epochs[k], name)
            if v is not None:
                return v
        return None

    def latest_val_acc(self) -> float | None:
        return self.latest(metric.ACC)

    def main_metric(self) -> str | None:
        """The run's main validation metric (engine.runs.metric.main_of, the one rule): val_acc for
        classification, else val_loss; None before its first evaluation."""
        return metric.main_of(self.epochs.values())

    def main(self) -> tuple[str, float, float | None] | None:
        """(main metric, its newest value, its best where better than the newest) or None."""
        name = self.main_metric()
        value = None if name is None else self.latest(name)
        if value is None:
            return None
        if name == metric.ACC:
            best = self.best_val_acc if self.best_val_acc is not None and self.best_val_acc > value + 1e-9 else None
        else:
            best = self.best_val_loss if self.best_val_loss is not None and self.best_val_loss < value - 1e-9 else None
        return name, value, best

    def main_text(self) -> str:
        """The main metric in words: 'val acc 93.4% (best 95.0%)', 'val loss 1.6021 (best 1.5900)'
        with the perplexity where the run reports one; "" before its first evaluation."""
        m = self.main()
        if m is None:
            return ""
        name, value, best = m
        out = f"{metric.label(name)} {metric.show(name, value)}" + (f" (best {metric.show(name, best)})" if best is not None else "")
        ppl = self.latest("perplexity") if name == metric.LOSS else None
        return out + (f", perplexity {metric.show('perplexity', ppl)}" if ppl is not None else "")

    def reached(self, target) -> float | None:
        """Seconds from the run's start to the first epoch end (rank 0's or the supervisor's) whose
        metric meets `target` (a metric.Target, its text `val_loss<=1.6`, or a validation accuracy
        as a number); None if none does, or the start is unknown."""
        target = metric.parse_target(target)
        if self.started_t is None:
            return None
        for k in sorted(self.epochs):
            p = self.epochs[k]
            if p.rank in (0, -1) and p.t is not None and target.met(metric.point_value(p, target.name)):
                return max(0.0, p.t - self.started_t)
        return None

    def tokens_per_s(self, now: float | None = None) -> float | None:
        """The ranks' tokens/s added up while it trains (their means once it is over); None where
        no rank counts tokens (batches without token ids)."""
        ranks = [r for r in self.rank_list() if r.tokens_per_s is not None]
        if not ranks:
            return None
        if self.final:
            return sum(r.mean_tokens_per_s for r in ranks if not self.ended_badly(r))
        if now is not None and self.stale_ranks(now):
            return 0.0
        return sum(r.tokens_per_s for r in ranks if r.exited is None)

    def mfu(self) -> float | None:
        """The ranks' model FLOPs utilization, averaged (each rank is one GPU); None where the run
        does not report it (not compiled, on the CPU, a GPU or model the table does not know)."""
        vals = [r.mfu for r in self.rank_list() if r.mfu is not None and not self.ended_badly(r)]
        return sum(vals) / len(vals) if vals else None

    def metrics_now(self) -> dict:
        """The extra metrics the curve's rank sent last ({name: value}), for the headers."""
        st = self.ranks.get(self._curve_rank) if self._curve_rank is not None else None
        return dict(st.metrics) if st is not None else {}

    def metrics_text(self, n: int = 4) -> str:
        """metrics_now in words, saying whose they are: `rank 0 last: mae 0.31  lr 0.01` (one
        rank's newest batch or log() call, not an average over the ranks or the epoch)."""
        extra = self.metrics_now()
        if not extra:
            return ""
        said = "  ".join(f"{metric.label(k)} {fmt.num(v, '.4g')}" for k, v in list(extra.items())[:n])
        return f"rank {self._curve_rank} last: {said}"

    def ended_badly(self, st: RankState) -> bool:
        """A rank that ended on its own with an error or a signal; not one the user's stop ended
        (SIGTERM, then SIGKILL, is how a stop ends a script's ranks): its figures still count."""
        if not st.failed_exit:
            return False
        return not (self.status == Status.STOPPED and st.exited in ("signal SIGTERM", "signal SIGKILL", KILLED))

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

    def rank_spread(self) -> tuple[RankState, RankState] | None:
        """(slowest, fastest) rank by samples/s (their last figures, once the run is over)."""
        live = [r for r in self.rank_list() if not self.ended_badly(r) and r.samples_per_s > 0
                and (r.exited is None or self.final)]
        if len(live) < 2:
            return None
        return min(live, key=lambda r: r.samples_per_s), max(live, key=lambda r: r.samples_per_s)

    BALANCED = 0.10  # ranks whose all-reduce waits differ by less than this share are even

    def balance(self) -> dict | None:
        """Where the time goes, and which rank holds the others back. The gradient all-reduce evens
        the ranks out, so the slow one is not the one with the lowest rate: it is the one the
        others wait for, the rank that waits least in the all-reduce. Its dominant cause is data
        (waiting for batches) or compute. None until two ranks report their all-reduce time."""
        ranks = [r for r in self.rank_list() if not self.ended_badly(r) and r.comm_wait is not None
                 and r.data_wait is not None and (r.exited is None or self.final)]
        if len(ranks) < 2:
            return None
        slow = min(ranks, key=lambda r: (r.comm_wait, -r.data_wait))
        waiter = max(ranks, key=lambda r: r.comm_wait)
        data, comm = slow.data_wait, slow.comm_wait
        compute = max(0.0, 1.0 - data - comm)
        return {"rank": slow.rank, "cause": "data" if data >= compute else "compute", "data": data,
                "compute": compute, "comm": comm, "waiter": waiter.rank, "waits": waiter.comm_wait,
                "even": waiter.comm_wait - slow.comm_wait < self.BALANCED}

    def balance_line(self) -> str | None:
        """One line for both front ends; None when the ranks do not measure their all-reduce."""
        b = self.balance()
        if b is None:
            return None
        split = f"data {b['data']:.0%}, compute {b['compute']:.0%}, all-reduce {b['comm']:.0%}"
        many = multi_node(self)  # across nodes: which node the rank is on

        def who(r: int) -> str:
            return f"rank {r} (node {node_of(self.ranks[r])})" if many else f"rank {r}"

        if b["even"]:
            return f"rank balance: even ({who(b['rank'])}: {split})"
        return (f"{who(b['rank'])} holds the others back: mostly {b['cause']} ({split}); "
                f"{who(b['waiter'])} waits {b['waits']:.0%} of its time in the all-reduce")

    def rank_pids(self) -> dict:
        """pid -> rank for the run's processes (the supervisor as None), for the host and GPU panes."""
        out = {}
        if self.supervisor_pid:
            out[self.supervisor_pid] = None
        for st in self.rank_list():
            # another node's pid names some other process here: only this node's ranks
            mine = st.node_rank is None or st.node_rank == self.node_rank
            if st.pid and not st.from_report and mine:
                out[st.pid] = st.rank
        return out

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
        snap.step_metrics = {k: v.copy() for k, v in self.step_metrics.items()}
        return snap
