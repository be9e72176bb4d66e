"""The Monitor screen's panes. Each pane turns a snapshot into text and repaints only when that
text changed, so a busy run costs a few string compares per frame, not a relayout."""
from __future__ import annotations

import socket
from collections import deque

from rich.cells import cell_len
from rich.text import Text
from textual.containers import Horizontal, Vertical
from textual.widgets import RichLog, Static

from ...engine import fmt
from ...engine.runs import metric
from ...engine.runs import fleet
from ...engine.kinds import kind_of
from ...engine.runs.view import RunView
from ..widgets.status import STATUS_STYLE

BLOCKS = " ▁▂▃▄▅▆▇█"
IMBALANCE_POINTS = 20.0  # util/memory spread across the run's GPUs worth shouting about
HISTORY = 120  # GPU utilization samples kept (one a second)
_HOST = socket.gethostname()


def bar(frac: float | None, width: int, style: str = "green") -> Text:
    """A horizontal bar; None draws an empty, dim one."""
    width = max(1, width)
    if frac is None or frac != frac:
        return Text("·" * width, style="dim")
    frac = min(1.0, max(0.0, frac))
    full = int(round(frac * width))
    return Text.assemble(("█" * full, style), ("░" * (width - full), "dim"))


def spark(values, width: int) -> str:
    """A history line on a fixed 0-100 scale (Textual's Sparkline scales to its own min/max,
    which makes an idle GPU at 3 % look as busy as a saturated one)."""
    vals = list(values)[-width:] if width > 0 else []
    out = []
    for v in vals:
        if v is None:
            out.append(" ")
        else:
            out.append(BLOCKS[int(round(min(100.0, max(0.0, v)) / 100 * (len(BLOCKS) - 1)))])
    return "".join(out).rjust(width)


def util_style(pct: float | None) -> str:
    if pct is None:
        return "dim"
    return "red" if pct >= 90 else "yellow" if pct >= 60 else "green"


NA = "n/a"  # a reading the sampler could not get


def _rows(plain: str, width: int) -> int:
    return sum(1 + max(0, cell_len(line) - 1) // width for line in plain.split("\n"))


class TextPane(Static):
    """A Static that repaints only when its text changed."""

    def __init__(self, *a, **kw):
        super().__init__("", *a, **kw)
        self._shown: str | None = None
        self._plain: str | None = None

    def show(self, text: Text | str) -> bool:
        key = text.markup if isinstance(text, Text) else text
        if key == self._shown:
            return False
        self._shown = key
        # A relayout of the whole screen costs far more than the repaint: only when the number
        # of rows this text takes (wrapping included) differs from what the old text takes at
        # today's width, which is the height the last layout gave the pane (a scroll bar that
        # came or went since has re-wrapped the old text: comparing with the rows counted at the
        # old width left a stale second row under the rank lines).
        plain = text.plain if isinstance(text, Text) else text
        width = max(1, self.content_region.width)
        layout = (self._plain is None or self.content_region.width <= 0
                  or _rows(plain, width) != _rows(self._plain, width))
        self._plain = plain
        self.update(text, layout=layout)
        return True

    def width(self, default: int = 76) -> int:
        w = self.content_region.width
        return w if w > 0 else default


# ----------------------------------------------------------------------------- header


def command_text(state: RunView) -> str:
    """A script run's command line as the user would type it (quoted where the shell needs it)."""
    import shlex

    return shlex.join(state.command)


def _script_rate(state: RunView, now: float) -> str:
    """A script run's pace: the slowest rank's optimizer steps/s (they meet in each collective),
    and its samples/s where the script logs them."""
    ranks = [r for r in state.rank_list() if not state.ended_badly(r)]
    out = state.script_pace_text(now)  # the CLI's words (its mean once over)
    if any(r.samples_per_s for r in ranks):
        out += f"  ·  {state.rate_text(now)}"
    return out


SEP = "  ·  "


def flow(items: list[Text], width: int = 0, lead: str = " ", start: int = 0) -> Text:
    """Items joined by SEP, a line broken only between two items (never inside one: at 80 columns
    `1,187⏎ samples/s` and `val acc⏎ 70.0%` read as two things), each new line begun with `lead`;
    start: the cells already used on the first line; width 0: one line."""
    t = Text()
    line = start
    for item in items:
        if line > start and width and line + len(SEP) + item.cell_len > width:
            t.append("\n" + lead)
            line = len(lead)
        elif line > start:
            t.append(SEP)
            line += len(SEP)
        t.append_text(item)
        line += item.cell_len
    return t


def _item(text: str, style: str = "") -> Text:
    return Text(text, style=style)


def header_text(state: RunView, now: float, run_name: str, width: int = 0) -> Text:
    """The Monitor's header: what runs, then where it is; why it ended, when it ended early."""
    st = state.status
    script = kind_of(state).is_script
    top = _header_what(state, run_name, width, script)
    row = [_item(f"elapsed {fmt.duration(state.elapsed(now))}"), _header_phase(state, now, script)]
    row += _header_figures(state, now, script)
    t = flow(top, width)
    t.append("\n ")
    t.append_text(flow(row, width, start=1))
    if state.root_cause and st.ended_early:
        t.append("\n")
        t.append(f" root cause: {state.root_cause}", style="red" if st.went_wrong else "yellow")
    return t


def _header_what(state: RunView, run_name: str, width: int, script: bool) -> list[Text]:
    """Status, name, strategy (the command for a script), world, global batch, a stop asked."""
    st = state.status
    first = Text()
    first.append(f" {st.upper()} ", style=STATUS_STYLE.get(st, "bold") + " reverse")
    first.append(f" {state.run or run_name}", style="bold")
    top = [first]
    if not script:  # a script's command says what runs
        top.append(_item(state.strategy))
    nodes = f", {state.num_nodes} nodes" if state.num_nodes > 1 else ""
    top.append(_item(f"world {state.world_size or '?'}{nodes}"))
    if script and state.command:  # what runs, cut to what is left of the line
        used = flow(top, width).plain.split("\n")[-1]
        room = (width or 120) - cell_len(used) - len(SEP)
        cmd = command_text(state)
        if room >= 8:
            top.append(_item(cmd if cell_len(cmd) <= room else cmd[:room - 1] + "…", "bold cyan"))
    if state.global_batch:
        top.append(_item(f"global batch {state.global_batch}"))
    if state.restarts:  # the attempts of one run (train.max_restarts)
        top.append(_item(state.restart_text(), "yellow"))
    if state.stop_requested and not state.final:
        top.append(_item("stop requested", "yellow"))
    return top


def _header_phase(state: RunView, now: float, script: bool) -> Text:
    """Starting, stalled, or how long is left."""
    st = state.status
    stale = state.stale_ranks(now)
    starting = state.startup(now)
    if starting and script:  # a script sends no phases: its ranks are busy until their first optimizer step
        since = max(0.0, now - state.started_t) if state.started_t is not None else 0.0
        return _item(f"waiting for the first optimizer step ({since:.0f} s)" if state.started_t is not None
                     else starting, "cyan")
    if starting:
        return _item(starting, "cyan")
    if stale:
        who = fmt.ranks_text([r.rank for r in stale])  # as attach says them: 256 silent ranks are '0-255'
        return _item(f"STALLED: rank{'s' if len(stale) > 1 else ''} {who} silent", "bold red")
    if script:
        return _item("done" if st == "finished" else "length: the script's own")  # no total to count down to
    eta = state.eta(now)
    return _item("ETA " + ("done" if st == "finished" else fmt.duration(eta)))


def _header_figures(state: RunView, now: float, script: bool) -> list[Text]:
    """Rates, step, epoch and the main metric."""
    step, total = state.progress()
    row = [_item(_script_rate(state, now) if script else state.rate_text(now))]
    tok = state.tokens_per_s(now)  # batches with token ids (a language model), or a script that logs tokens
    if tok is not None:
        row.append(_item(f"{'mean ' if state.final else ''}{fmt.rate(tok)} tokens/s"))
    mfu = state.mfu()  # train.compile on a GPU: the model's FLOPs against the GPU's peak
    if mfu is not None:
        row.append(_item(f"MFU {fmt.pct(mfu, 0)}"))
    row.append(_item(f"step {step}" if script else f"step {step}/{total or '?'}"))
    if state.total_epochs:
        row.append(_item(f"epoch {max(1, state.epoch())}/{state.total_epochs}"))
    main = state.main()  # accuracy for classification, else the validation loss (metric.main_of)
    if main is not None:
        name, value, best = main
        m = Text(f"{metric.label(name)} ")
        m.append(metric.show(name, value), style="bold")
        if best is not None:
            m.append(f" (best {metric.show(name, best)})")
        row.append(m)
        ppl = state.latest("perplexity") if name == metric.LOSS else None
        if ppl is not None:
            row.append(_item(f"perplexity {metric.show('perplexity', ppl)}"))
    return row


# ----------------------------------------------------------------------------- GPUs


def gpu_ranks(gpu, state: RunView, family: dict | None = None) -> list[int]:
    """Ranks of this run on a GPU: its process list (a rank's own pid or one of its children's,
    `family`: pid -> rank from the host sample), else the device each rank reported."""
    pids = {**(family or {}), **state.rank_pids()}
    out = {pids[p] for p in (getattr(gpu, "pids", None) or []) if pids.get(p) is not None}
    for r in state.rank_list():
        if r.host in ("", _HOST, state.host) and not r.from_report:
            devs = [d.strip() for d in r.device.split(",")]
            if f"cuda:{gpu.index}" in devs:
                out.add(r.rank)
    return sorted(out)


def gpu_text(gpus, ok: bool, reason: str, history: dict, state: RunView, width: int,
             family: dict | None = None) -> Text:
    if not ok:
        return Text(f"no GPU view: {reason or 'NVML is not available'}", style="yellow")
    if not gpus:
        return Text("NVML found no GPU on this host", style="yellow")
    t = Text()
    used = []
    for i, g in enumerate(gpus):
        ranks = gpu_ranks(g, state, family)
        if ranks:
            used.append(g)
        if i:
            t.append("\n")
        t.append_text(gpu_row(g, ranks, history.get(g.index, ()), width))
    t.append("\n")
    t.append_text(imbalance_text(used, gpus))
    if reason:  # with GPUs shown, a reason is a warning about them (e.g. PIDs from another namespace)
        t.append("\n")
        t.append(reason, style="yellow")
    return t


def gpu_row(g, ranks: list[int], history, width: int) -> Text:
    """One GPU (a sampler's GPUSample or a node_sample's, engine.runs.fleet.GPU): index, name,
    utilization and memory bars, temperature, power, its utilization history, the ranks on it."""
    t = Text()
    name_w = 15 if width >= 84 else 10
    util = fmt.real(getattr(g, "util", None))
    mused, mtot = fmt.real(getattr(g, "mem_used_mb", None)), fmt.real(getattr(g, "mem_total_mb", None))
    mfrac = mused / mtot if mused is not None and mtot else None
    who = ("r" + ",".join(map(str, ranks))) if ranks else "-"
    fixed = 2 + name_w + 1 + 5 + 1 + 13 + 1 + 5 + 1 + 9 + 1 + 8
    room = max(8, width - fixed)
    bw = max(4, min(14, room // 4))
    sw = max(0, room - 2 * bw - 2)
    name = str(getattr(g, "name", "?")).replace("NVIDIA ", "")[:name_w]
    t.append(f"{g.index:<2}", style="bold")
    t.append(f"{name:<{name_w}} ")
    t.append_text(bar(None if util is None else util / 100, bw, util_style(util)))
    t.append(f" {fmt.num(util, '.0f', NA):>3}% ")
    t.append_text(bar(mfrac, bw, util_style(None if mfrac is None else 100 * mfrac)))
    t.append(f" {fmt.mib(mused, NA):>5}/{fmt.mib(mtot, NA):<6} ")
    temp = getattr(g, "temp_c", None)
    t.append(f"{fmt.num(fmt.real(temp), '.0f', NA):>3}°C ")
    pw, pl = fmt.real(getattr(g, "power_w", None)), fmt.real(getattr(g, "power_limit_w", None))
    t.append(f"{fmt.num(pw, '.0f', NA):>4}/{fmt.num(pl, '.0f', NA):<4}W ")
    if sw:
        t.append(spark(history, sw), style="cyan")
        t.append(" ")
    t.append(f"{who:<8}", style="bold magenta" if ranks else "dim")
    return t


def imbalance_text(used, gpus) -> Text:
    """Spread of utilization and memory across the run's GPUs: DP's heavy GPU 0 shows here."""
    group, label = (used, "this run's GPUs") if len(used) >= 2 else (gpus, "all GPUs")
    if len(group) < 2:
        return Text("imbalance: one GPU, nothing to compare", style="dim")
    utils = [u for u in (fmt.real(getattr(g, "util", None)) for g in group) if u is not None]
    mems = []
    for g in group:
        u, tot = fmt.real(getattr(g, "mem_used_mb", None)), fmt.real(getattr(g, "mem_total_mb", None))
        if u is not None and tot:
            mems.append(100 * u / tot)
    du = max(utils) - min(utils) if len(utils) >= 2 else None
    dm = max(mems) - min(mems) if len(mems) >= 2 else None
    t = Text(f"imbalance across {label}: ")
    for what, d in (("util", du), ("memory", dm)):
        if d is None:
            t.append(f"{what} n/a  ")
            continue
        big = d > IMBALANCE_POINTS
        t.append(f"{what} spread {d:.0f} pts", style="bold red reverse" if big else "green")
        t.append("  ")
    if (du or 0) > IMBALANCE_POINTS or (dm or 0) > IMBALANCE_POINTS:
        hot = max(group, key=lambda g: fmt.real(getattr(g, "util", None)) or 0)
        t.append(f"GPU {hot.index} carries the most", style="red")
    return t


# ----------------------------------------------------------------------------- host


def host_text(host, state: RunView, width: int, why_none: str = "") -> Text:
    if host is None:
        return Text(why_none or "host sampling is not available", style="yellow")
    t = Text()
    bw = max(6, min(30, width - 30))
    cpu = fmt.real(getattr(host, "cpu_percent", None))
    t.append("CPU ", style="bold")
    t.append_text(bar(None if cpu is None else cpu / 100, bw, util_style(cpu)))
    ncpu = len(getattr(host, "per_cpu", None) or [])
    load = fmt.real(getattr(host, "load1", None))
    t.append(f" {fmt.num(cpu, '.0f', NA):>3}%  {ncpu} cores  load {fmt.num(load, '.2f', NA)}\n")
    used, tot = fmt.real(getattr(host, "ram_used_mb", None)), fmt.real(getattr(host, "ram_total_mb", None))
    frac = used / tot if used is not None and tot else None
    t.append("RAM ", style="bold")
    t.append_text(bar(frac, bw, util_style(None if frac is None else 100 * frac)))
    t.append(f" {fmt.mib(used, NA)}/{fmt.mib(tot, NA)}\n")
    procs = list(getattr(host, "procs", None) or [])
    t.append(f"{'pid':>8}  {'who':<10} {'CPU%':>6} {'RSS':>8}", style="bold")
    if not procs:
        t.append("\n")
        t.append("no process of this run on this host" if state.final else "waiting for the run's processes",
                 style="dim")
    for p in sorted(procs, key=lambda p: (-1 if getattr(p, "rank", None) is None else p.rank,
                                          bool(getattr(p, "child", False)))):
        rank = getattr(p, "rank", None)
        who = "supervisor" if rank is None else f"r{rank} child" if getattr(p, "child", False) else f"rank {rank}"
        rss = fmt.real(getattr(p, "rss_mb", None))
        pc = fmt.real(getattr(p, "cpu_percent", None))
        t.append(f"\n{p.pid:>8}  {who:<10} {fmt.num(pc, '.1f', NA):>6} {fmt.mib(rss, NA):>8}")
    return t


# ----------------------------------------------------------------------------- ranks


def task_cols(state: RunView | None) -> tuple[bool, bool]:
    """(an accuracy column, tokens/s in the rate column): a task without accuracy (a language
    model, a regression) leaves tr.acc blank, and batches with token ids count tokens/s."""
    if state is None:
        return True, False
    return state.has_accuracy is not False, any(r.tokens_per_s is not None for r in state.rank_list())


def rank_header(width: int, state: RunView | None = None) -> Text:
    cols = _rank_cols(width)
    acc, tokens = task_cols(state)
    dev = f"{'device':<{cols['dev']}}" if cols["dev"] else ""
    mem = f" {'a-red':>5} {'mem':>6}" if cols["dev"] else ""
    return Text(f"{'rank':<5}{dev}{'ep':>3} {'progress':<{cols['bar'] + 1 + cols['steps']}} "
                f"{'loss':>8} {'tr.acc' if acc else '':>6} {'tokens/s' if tokens else 'samples/s':>10} "
                f"{'wait':>5}{mem} {'seen':>11}", style="bold")


def _rank_cols(width: int) -> dict:
    dev = 14 if width >= 110 else 0
    steps = 15 if width >= 110 else 11
    fixed = 5 + dev + 3 + 1 + 1 + steps + 1 + 8 + 1 + 6 + 1 + 10 + 1 + 5 + 1 + 11 + (13 if dev else 0)
    return {"dev": dev, "steps": steps, "bar": max(4, min(60, width - fixed))}


def _script_cols(width: int) -> dict:
    dev = 10 if width >= 110 else 0
    fixed = 5 + dev + 1 + 8 + 1 + 8 + 1 + 10 + 1 + 8 + 1 + 11
    return {"dev": dev, "step": max(6, width - fixed - 1)}  # 1: room for a scroll bar that comes later


def script_rank_header(width: int) -> Text:
    """A script run's rank columns: no epochs, totals, accuracy or data wait (the step hook knows
    steps and their rate; loss and samples/s come with torchdeck.log), and each rank's pid."""
    c = _script_cols(width)
    dev = f"{'device':<{c['dev']}}" if c["dev"] else ""
    return Text(f"{'rank':<5}{dev}{'step':<{c['step']}} {'loss':>8} {'steps/s':>8} {'samples/s':>10} "
                f"{'pid':>8} {'seen':>11}", style="bold")


def script_rank_text(state: RunView, r, now: float, width: int) -> Text:
    c = _script_cols(width)
    t = Text()
    t.append(f"{r.rank:<5}", style="bold")
    if c["dev"]:
        t.append(f"{(r.device or '-')[:c['dev'] - 1]:<{c['dev']}}")
    t.append(f"{r.step:<{c['step']},}", style="red" if r.failed_exit else "cyan")
    t.append(f" {fmt.num(r.loss):>8}")
    t.append(f" {fmt.steps_rate(r.steps_per_s):>8}")
    t.append(f" {fmt.rate(r.samples_per_s) if r.samples_per_s else '-':>10}")
    t.append(f" {r.pid or '-':>8}")
    _seen_col(t, state, r, now)
    return t


def rank_text(state: RunView, r, now: float, width: int) -> Text:
    if kind_of(state).is_script:
        return script_rank_text(state, r, now, width)
    cols = _rank_cols(width)
    total = r.total_steps or state.total_steps
    frac = (r.step / total) if total else None
    t = Text()
    t.append(f"{r.rank:<5}", style="bold")
    if cols["dev"]:
        dev = r.place
        if r.device and fleet.multi_node(state):  # which node, before its device: n17 cuda:3
            dev = f"n{fleet.node_of(r)} {dev}"
        elif r.host and r.host not in (_HOST, state.host):
            dev = f"{r.host}:{dev}"
        t.append(f"{dev[:cols['dev'] - 1]:<{cols['dev']}}")
    t.append(f"{r.epoch:>3} ")
    style = "red" if r.failed_exit else "green" if (total and r.step >= total) else "cyan"
    t.append_text(bar(frac, cols["bar"], style))
    t.append(f" {str(r.step) + '/' + (str(total) if total else '?'):<{cols['steps']}}")
    acc, tokens = task_cols(state)
    t.append(f" {fmt.num(r.loss):>8} {fmt.pct(r.acc) if acc else '':>6}")
    t.append(f" {fmt.rate(r.tokens_per_s) if tokens else format(r.samples_per_s, ',.0f'):>10}")
    t.append(f" {'-' if r.data_wait is None else format(100 * r.data_wait, '.0f') + '%':>5}")
    if cols["dev"]:  # share of time in the all-reduce (waiting for the others), then device memory
        t.append(f" {'-' if r.comm_wait is None else format(100 * r.comm_wait, '.0f') + '%':>5}")
        t.append(f" {fmt.mib(r.device_mem_mb):>6}")
    _seen_col(t, state, r, now)
    return t


def _seen_col(t: Text, state: RunView, r, now: float) -> None:
    """How the rank is: its exit, gone, stale, done, or how long since it was last heard from."""
    if r.failed_exit:
        t.append(f" {r.exited}", style="bold red")
    elif state.is_gone(r):  # the run was lost: its last figures are old news
        t.append(f" {'gone':>11}", style="bold red")
    elif state.is_stale(r, now):
        t.append(" ")
        t.append(f"{'STALE ' + _seen(now - r.last_seen, whole=True):>11}", style="bold red reverse")
    elif r.exited:
        t.append(f" {'done':>11}", style="dim")
    else:
        seen = None if r.last_seen is None else max(0.0, now - r.last_seen)
        t.append(f" {_seen(seen):>11}", style="dim" if state.final else "")
    if r.from_report:
        t.append(" (report)", style="dim")


def _seen(s: float | None, whole: bool = False) -> str:
    if s is None:
        return "-"
    if s < 60:
        return f"{s:.0f}s" if whole else f"{s:.1f}s"
    return fmt.duration(s)


def _comm_measured(strategy) -> bool:
    """The strategy's ranks time their all-reduce on the CPU (its own answer: DDP's comm hook)."""
    from ...engine.strategies import get_strategy, known

    return known(strategy) and get_strategy(strategy).comm_measured


def no_spread_text(state: RunView) -> str:
    """Why there is no rank balance yet, in words that hold: the ranks are listed before their
    first step, and only DDP on the CPU times its all-reduce (who waits for whom)."""
    listed = [r for r in state.rank_list() if not r.failed_exit]
    world = state.world_size or len(listed)
    if world < 2:
        return "rank balance: one rank, nothing to compare"
    if len(listed) < 2:
        return f"rank balance: {len(listed)} of {world} ranks reporting"
    if state.final:
        return "rank balance: no two ranks trained at a measured rate"
    measured = any(r.comm_wait is not None for r in listed) or (
        _comm_measured(state.strategy) and state.devices and all(d == "cpu" for d in state.devices))
    from ...engine.strategies import names

    timed = "/".join(n for n in names() if _comm_measured(n))
    return "rank balance: from the first steps " + (  # the a-red column: measured, or why it is '-'
        "(who waits for whom in the all-reduce)" if measured else f"(a-red is measured for {timed} on CPU)")


def rank_spread_text(state: RunView) -> Text:
    pair = state.rank_spread()
    if pair is None:
        return Text(no_spread_text(state), style="dim")
    slow, fast = pair
    if slow.samples_per_s == fast.samples_per_s:
        return Text(f"rank balance: every rank at {fmt.rate(fast.samples_per_s)} samples/s", style="green")
    gap = 100 * (1 - slow.samples_per_s / fast.samples_per_s) if fast.samples_per_s else 0.0
    t = Text("rank balance: slowest ")
    t.append(f"rank {slow.rank} {fmt.rate(slow.samples_per_s)} samples/s", style="bold")
    t.append(f", fastest rank {fast.rank} {fmt.rate(fast.samples_per_s)}: ")
    t.append(f"{gap:.0f}% behind", style="bold red" if gap > 20 else "yellow" if gap > 10 else "green")
    return t


def script_spread_text(state: RunView) -> Text:
    """A script run's balance: its ranks' optimizer steps/s (the step hook's), slowest and fastest."""
    b = state.script_balance()  # the rule (engine/runs/view.py): nothing where nothing was timed
    if b is None:
        return Text("")
    if "slow" not in b:
        return Text(f"rank balance: {b['timing']} of {b['world']} ranks timing their optimizer steps", style="dim")
    slow, fast, gap = b["slow"], b["fast"], b["gap"]
    t = Text(f"rank balance: slowest rank {slow.rank} {fmt.steps_rate(slow.steps_per_s)} steps/s, "
             f"fastest rank {fast.rank} {fmt.steps_rate(fast.steps_per_s)}: ")
    if not b["enough"]:
        t.append("too few steps to compare", style="dim")
        return t
    t.append(f"{gap:.0f}% behind", style="bold red" if gap > 20 else "yellow" if gap > 10 else "green")
    return t


def balance_text(state: RunView, width: int) -> Text | None:
    """The balance line (engine.runs.view.balance_line, as the CLI says it) when it fits the width;
    else shortened on purpose, never cut mid-word: the slow rank with its main cause's share, and
    the rank that waits most, on a line each when they do not fit together."""
    line = state.balance_line()
    if line is None:
        return None
    b = state.balance()
    style = "green" if b["even"] else "yellow"
    if cell_len(line) <= width:
        return Text(line, style=style)
    many = fleet.multi_node(state)

    def who(r: int) -> str:
        return f"rank {r} (node {fleet.node_of(state.ranks[r])})" if many else f"rank {r}"

    if b["even"]:
        parts = [f"rank balance: even ({who(b['rank'])}: {b[b['cause']]:.0%} {b['cause']})"]
    else:
        parts = [f"{who(b['rank'])} holds the others back: {b[b['cause']]:.0%} {b['cause']}",
                 f"{who(b['waiter'])} waits {b['waits']:.0%} in the all-reduce"]
    one = "; ".join(parts)
    return Text(one if cell_len(one) <= width else "\n".join(parts), style=style)


class RanksPane(Vertical):
    """One row widget per rank, each repainted only when its own line changed."""

    def compose(self):
        yield TextPane(id="rank-head", classes="rank-row")
        yield Vertical(id="rank-rows")
        yield TextPane(id="rank-spread")

    def show(self, state: RunView, now: float) -> None:
        width = self.query_one("#rank-head", TextPane).width(120)
        head = script_rank_header(width) if kind_of(state).is_script else rank_header(width, state)
        self.query_one("#rank-head", TextPane).show(head)
        rows = self.query_one("#rank-rows", Vertical)
        have = {w.rank: w for w in rows.children if isinstance(w, RankRow)}
        ranks = state.rank_list()
        for r in ranks:  # in rank order, whatever order they first reported in
            if r.rank not in have:
                row = have[r.rank] = RankRow(r.rank)
                after = [w for k, w in have.items() if k > r.rank and w is not row]
                rows.mount(row, before=min(after, key=lambda w: w.rank) if after else None)
        for r in ranks:
            have[r.rank].show(rank_text(state, r, now, width))
        if ranks and kind_of(state).is_script:
            self.query_one("#rank-spread", TextPane).show(script_spread_text(state))
        elif not ranks:
            self.query_one("#rank-spread", TextPane).show(
                Text("no rank has reported yet", style="dim") if not state.final else Text("no rank reported"))
        else:
            balance = balance_text(state, width)  # who the others wait for, and why; else the rates' spread
            self.query_one("#rank-spread", TextPane).show(balance or rank_spread_text(state))


class RankRow(TextPane):
    def __init__(self, rank: int):
        super().__init__(id=f"rank-{rank}", classes="rank-row")
        self.rank = rank


# ----------------------------------------------------------------------------- curves


class Curves(Horizontal):
    """Loss and accuracy plots (a task without accuracy: its extra metrics instead, or the loss
    alone); plotext is costly, so they redraw at most once a second and only when a point was added."""

    def compose(self):
        from textual_plotext import PlotextPlot

        yield Static("no training steps yet", id="curves-empty")
        yield PlotextPlot(id="plot-loss")
        yield PlotextPlot(id="plot-acc")

    def on_mount(self) -> None:
        self._drawn = -1

    def show(self, state: RunView) -> None:
        if state.curve_version == self._drawn:
            return
        self._drawn = state.curve_version
        from textual_plotext import PlotextPlot

        loss = self.query_one("#plot-loss", PlotextPlot)
        acc = self.query_one("#plot-acc", PlotextPlot)
        empty = not state.steps.points and not state.epochs and not state.step_metrics
        self.query_one("#curves-empty").display = empty
        ep = [state.epochs[k] for k in sorted(state.epochs)]
        accuracy = bool(state.step_acc.points) or any(e.train_acc is not None or e.val_acc is not None for e in ep)
        extra = metric_series(state, ep) if not accuracy else {}
        loss.display = not empty
        acc.display = not empty and (accuracy or bool(extra))  # neither: the loss takes the width
        if empty:
            return
        # No legend inside the plots (it covered the newest points, top left or right): the title
        # says which mark is which.
        series = {
            loss: ("loss  ⠿ step o epoch x val", 1.0, [(state.steps.points,
                   [(e.step, e.train_loss) for e in ep if e.train_loss is not None],
                   [(e.step, e.val_loss) for e in ep if e.val_loss is not None])]),
            acc: ("acc %  ⠿ step o epoch x val", 100.0, [(state.step_acc.points,
                  [(e.step, e.train_acc) for e in ep if e.train_acc is not None],
                  [(e.step, e.val_acc) for e in ep if e.val_acc is not None])]),
        }
        if extra:  # a task without accuracy: its own metrics, one colour each, named in the title
            room = max(12, self.size.width // 2 - 10)  # plotext leaves out a title wider than its plot
            names = " / ".join(metric.label(k) for k in extra)
            title = names + "  ⠿ step o epoch x val" if len(names) + 23 <= room else names
            series[acc] = (title if len(title) <= room else title[:room - 1] + "…", 1.0, list(extra.values()))
        for widget, (title, scale, lines) in series.items():
            p = widget.plt
            p.clear_data()
            p.clear_figure()
            p.title(title)
            p.xlabel("step")
            xs = []
            for i, (steps, train, val) in enumerate(lines):
                colour = {"color": METRIC_COLOURS[i % len(METRIC_COLOURS)]} if extra and widget is acc else {}
                xs += [x for x, _ in steps] + [x for x, _ in train] + [x for x, _ in val]
                if steps:
                    p.plot([x for x, _ in steps], [scale * y for _, y in steps], marker="braille", **colour)
                for pts, marker in ((train, "o"), (val, "x")):
                    if pts:
                        p.scatter([x for x, _ in pts], [scale * y for _, y in pts], marker=marker, **colour)
            ticks = step_ticks(min(xs), max(xs)) if xs else []
            if ticks:
                p.xticks(ticks, [str(t) for t in ticks])
            widget.refresh()


METRIC_COLOURS = ("cyan", "magenta", "yellow", "green")  # at most this many extra metrics are plotted


def metric_series(state: RunView, ep: list) -> dict:
    """A task's extra metrics as curves: name -> (step points, epoch-end train points, val
    points); the step events' metrics (the curve's rank) and the epochs' train_metrics and
    val_metrics (perplexity) by the same name, the first METRIC_COLOURS of them."""
    names = list(state.step_metrics)
    for e in ep:
        names += [k for k in list(e.train_metrics) + list(e.val_metrics) if k not in names]
    out = {}
    for name in names[:len(METRIC_COLOURS)]:
        steps = state.step_metrics[name].points if name in state.step_metrics else []
        out[name] = (steps, [(e.step, e.train_metrics[name]) for e in ep if name in e.train_metrics],
                     [(e.step, e.val_metrics[name]) for e in ep if name in e.val_metrics])
    return out


def step_ticks(lo: float, hi: float, most: int = 5) -> list[int]:
    """Whole step numbers for the x axis (plotext's own ticks are fractions: 55.5, 101.0),
    spaced 1, 2, 5, 10, 20, 50 ... apart, at most `most` of them."""
    lo, hi = int(lo), int(hi)
    if hi <= lo:
        return [lo]
    gap = 1
    while (hi - lo) // gap + 1 > most:
        for m in (2, 2.5, 2):
            gap = int(gap * m)
            if (hi - lo) // gap + 1 <= most:
                break
    first = -(-lo // gap) * gap
    return list(range(first, hi + 1, gap))


# ----------------------------------------------------------------------------- log


def short_paths(text: str, home: str = "", width: int = 0) -> str:
    """Paths in a message as they fit the pane: relative to the run's folder when inside it
    (checkpoints/ckpt-64.pt), and a path wider than the pane kept by its tail ('…/runs/x/ckpt-64.pt'),
    so it is never folded inside a word."""
    if home:
        text = text.replace(home.rstrip("/") + "/", "")
    if width <= 8 or all(len(w) <= width for w in text.split(" ")):
        return text
    out = []
    for w in text.split(" "):
        if len(w) > width and "/" in w:
            parts, tail = w.split("/"), ""
            while parts and len(tail) + len(parts[-1]) + 3 <= width:
                tail = "/" + parts.pop() + tail
            w = "…" + tail if tail else "…" + w[-(width - 1):]
        out.append(w)
    return " ".join(out)


def log_lines(line, prefix: bool = True, home: str = "", width: int = 0) -> list[Text]:
    who = "supervisor" if line.rank is None else f"rank {line.rank}"
    if line.level == "output":  # one rank's log alone reads as its file: no prefix
        return [Text.assemble((f"{who} │ " if prefix else "", "dim bold"), (line.text, "dim"))]
    style = {"error": "bold red", "warning": "yellow"}.get(line.level, "")
    head = Text()
    head.append(f"[{line.level}] ", style=style or "dim")
    head.append(f"{who}: ", style=style or "bold")
    head.append(short_paths(line.text, home, width), style=style)
    out = [head]
    for tb in line.detail.splitlines() if line.detail else []:
        out.append(Text("    " + tb, style="red"))
    return out


class LogPane(RichLog):
    """Log events and errors in time order; errors in red with rank, host and traceback. Lines are
    wrapped to the pane's width when written, so a resize writes them all again at the new width
    (nothing is cut), as does a line that arrived out of time order."""

    def __init__(self, home: str = "", **kw):
        super().__init__(max_lines=2000, min_width=1, wrap=True, markup=False, highlight=False, auto_scroll=True, **kw)
        self.home = home  # the run's folder: paths inside it are shown relative to it
        self.only: int | None = None  # one rank's lines (its rank<N>.log and its events), or None: all
        self._seq = 0
        self._rewrites = 0
        self._state: RunView | None = None
        self._width = 0

    def show(self, state: RunView) -> None:
        """Append the lines added since the last call (seq is the order they arrived in, not
        their place: a line that went in before others makes the view bump log_rewrites)."""
        self._state = state
        if state.log_rewrites != self._rewrites:
            self._rewrite()
            return
        only = self.only
        for line in [ln for ln in state.logs if ln.seq > self._seq and (only is None or ln.rank == only)]:
            for text in log_lines(line, prefix=only is None, home=self.home,
                                  width=self.scrollable_content_region.width):
                self.write(text)
        self._seq = state.log_seq

    def cycle(self, ranks: list[int]) -> int | None:
        """The next view: all -> rank 0 -> rank 1 ... -> all (the ranks known now); written again."""
        if self.only is None:
            self.only = ranks[0] if ranks else None
        else:
            later = [r for r in ranks if r > self.only]
            self.only = later[0] if later else None
        self._rewrite()
        return self.only

    def _rewrite(self) -> None:
        state = self._state
        self.clear()
        self._seq, self._rewrites = 0, 0 if state is None else state.log_rewrites
        if state is not None:
            self.show(state)

    def on_resize(self) -> None:
        width = self.scrollable_content_region.width
        if width != self._width:
            self._width = width
            if self._state is not None:
                self.call_after_refresh(self._rewrite)


class GPUHistory:
    """Utilization history per GPU index (fixed length), fed one sample a second."""

    def __init__(self, n: int = HISTORY):
        self.n = n
        self.by_index: dict[int, deque] = {}

    def add(self, gpus) -> None:
        for g in gpus:
            self.by_index.setdefault(g.index, deque(maxlen=self.n)).append(fmt.real(getattr(g, "util", None)))


__all__ = ["TextPane", "RanksPane", "Curves", "LogPane", "GPUHistory", "header_text", "gpu_text",
           "host_text", "bar", "spark"]
