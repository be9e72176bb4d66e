"""What the run view is made of: a rank's state, a log line, an epoch's figures, a thinned curve,
and the rules' thresholds (the reducers in this package fill them; the front ends read them)."""
from __future__ import annotations

from dataclasses import dataclass, field

from ... import fmt
from .. import metric

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
NODE_LOST = "node lost"  # a rank's end when node 0 lost its node (a node_lost event): its exit is never known
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


