"""Headless progress for `torchdeck run` and `torchdeck attach`: a RunView drawn as text (and
the lines rank 0 of an exported torchrun command prints: `echo_events`).

On a terminal the status block is redrawn in place (at most ~4 times a second) and every line
fits the terminal's width: narrow columns drop first, and a resize redraws at the new width
(SSH terminals are 80 columns more often than not). In a pipe or CI log a plain status line is
printed every few seconds instead. Log lines (epoch ends, checkpoints, warnings, errors) are
printed once, above the block.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import statistics
import sys
import time

from . import fleet, metric
from .. import fmt
from ..kinds import kind_of
from ..rundir.status import Status
from .view import RankState, RunView

_HOST = socket.gethostname()  # this node's: the rank logs read are this node's ranks'
COMPACT_ABOVE = fleet.LIST_ALL_UPTO  # ranks; beyond this one line per rank is too much to read
LOG_LEVELS = ("info", "warning", "error")  # "output" lines (what ranks print) stay in rank<N>.log


def _bar(done: int, total: int, width: int) -> str:
    if width <= 2:
        return ""
    inner = width - 2
    if total <= 0:
        return "[" + "?" * inner + "]"
    filled = min(inner, int(inner * done / total))
    return "[" + "#" * filled + "." * (inner - filled) + "]"


def _fit(text: str, width: int) -> str:
    return text if len(text) <= width else text[:max(0, width - 1)] + "…"


def _head(view: RunView, now: float, step_text: str) -> list[tuple[int, str]]:
    """The parts both headers open with, as (drop order, text): status, strategy, world, step,
    elapsed, then what it is doing while starting or which ranks are silent, if either."""
    parts = [(0, str(view.status).upper()), (6, view.strategy), (7, f"world {view.world_size or '?'}"),
             (1, step_text), (5, f"{fmt.duration(view.elapsed(now))} elapsed")]
    if view.restarts:  # one more part of the same run each (train.max_restarts)
        parts.append((3, view.restart_text()))
    starting = view.startup(now)
    stale = view.stale_ranks(now)
    if starting:
        parts.append((1, starting))
    elif stale:
        parts.append((2, f"STALLED: rank{'s' if len(stale) > 1 else ''} "
                         f"{fmt.ranks_text([r.rank for r in stale])} silent"))
    return parts


def _task_parts(view: RunView, now: float) -> list[tuple[int, str]]:
    """What the task adds to a header: tokens/s where the batches carry token ids, the main
    validation metric (`val 93.4%` for an accuracy, `val loss 1.6021` for a task without one) and
    the extra metrics the run sends (a loss callable's, a script's torchdeck.log numbers)."""
    parts = []
    tok = view.tokens_per_s(now)
    if tok is not None:
        parts.append((3, f"{'mean ' if view.final else ''}{fmt.rate(tok)} tokens/s"))
    mfu = view.mfu()
    if mfu is not None:
        parts.append((4, f"MFU {fmt.pct(mfu, 0)}"))
    main = view.main()
    if main is not None:
        name, value, _ = main
        parts.append((4, f"val {metric.show(name, value)}" if name == metric.ACC
                      else f"{metric.label(name)} {metric.show(name, value)}"))
    extra = view.metrics_text()  # `rank 0 last: mae 0.31`: one rank's newest numbers, said so
    if extra:
        parts.append((8, extra))
    return parts


def header(view: RunView, now: float, width: int, command: bool = True) -> str:
    """status | strategy | world | step | elapsed | ETA | samples/s | val acc; the least useful
    parts go first when the terminal is narrow. command: a script run's ends with its command."""
    if kind_of(view).is_script:
        return script_header(view, now, width, command)
    step, total = view.progress()
    parts = _head(view, now, f"step {step}/{total or '?'}")
    if len(parts) == 5 and not view.final:  # neither starting nor stalled
        parts.append((3, f"ETA {fmt.duration(view.eta(now))}"))
    parts.append((2, view.rate_text(now)))
    parts += _task_parts(view, now)
    while len(parts) > 1 and len(" | ".join(p for _, p in parts)) > width:
        parts.remove(max(parts, key=lambda p: p[0]))
    return _fit(" | ".join(p for _, p in parts), width)


# columns of a rank line, in the order they are dropped when the terminal is narrow
_OPTIONAL = ("device", "comm", "wait", "tokens", "loss", "epoch")


def rank_line(view: RunView, r: RankState, now: float, width: int) -> str:
    if kind_of(view).is_script:
        return script_rank_line(view, r, now, width)
    total = r.total_steps or view.total_steps
    cells = {
        "rank": f"rank {r.rank:>2}",
        "device": f"{r.place[:10]:<10}",
        "epoch": f"ep {r.epoch or '-'}/{view.total_epochs}" if view.total_epochs else f"ep {r.epoch or '-':>2}",
        "steps": f"{r.step:>5}/{total or '?':<5}",
        "loss": f"loss {fmt.num(r.loss)}",
        "rate": f"{fmt.rate(r.samples_per_s):>6} samples/s",  # the unit said: `101/s` read as anything
        "tokens": "" if r.tokens_per_s is None else f"{fmt.rate(r.tokens_per_s):>7} tok/s",
        "wait": f"wait {fmt.pct(r.data_wait, 0):>4}",
        "comm": "" if r.comm_wait is None else f"all-reduce {fmt.pct(r.comm_wait, 0):>4}",
    }
    if r.failed_exit:
        tail = f"({r.exited})"
    elif view.is_gone(r):
        tail = "(gone)"
    elif view.is_stale(r, now):
        tail = f"STALE {fmt.ago(now - r.last_seen)}"
    else:
        tail = ""
    order = ["rank", "device", "epoch", "bar", "steps", "loss", "rate", "tokens", "wait", "comm"]
    dropped: set = set()

    def build(bar_w: int) -> str:
        out = [_bar(r.step, total, bar_w) if key == "bar" else cells[key] for key in order if key not in dropped]
        return " ".join(c for c in out if c) + (f" {tail}" if tail else "")

    for n in range(len(_OPTIONAL) + 1):  # drop optional columns until a bar of 8 fits
        dropped = set(_OPTIONAL[:n])
        room = width - 1 - len(build(0)) - 1  # strictly shorter than the width: no wrap, ever
        if room >= 8 or n == len(_OPTIONAL):
            return _fit(build(min(22, room)) if room >= 3 else build(0), width - 1)
    return ""  # not reached


def compact(view: RunView, now: float, width: int, every_node: bool = False) -> list[str]:
    if kind_of(view).is_script:
        return script_compact(view, now, width, every_node)
    ranks = view.rank_list()
    sps = [r.samples_per_s for r in ranks]
    slow = min(ranks, key=lambda r: (r.samples_per_s, r.step))
    steps = [r.step for r in ranks]
    total = max((r.total_steps for r in ranks), default=0)
    losses = [r.loss for r in ranks if r.loss is not None]
    dead = [str(r.rank) for r in ranks if r.failed_exit]
    stale = [str(r.rank) for r in view.stale_ranks(now)]
    lines = [
        f"{len(ranks)} ranks{_on_nodes(ranks)}  steps {min(steps)}-{max(steps)}/{total or '?'}  "
        f"mean loss {fmt.num(statistics.fmean(losses) if losses else None)}",
        f"samples/s per rank: min {fmt.rate(min(sps))}  median {fmt.rate(statistics.median(sps))}  "
        f"max {fmt.rate(max(sps))}  slowest rank {slow.rank} (data wait {fmt.pct(slow.data_wait, 0)})",
    ]
    if stale:
        lines.append(f"stale ranks (silent): {_ranks(stale)}")
    if dead:
        lines.append(f"ranks exited abnormally: {_ranks(dead)}")
    lines += scale_lines(view, now, every_node)
    return [_fit(ln, width - 1) for ln in lines]


def _ranks(ranks: list[str]) -> str:
    return ", ".join(ranks) if len(ranks) <= 8 else fmt.rank_span([int(r) for r in ranks])


def _on_nodes(ranks: list[RankState]) -> str:
    n = len({fleet.node_of(r) for r in ranks})
    return f" on {n} nodes" if n > 1 else ""


def pick_line(view: RunView, p: "fleet.Pick", now: float, unit: str, many_nodes: bool) -> str:
    """  slowest   rank 203  node 25  step 1200  352 samples/s (-45% vs median)  wait 3%"""
    r = p.rank
    speed = fleet.pace(r)
    text = f"  {p.why:<9} rank {r.rank:>3}" + (f"  node {fleet.node_of(r):<2}" if many_nodes else "")
    text += f"  step {r.step}  {'-' if speed is None else fleet.pace_text(speed)}{_short(unit)}"
    if p.vs_median and abs(p.vs_median) >= 0.005:
        text += f" {p.vs_median:+.0%}"
    if r.data_wait is not None:
        text += f"  wait {fmt.pct(r.data_wait, 0)}"
    tail = _tail(view, r, now)
    return text + (f"  {tail}" if tail else "")


def _short(unit: str) -> str:
    return {"samples/s": " samples/s", "tokens/s": " tok/s"}.get(unit, " " + unit)


def node_summary(view: RunView, now: float, most: int = 4) -> list[str]:
    """The nodes worth a look (engine.runs.fleet.node_rows: stale or exited ranks, behind the
    others, the slowest rank, data wait, an idle, hot or full GPU), a line each."""
    rows = fleet.node_rows(view, view.fleet, now)
    named = [r for r in rows if r.flags]
    if not named:
        return [f"{len(rows)} nodes: none stands out (pace within {fleet.SLOW_FLAG:.0%}, no idle, hot or full GPU)"]
    out = [f"nodes to look at ({len(named)} of {len(rows)}):"]
    for r in named[:most]:
        span = f", ranks {r.group.rank_span}" if r.group is not None else ""
        out.append(f"  node {r.node} ({r.host or '?'}{span}): {', '.join(r.flags)}")
    if len(named) > most:
        out.append(f"  ... and {len(named) - most} more: {', '.join(str(r.node) for r in named[most:most + 12])}")
    return out


def scale_lines(view: RunView, now: float, every_node: bool = False) -> list[str]:
    """A run too big to list rank by rank: the ranks worth a look (stale and failed first, the
    median rank as the reference, the slowest, those that wait most for data), the ranks by node
    (every node's line once the run is over, else the slowest node), and every GPU in two lines."""
    ranks = view.rank_list()
    if not ranks:
        return []
    unit = fleet.pace_unit(ranks)
    groups = fleet.node_groups(view, now)
    picks, left_out = fleet.rank_picks(view, now)
    lines = [pick_line(view, p, now, unit, len(groups) > 1) for p in picks]
    if left_out:
        lines.append(f"  ... and {left_out} more stale or exited ranks")
    if len(groups) > 1:
        lines += ["by node:"] + ["  " + fleet.group_line(g, unit) for g in groups] if every_node \
            else node_summary(view, now)
    for extra in (fleet.fleet_line(view.fleet), view.fleet.imbalance_line()):
        if extra:
            lines.append(extra)
    return lines


def block(view: RunView, now: float, width: int, every_node: bool = False) -> list[str]:
    """The live block: a header line and a line per rank (or a compact summary)."""
    ranks = view.rank_list()
    lines = [header(view, now, width - 1)]
    if len(ranks) > COMPACT_ABOVE:
        lines += compact(view, now, width, every_node)
    else:
        lines += [rank_line(view, r, now, width) for r in ranks]
        if len(view.fleet.nodes) > 1:  # a few ranks on several nodes: every GPU in two lines still
            lines += [_fit(x, width - 1) for x in (fleet.fleet_line(view.fleet), view.fleet.imbalance_line()) if x]
    balance = view.balance_line()
    if balance:
        lines.append(_fit(balance, width - 1))
    return lines


def log_text(line) -> str:
    if line.level == "error" and line.text.startswith(line.who):  # an error event says who itself
        return f"[error] {line.text}"
    if line.level == "info":
        return line.text if line.rank is None else f"rank {line.rank}: {line.text}"
    return f"[{line.level}] {line.who}: {line.text}"


def summary(view: RunView, now: float) -> list[str]:
    """Final lines: status, accuracy, and for a failure the root cause with its traceback tail
    (a script run: its exit code and the steps each rank took instead of an accuracy)."""
    if kind_of(view).is_script:
        lines = script_summary(view, now)
    else:
        main = view.main()
        acc = ""
        if main is not None and main[0] == metric.ACC:
            _, val, best = main
            acc = f"; val accuracy {fmt.pct(val)}" + (f" (best {fmt.pct(best)})" if best is not None else "")
        elif main is not None:  # a task without accuracy: its loss (and perplexity)
            acc = f"; {view.main_text()}"
        lines = [f"run {view.status} after {fmt.duration(view.elapsed(now))}{acc}"]
    if view.restarts:
        lines.append(f"restarted {len(view.restarts)} time{'s' if len(view.restarts) > 1 else ''} after a failure "
                     f"(max {view.restarts[-1][1]})")
    if view.status in (Status.FAILED, Status.LOST):
        lines.append(f"root cause: {view.root_cause or 'unknown (see the rank logs)'}")
        if view.errors:
            e = view.errors[0]  # after a node was lost: what that did to this node's ranks, not why
            lines.append(f"  {'what followed: ' if view.lost_nodes else ''}{e.text}")
            for ln in e.detail.splitlines()[-8:]:
                lines.append("    " + ln)
    elif view.status == Status.STOPPED and view.root_cause:
        lines.append(f"why: {view.root_cause}")
    return lines


# ----------------------------------------------------------------------------- a user's script
# torchdeck launch: what a script's ranks say is a step count and steps/s (torch.optim's step hook),
# with loss and samples/s or tokens/s only when the script calls torchdeck.log; no epochs, no total.


def _logged_rate(r: RankState) -> str:
    """What torchdeck.log said last about a rank's throughput: samples/s, else tokens/s, else ""."""
    if r.samples_per_s > 0:
        return f"{fmt.rate(r.samples_per_s)} samples/s"
    if r.tokens_per_s:
        return f"{fmt.rate(r.tokens_per_s)} tokens/s"
    return ""


def script_rate_text(view: RunView, now: float) -> str:
    """The header's pace: samples/s or tokens/s summed over the ranks when the script logs them,
    else the slowest rank's steps/s (the ranks of one job step together)."""
    ranks = [r for r in view.rank_list() if r.exited is None or view.final]
    if any(r.samples_per_s > 0 for r in ranks) and (not view.final or view.mean_samples_per_s() > 0):
        return view.rate_text(now)  # (over, and every logging rank failed or was stopped: the pace below)
    tokens = [r.tokens_per_s for r in ranks if r.tokens_per_s]
    if tokens:
        return f"{fmt.rate(sum(tokens))} tokens/s"
    return view.script_pace_text(now)


def script_header(view: RunView, now: float, width: int, command: bool = True) -> str:
    """status | script | world | step | elapsed | pace | the command, cut to what is left of the
    width (the first to go, then the loop header's order)."""
    step, total = view.progress()
    parts = _head(view, now, f"step {step}/{total}" if total else f"step {step}")
    parts.append((2, script_rate_text(view, now)))
    parts += [p for p in _task_parts(view, now) if not p[1].endswith("tokens/s")]  # the pace says tokens/s already
    while len(parts) > 1 and len(" | ".join(p for _, p in parts)) > width:
        parts.remove(max(parts, key=lambda p: p[0]))
    text = " | ".join(p for _, p in parts)
    room = width - len(text) - 3
    if command and view.command and room >= 12:
        text += " | " + _fit(" ".join(view.command), room)
    return _fit(text, width)


def _tail(view: RunView, r: RankState, now: float) -> str:
    if r.failed_exit:
        return f"({r.exited})"
    if view.is_gone(r):
        return "(gone)"
    if view.is_stale(r, now):
        return f"STALE {fmt.ago(now - r.last_seen)}"
    return ""


def script_rank_line(view: RunView, r: RankState, now: float, width: int) -> str:
    """rank N  [device]  step S  X.X steps/s  [loss L  R samples/s]: the device, then the logged
    rate, then the loss drop when the terminal is narrow."""
    cells = [("rank", f"rank {r.rank:>2}"), ("device", f"{r.place[:10]:<10}" if r.device else ""),
             ("steps", f"step {r.step:>5}"), ("pace", f"{fmt.steps_rate(r.steps_per_s):>5} steps/s"),
             ("loss", "" if r.loss is None else f"loss {fmt.num(r.loss)}"), ("rate", _logged_rate(r))]
    tail = _tail(view, r, now)
    line = ""
    for dropped in ((), ("device",), ("device", "rate"), ("device", "rate", "loss")):
        line = "  ".join(c for k, c in cells if c and k not in dropped) + (f"  {tail}" if tail else "")
        if len(line) < width:
            break
    return _fit(line, width - 1)


def script_compact(view: RunView, now: float, width: int, every_node: bool = False) -> list[str]:
    ranks = view.rank_list()
    steps = [r.step for r in ranks]
    paces = [r.steps_per_s for r in ranks if r.steps_per_s is not None]
    losses = [r.loss for r in ranks if r.loss is not None]
    dead = [str(r.rank) for r in ranks if r.failed_exit]
    stale = [str(r.rank) for r in view.stale_ranks(now)]
    first = f"{len(ranks)} ranks{_on_nodes(ranks)}  steps {min(steps)}-{max(steps)}"
    if losses:
        first += f"  mean loss {fmt.num(statistics.fmean(losses))}"
    lines = [first]
    if paces:
        slow = min((r for r in ranks if r.steps_per_s is not None), key=lambda r: (r.steps_per_s, r.step))
        lo, med, hi = (fmt.steps_rate(v) for v in (min(paces), statistics.median(paces), max(paces)))
        lines.append(f"steps/s per rank: min {lo}  median {med}  max {hi}  slowest rank {slow.rank}")
    if stale:
        lines.append(f"stale ranks (silent): {_ranks(stale)}")
    if dead:
        lines.append(f"ranks exited abnormally: {_ranks(dead)}")
    lines += scale_lines(view, now, every_node)
    return [_fit(ln, width - 1) for ln in lines]


def script_summary(view: RunView, now: float) -> list[str]:
    """run <status> after <elapsed>, exit code N; the steps each rank took (and how it ended, when
    badly); the root cause follows in summary()."""
    code = view.exit_code()
    lines = [f"run {view.status} after {fmt.duration(view.elapsed(now))}"
             + ("" if code is None else f", exit code {code}")]
    ranks = view.rank_list()
    if ranks and len(ranks) <= COMPACT_ABOVE:
        lines.append("steps done: " + ", ".join(f"rank {r.rank} {r.step}" + (f" ({r.exited})" if r.failed_exit else "")
                                                for r in ranks))
    elif ranks:
        lo, hi = min(ranks, key=lambda r: r.step), max(ranks, key=lambda r: r.step)
        lines.append(f"steps done per rank: {lo.step} (rank {lo.rank}) to {hi.step} (rank {hi.rank})")
    return lines


class Display:
    """Prints a RunView: in a pipe (and for torchrun's rank 0, through Echo) its log lines and the
    ranks' own output as they come and a short status line every few seconds. On a TTY the CLI's
    subclass (cli/progress.py) redraws a live block with rich in place: engine/ imports no
    front-end library, so here the TTY hooks only print."""

    def __init__(self, stream=None, tty: bool | None = None, interval: float | None = None,
                 width: int | None = None, clock=time.time):
        self.stream = stream or sys.stdout
        self.tty = self.stream.isatty() if tty is None else tty
        self.interval = interval if interval is not None else (0.25 if self.tty else 5.0)
        self._fixed_width = width
        self.clock = clock
        self._drawn: list[str] = []  # the live block now on screen
        self._last = 0.0
        self._log_seq = 0
        self.frames = 0
        self._resized = False
        self._resized_rows = 0
        self._last_header = ""  # the plain header line printed last (not on a TTY)
        if self.tty and width is None:
            try:
                signal.signal(signal.SIGWINCH, self._on_resize)
            except (ValueError, AttributeError, OSError):
                pass  # not the main thread, or no such signal here

    def _on_resize(self, *_):
        self._resized = True

    @property
    def width(self) -> int:
        if self._fixed_width:
            return self._fixed_width
        try:
            return os.get_terminal_size(self.stream.fileno()).columns or 80
        except (OSError, ValueError, AttributeError):
            return shutil.get_terminal_size((80, 24)).columns

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (BrokenPipeError, ValueError, OSError):
            pass

    # the TTY hooks: the CLI's Display draws them with rich
    def _tty_message(self, line: str) -> None:
        self._write(fmt.wrap(line, self.width) + "\n")

    def _tty_output(self, lines: list[str]) -> None:
        self._write("".join(ln + "\n" for ln in lines))

    def _draw(self, lines: list[str]) -> None:
        self._write("".join(ln + "\n" for ln in lines))
        self._drawn = lines

    def message(self, line: str) -> None:
        """A line that stays (above the live block on a TTY, wrapped at its width under an indent)."""
        if self.tty:
            self._tty_message(line)
        else:
            self._write(line + "\n")

    def output(self, lines: list[str]) -> None:
        """The ranks' own lines (prefixed already), above the block as torchrun prints them."""
        if not lines:
            return
        if self.tty:
            self._tty_output(lines)
        else:
            self._write("".join(ln + "\n" for ln in lines))

    def show(self, view: RunView, force: bool = False) -> None:
        """New log lines, then the block (rate-limited unless forced, or the terminal was resized)."""
        for line in [ln for ln in view.logs if ln.seq > self._log_seq]:  # arrived since the last call
            if line.level in LOG_LEVELS:
                self.message(log_text(line))
        self._log_seq = view.log_seq
        mono = time.monotonic()
        if self._resized:
            self._resized, force = False, True
            w = max(1, self.width)
            self._resized_rows = sum(max(1, -(-len(line) // w)) for line in self._drawn)
        if not force and mono - self._last < self.interval:
            return
        if not self.tty and not (view.world_size or view.final):
            return  # in a log, not `STARTING | ? | world ?`: the first line waits until the run says what it is
        self._last = mono

        now = self.clock()
        if self.tty:
            self._draw(block(view, now, self.width))
        else:
            text = header(view, now, 10_000, command=False)  # the command was said once, at the start
            if text == self._last_header:
                return  # the same line again (finish() right after the last show) says nothing new
            self._last_header = text
            self._write(text + "\n")
        self.frames += 1

    def close(self) -> None:
        """Leave the block where it is and give the terminal back (its cursor, print())."""
        self._drawn = []

    def finish(self, view: RunView) -> None:
        """Last draw, then the summary lines."""
        self.show(view, force=True)
        self.close()
        if not self.tty and view.ranks:
            for line in block(view, self.clock(), 10_000, every_node=True)[1:]:
                self._write(line + "\n")
        for line in summary(view, self.clock()):
            self._write(line + "\n")



class RankOutput:
    """What a script's ranks print, for the terminal, as torchrun --tee prints it: each line of
    rank<N>.log (stdout and stderr, in the order written) prefixed `[default<local rank>]:`, for the
    local ranks `rule.shows` (engine.launch.args.OutputRule; None: all). Read incrementally, at most
    READ_BYTES a file a read; a chatty rank gets up to ROUNDS reads a poll so it cannot fall behind.
    whole: from the first line (a launch); else (attach) the last HISTORY lines of each rank first."""

    ROUNDS = 8
    HISTORY = 20

    def __init__(self, run, rule=None, whole: bool = True):
        from .follow import OutputTail

        self.tail = OutputTail(run, whole=whole, supervisor=False)
        self.rule = rule
        self._history = not whole
        self.cut = 0  # history lines left out (attach)

    @staticmethod
    def local_rank(view: RunView, rank: int) -> int:
        per_node = view.world_size // max(1, view.num_nodes) if view.world_size else 0
        if not per_node:
            return rank
        local = rank - view.node_rank * per_node
        return local if 0 <= local < per_node else rank % per_node

    def _lines(self, view: RunView, got) -> list[str]:
        out = []
        for rank, text in got:
            text = text.rsplit("\r", 1)[-1]  # a progress bar redrawn with \r: its last state, as a terminal shows it
            local = self.local_rank(view, rank)
            if self.rule is None:
                out.append(f"[default{local}]:{text}")
            elif self.rule.shows(local):
                state = view.ranks.get(rank)
                out.append(self.rule.prefix(local, rank, (state.host if state else "") or _HOST) + text)
        return out

    def poll(self, view: RunView) -> list[str]:
        """The new lines, prefixed; nothing until the run says it runs a script (run_started)."""
        if not kind_of(view).shows_rank_output:
            return []
        got = []
        for _ in range(self.ROUNDS):
            got += [(rank, text) for rank, text, _ in self.tail.poll()]
            if not self.tail.behind:
                break
        if self._history:
            self._history = False
            keep = []
            for rank in sorted({r for r, _ in got}):
                mine = [g for g in got if g[0] == rank]
                self.cut += max(0, len(mine) - self.HISTORY)
                keep += mine[-self.HISTORY:]
            got = keep
        return self._lines(view, got)

    def drain(self, view: RunView) -> list[str]:
        """Everything left once the run is over, its last unterminated lines too."""
        if not kind_of(view).shows_rank_output:
            return []
        out = []
        while True:
            lines = self.poll(view)
            out += lines
            if not self.tail.behind:
                break
        return out + self._lines(view, self.tail.leftovers())


# ----------------------------------------------------------------------------- torchrun's rank 0


class Echo:
    """The events one process writes, printed as `torchdeck run` prints a run in a pipe: its log
    lines (epoch ends, checkpoints, warnings, errors) as they come, a status line every few
    seconds, the summary once the run is over. Never raises: a closed terminal must not stop the
    training it reports on."""

    def __init__(self, stream=None):
        self.view = RunView()
        self.display = Display(stream, tty=False)

    def __call__(self, ev: dict) -> None:
        try:
            self.view.feed(ev)
            if ev.get("kind") == "run_finished":
                self.display.finish(self.view)
            else:
                self.display.show(self.view)
        except Exception:  # noqa: BLE001 (printing is a courtesy)
            pass


def echo_events(reporter, stream=None):
    """Have `reporter` (engine.worker's FileReporter: torchrun's ranks write events themselves,
    with no `torchdeck run` to print them) also print each event it writes, through Echo."""
    echo, write = Echo(stream), reporter.write_event

    def write_and_print(ev: dict) -> None:
        write(ev)
        echo(ev)

    reporter.write_event = write_and_print
    return reporter
