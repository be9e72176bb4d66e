"""Headless progress display for `torchdeck run` and `torchdeck attach` (no textual).

`RunView` reduces the event stream to per-rank state; `Display` prints it. On a terminal the
rank block is redrawn in place (ANSI, at most ~4 times a second); in a pipe or CI log a plain
status line is printed every few seconds, so logs stay readable. Errors, warnings and epoch
ends are printed as they come in both cases.
"""
from __future__ import annotations

import statistics
import sys
import time
from dataclasses import dataclass, field

COMPACT_ABOVE = 8  # ranks; beyond this one line per rank is too much to read


@dataclass
class RankState:
    rank: int
    device: str = "?"
    host: str = ""
    pid: int | None = None
    epoch: int = 0
    step: int = 0
    total_steps: int = 0
    loss: float | None = None
    samples_per_s: float = 0.0
    data_wait_s: float = 0.0
    compute_s: float = 0.0
    val_acc: float | None = None
    exited: str | None = None  # "exit 0", "signal SIGKILL", ...
    last_t: float = 0.0
    node_rank: int | None = None
    from_report: bool = False  # known only through rank 0's rank_report (a rank on another node)

    @property
    def data_wait_pct(self) -> float:
        busy = self.data_wait_s + self.compute_s
        return 100.0 * self.data_wait_s / busy if busy > 0 else 0.0


def fmt_duration(s: float | None, missing: str = "--:--", pad_minutes: bool = True) -> str:
    """h:mm:ss or mm:ss; shared with the app's Monitor and Runs list (no torch here)."""
    if s is None or s != s or s < 0:
        return missing
    s = int(s)
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    if h:
        return f"{h}:{m:02d}:{sec:02d}"
    return f"{m:02d}:{sec:02d}" if pad_minutes else f"{m}:{sec:02d}"


def _bar(done: int, total: int, width: int = 20) -> str:
    if total <= 0:
        return "[" + "?" * width + "]"
    filled = min(width, int(width * done / total))
    return "[" + "#" * filled + "." * (width - filled) + "]"


def _num(v, spec: str = ".4f") -> str:
    return "-" if v is None else format(v, spec)


@dataclass
class RunView:
    """Everything the display needs, built from events alone (so attach can replay history)."""

    strategy: str = "?"
    world_size: int = 0
    total_steps: int = 0
    status: str = "starting"
    started_t: float | None = None
    first_step_t: float | None = None
    first_step: int = 0
    finished_t: float | None = None
    root_cause: str | None = None
    errors: list = field(default_factory=list)
    ranks: dict = field(default_factory=dict)
    last_val_acc: float | None = None
    last_val_loss: float | None = None
    epochs_done: int = 0

    def _rank(self, r) -> RankState:
        r = int(r) if r is not None else -1
        if r not in self.ranks:
            self.ranks[r] = RankState(r, total_steps=self.total_steps)
        return self.ranks[r]

    def feed(self, ev: dict) -> list[str]:
        """Update state; return lines worth printing on their own (errors, logs, epoch ends)."""
        kind = ev.get("kind")
        t = ev.get("t") or time.time()
        out: list[str] = []
        if kind == "run_started":
            self.strategy = ev.get("strategy", self.strategy)
            self.world_size = int(ev.get("world_size") or 0)
            self.total_steps = int(ev.get("total_steps") or 0)
            self.started_t = t
            self.status = "running"
            for st in self.ranks.values():
                st.total_steps = st.total_steps or self.total_steps
            port = ev.get("master_port")
            out.append(f"run started: {self.strategy}, world size {self.world_size}, global batch "
                       f"{ev.get('global_batch', '?')}, devices {ev.get('devices', '?')}"
                       + (f", master port {port}" if port else ""))
        elif kind == "rank_ready":
            st = self._rank(ev.get("rank"))
            st.device, st.host, st.pid = ev.get("device", "?"), ev.get("host", ""), ev.get("pid")
            st.last_t = t
        elif kind == "step":
            st = self._rank(ev.get("rank"))
            st.epoch = ev.get("epoch", st.epoch)
            st.step = int(ev.get("step") or 0)
            st.total_steps = int(ev.get("total_steps") or st.total_steps or self.total_steps)
            st.loss = ev.get("loss")
            st.samples_per_s = float(ev.get("samples_per_s") or 0.0)
            st.data_wait_s = float(ev.get("data_wait_s") or 0.0)
            st.compute_s = float(ev.get("compute_s") or 0.0)
            st.last_t = t
            if self.first_step_t is None:
                self.first_step_t, self.first_step = t, st.step
            if self.status == "starting":
                self.status = "running"
        elif kind == "epoch_end":
            st = self._rank(ev.get("rank"))
            st.val_acc = ev.get("val_acc")
            st.epoch = ev.get("epoch", st.epoch)
            if ev.get("rank") in (0, None):
                self.epochs_done = int(ev.get("epoch", 0)) + 1
                self.last_val_acc, self.last_val_loss = ev.get("val_acc"), ev.get("val_loss")
                out.append(
                    f"epoch {ev.get('epoch')} done at step {ev.get('step')}: train loss "
                    f"{_num(ev.get('train_loss'))} acc {_pct(ev.get('train_acc'))}, val loss "
                    f"{_num(ev.get('val_loss'))} acc {_pct(ev.get('val_acc'))}")
        elif kind == "checkpoint":
            if ev.get("rank") in (0, None):
                out.append(f"checkpoint saved: {ev.get('path')} (step {ev.get('step')})")
        elif kind == "log":
            level = ev.get("level", "info")
            who = "supervisor" if ev.get("rank") is None else f"rank {ev.get('rank')}"
            out.append(f"[{level}] {who}: {ev.get('message', '')}")
        elif kind == "error":
            self.errors.append(ev)
            out.append(f"[error] rank {ev.get('rank')} on {ev.get('host', '?')} (pid {ev.get('pid', '?')}): "
                       f"{ev.get('exception', 'Error')}: {ev.get('message', '')}")
        elif kind == "rank_report":
            self._report(ev, t)
        elif kind == "rank_exited":
            st = self._rank(ev.get("rank"))
            sig = ev.get("signal")
            st.exited = f"signal {sig}" if sig else f"exit {ev.get('exitcode')}"
        elif kind == "run_finished":
            self.status = ev.get("status", "failed")
            self.root_cause = ev.get("root_cause")
            self.finished_t = t
        return out

    def _report(self, ev: dict, t: float) -> None:
        """Rank 0's periodic summary of every rank: on node 0 the only news of other nodes' ranks.
        A rank whose own step events arrive here keeps those (they say more, and sooner)."""
        for rep in ev.get("reports") or []:
            if not isinstance(rep, dict) or rep.get("rank") is None:
                continue
            st = self._rank(rep.get("rank"))
            if rep.get("host") and not st.host:
                st.host = rep["host"]
            if rep.get("node_rank") is not None:
                st.node_rank = int(rep["node_rank"])
            if st.last_t and not st.from_report:
                continue
            st.from_report = True
            st.epoch = int(rep.get("epoch") or 0)
            st.step = int(rep.get("step") or 0)
            st.total_steps = st.total_steps or self.total_steps
            st.samples_per_s = float(rep.get("samples_per_s") or 0.0)
            wait = min(1.0, max(0.0, float(rep.get("data_wait") or 0.0)))  # a fraction of the window
            st.data_wait_s, st.compute_s = wait, 1.0 - wait
            st.last_t = float(rep.get("t") or t)
            if st.device == "?" and st.node_rank is not None:
                st.device = f"node {st.node_rank}"

    # ------------------------------------------------------------------ derived
    def elapsed(self, now: float | None = None) -> float | None:
        if self.started_t is None:
            return None
        return (self.finished_t or now or time.time()) - self.started_t

    def eta(self, now: float | None = None) -> float | None:
        steps = [r for r in self.ranks.values() if r.rank >= 0 and r.total_steps]
        if not steps or self.first_step_t is None or self.finished_t is not None:
            return None
        slowest = min(steps, key=lambda r: r.step)
        done = slowest.step - self.first_step
        spent = (now or time.time()) - self.first_step_t
        if done <= 0 or spent <= 0:
            return None
        return (slowest.total_steps - slowest.step) * spent / done

    def global_samples_per_s(self) -> float:
        return sum(r.samples_per_s for r in self.ranks.values() if r.rank >= 0 and not r.exited)

    def header(self, now: float | None = None) -> str:
        return (f"{self.strategy} | world {self.world_size} | elapsed {fmt_duration(self.elapsed(now))} | "
                f"ETA {fmt_duration(self.eta(now))} | {self.global_samples_per_s():,.0f} samples/s | "
                f"{self.status}")

    def rank_lines(self) -> list[str]:
        ranks = [self.ranks[k] for k in sorted(self.ranks) if k >= 0]
        if len(ranks) > COMPACT_ABOVE:
            return self._compact(ranks)
        return [self._rank_line(r) for r in ranks]

    @staticmethod
    def _rank_line(r: RankState) -> str:
        tail = f"  ({r.exited})" if r.exited and r.exited != "exit 0" else ""
        return (f"rank {r.rank:>3} {r.device:<8} ep {r.epoch:>2} {_bar(r.step, r.total_steps)} "
                f"{r.step:>6}/{r.total_steps or '?':<6} loss {_num(r.loss)} "
                f"{r.samples_per_s:>8,.0f} samples/s  data wait {r.data_wait_pct:4.1f}%{tail}")

    @staticmethod
    def _compact(ranks: list[RankState]) -> list[str]:
        sps = [r.samples_per_s for r in ranks]
        slow = min(ranks, key=lambda r: (r.samples_per_s, r.step))
        steps = [r.step for r in ranks]
        total = max((r.total_steps for r in ranks), default=0)
        losses = [r.loss for r in ranks if r.loss is not None]
        dead = [str(r.rank) for r in ranks if r.exited and r.exited != "exit 0"]
        lines = [
            f"{len(ranks)} ranks  steps {min(steps)}-{max(steps)}/{total or '?'} {_bar(min(steps), total)}  "
            f"mean loss {_num(statistics.fmean(losses) if losses else None)}",
            f"samples/s per rank: min {min(sps):,.0f}  median {statistics.median(sps):,.0f}  "
            f"max {max(sps):,.0f}  slowest rank {slow.rank} ({slow.device}, data wait {slow.data_wait_pct:.1f}%)",
        ]
        if dead:
            lines.append(f"ranks exited abnormally: {', '.join(dead)}")
        return lines

    def summary(self) -> list[str]:
        """Final lines: status, accuracy, and for a failure the root cause with its traceback tail."""
        lines = [f"run {self.status} after {fmt_duration(self.elapsed())}"
                 + (f"; val accuracy {_pct(self.last_val_acc)}" if self.last_val_acc is not None else "")]
        if self.status == "failed":
            lines.append(f"root cause: {self.root_cause or 'unknown (see the rank logs)'}")
            if self.errors:
                e = self.errors[0]
                lines.append(f"  rank {e.get('rank')} on host {e.get('host', '?')} (pid {e.get('pid', '?')}): "
                             f"{e.get('exception', 'Error')}: {e.get('message', '')}")
                tb = [ln for ln in str(e.get("traceback") or "").rstrip().splitlines()]
                for ln in tb[-8:]:
                    lines.append("    " + ln)
        return lines


def _pct(v) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


class Display:
    """Prints a RunView: redrawn in place on a TTY, periodic plain lines otherwise."""

    def __init__(self, stream=None, tty: bool | None = None, interval: float | None = None):
        self.stream = stream or sys.stdout
        self.tty = self.stream.isatty() if tty is None else tty
        self.interval = interval if interval is not None else (0.25 if self.tty else 5.0)
        self.view = RunView()
        self._drawn = 0  # lines of the live block now on screen
        self._last = 0.0

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (BrokenPipeError, ValueError):
            pass

    def _clear_block(self) -> None:
        if self.tty and self._drawn:
            self._write(f"\x1b[{self._drawn}F\x1b[J")
            self._drawn = 0

    def message(self, line: str) -> None:
        """A line that stays (above the live block on a TTY)."""
        self._clear_block()
        self._write(line + "\n")
        self._last = 0.0  # redraw the block at once below it

    def feed(self, evs: list[dict]) -> None:
        for ev in evs:
            for line in self.view.feed(ev):
                self.message(line)
        self.tick()

    def tick(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last < self.interval:
            return
        self._last = now
        if self.view.status == "starting" and not self.view.ranks:
            return
        if self.tty:
            block = [self.view.header()] + self.view.rank_lines()
            self._clear_block()
            self._write("".join(line + "\n" for line in block))
            self._drawn = len(block)
        else:
            ranks = [r for r in self.view.ranks.values() if r.rank >= 0]
            step = min((r.step for r in ranks), default=0)
            total = max((r.total_steps for r in ranks), default=0)
            self._write(f"{self.view.header()} | step {step}/{total or '?'}\n")

    def finish(self) -> None:
        """Last draw, then the summary lines."""
        if self.tty:
            self.tick(force=True)
        elif self.view.ranks:
            for line in self.view.rank_lines():
                self._write(line + "\n")
        self._drawn = 0
        for line in self.view.summary():
            self._write(line + "\n")
