"""The Monitor of a run on many nodes (issue 31): the ranks worth a look instead of a row per rank,
and a row per node (its ranks' pace and data wait, its GPUs' utilization and memory min/median/
max, its hottest GPU, why it is worth a look) that opens into its GPUs.

What to show is decided in the engine (engine/runs/fleet.py: rank_picks, node_rows), which
`torchdeck run/attach` prints too; this module only draws it. Node 0's own GPUs (the Monitor's
sampler) and the other nodes' node_sample events are one Fleet by the time they reach here.
"""
from __future__ import annotations

import re

from rich.text import Text
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll

from ...engine.runs import fleet as fl
from ...engine import fmt
from ...engine.kinds import kind_of
from ...engine.runs.view import RunView
from .panes import (SEP, RanksPane, TextPane, balance_text, gpu_ranks, gpu_row, rank_header, rank_spread_text, rank_text,
                    script_rank_header, script_spread_text)

LIST_ALL_UPTO = fl.LIST_ALL_UPTO  # ranks; beyond this a row per rank pushes the GPU, host and curves panes off
LABEL_W = 10  # the pick's label column ("data wait", "slowest") in front of a rank's row
LABEL_STYLE = {"median": "dim", "slowest": "bold yellow", "data wait": "bold cyan", "stale": "bold red reverse",
               "exited": "bold red"}


# ----------------------------------------------------------------------------- ranks


def _rank_head(state: RunView, width: int) -> Text:
    return script_rank_header(width) if kind_of(state).is_script else rank_header(width, state)


def ranks_summary(state: RunView, now: float, width: int) -> Text:
    """256 ranks on 32 nodes · samples/s min 352 · median 636 · max 640 · steps 120"""
    ranks = state.rank_list()
    unit = fl.pace_unit(ranks)
    paces = fl.spread(fl.pace(r) for r in ranks if not r.failed_exit)
    steps = [r.step for r in ranks]
    n = len({fl.node_of(r) for r in ranks})
    t = Text(f"{len(ranks)} ranks" + (f" on {n} nodes" if n > 1 else ""), style="bold")
    items = []
    if paces is not None:
        lo, med, hi = (fl.pace_text(v) for v in paces)
        items.append(f"{unit} min {lo}, median {med}, max {hi}")
    items.append(f"steps {min(steps)}" + (f"-{max(steps)}" if max(steps) != min(steps) else ""))
    for item in items:  # whole items only: the steps are left out at 80 columns, not cut to 'steps…'
        if t.cell_len + len(SEP) + len(item) <= width:
            t.append(SEP + item)
    return _cut(t, width)


def pick_text(state: RunView, p: fl.Pick, now: float, width: int) -> Text:
    t = Text()
    t.append(f"{p.why:<{LABEL_W}}"[:LABEL_W], style=LABEL_STYLE.get(p.why, ""))
    t.append_text(rank_text(state, p.rank, now, width - LABEL_W))
    return t


def _cut(t: Text, width: int) -> Text:
    if t.cell_len > width:
        t.truncate(max(1, width - 1))
        t.append("…")
    return t


class PickRow(TextPane):
    pass


class FleetRanksPane(RanksPane):
    """RanksPane, and for a run of more than LIST_ALL_UPTO ranks: a summary line, the ranks worth a
    look (stale and exited first, the median rank as the reference, the slowest, those waiting
    most for data) with their label in front, and the balance line as for a small run."""

    def show(self, state: RunView, now: float) -> None:
        ranks = state.rank_list()
        rows = self.query_one("#rank-rows", Vertical)
        if len(ranks) <= LIST_ALL_UPTO:
            for w in [w for w in rows.children if isinstance(w, PickRow)]:
                w.remove()
            super().show(state, now)
            return
        for w in [w for w in rows.children if not isinstance(w, PickRow)]:
            w.remove()  # the rows of the first ranks to report, before the run showed its size
        head = self.query_one("#rank-head", TextPane)
        width = head.width(120)
        label = Text(" " * LABEL_W)
        label.append_text(_rank_head(state, width - LABEL_W))
        head.show(label)
        picks, left_out = fl.rank_picks(state, now)
        lines = [ranks_summary(state, now, width)] + [pick_text(state, p, now, width) for p in picks]
        if left_out:
            lines.append(Text(f"{'':<{LABEL_W}}... and {left_out} more stale or exited ranks", style="bold red"))
        slots = [w for w in rows.children if isinstance(w, PickRow)]
        if len(slots) < len(lines):
            new = [PickRow(classes="rank-row") for _ in range(len(lines) - len(slots))]
            rows.mount(*new)
            slots += new
        for w in slots[len(lines):]:
            w.remove()
        for w, text in zip(slots, lines):
            w.show(text)
        spread = self.query_one("#rank-spread", TextPane)
        if kind_of(state).is_script:
            spread.show(script_spread_text(state))
            return
        spread.show(balance_text(state, width) or rank_spread_text(state))


# ----------------------------------------------------------------------------- nodes


def _wide(width: int) -> bool:
    return width >= 100


def node_header(width: int, unit: str) -> Text:
    if _wide(width):
        text = (f"  {'node':>4} {'host':<13} {'ranks':<9} {unit:>9} {'wait':>5}  {'util min/med/max':>16}  "
                f"{'memory min/med/max':<24} {'hottest':<11} look at")
    else:
        short = {"samples/s": "smp/s", "tokens/s": "tok/s", "steps/s": "stp/s"}.get(unit, unit[:5])
        text = f"  {'node':>3} {'ranks':<7} {short:>5} {'wait':>4} {'util %':>8} {'memory G':>9} {'hottest':<7}"
    return _cut(Text(text, style="bold"), width)


def node_text(row: fl.NodeRow, width: int, is_open: bool, unit: str) -> Text:
    """▸ 17 gpu-node-17 136-143  512  3%  56/ 58/ 60%  59.6/61.3/63.5G of 80G  GPU 3 67°C  slow 20%"""
    g, n = row.group, row.sample
    pace = fl.pace_text(g.pace[1]) if g is not None and g.pace is not None else "-"
    wait = fmt.pct(g.wait, 0) if g is not None else "-"
    ranks = g.rank_span if g is not None else "-"
    util = n.util() if n is not None else None
    mem = n.mem_mb() if n is not None else None
    hot = n.hottest() if n is not None else None
    util_s = "-" if util is None else "/".join(f"{v:>3.0f}" for v in util) + "%"
    mem_s = "-" if mem is None else "/".join(f"{v / 1024:.1f}" for v in mem) + "G"
    hot_s = "-" if hot is None else f"GPU {hot.index} {hot.temp_c:.0f}°C"
    t = Text("▾ " if is_open else "▸ ", style="bold")
    t.append(f"{row.node:>4}" if _wide(width) else f"{row.node:>3}", style="bold")
    if _wide(width):
        tot = n.mem_total_mb() if n is not None else None
        mem_s += f" of {fmt.mib(tot)}" if tot and mem is not None else ""
        t.append(f" {row.host[:13]:<13} {ranks[:9]:<9} {pace:>9} {wait:>5}  {util_s:>16}  {mem_s:<24} {hot_s:<11}")
    else:
        util_s = "-" if util is None else "/".join(f"{v:.0f}" for v in util)
        mem_s = "-" if mem is None else "/".join(f"{v / 1024:.0f}" for v in mem) + "G"
        hot_s = "-" if hot is None else f"g{hot.index} {hot.temp_c:.0f}°C"
        t.append(f" {ranks[:7]:<7} {pace:>5} {wait:>4} {util_s:>8} {mem_s:>9} {hot_s:<7}")
    if row.flags:
        flags = row.flags if _wide(width) else narrow_flags(row.flags, width - t.cell_len - 1)
        t.append(" ")
        t.append(", ".join(flags), style="bold red" if row.bad else "yellow")
    return _cut(t, width)


# At 80 columns a node's flags lose what its columns already say (the wait, the hottest GPU and
# its temperature) and keep the word: 'hot GP…' read as nothing.
_SHORT_FLAGS = [(re.compile(r"^data wait \d+%$"), "data wait"), (re.compile(r"^hot GPU \d+ .*"), "hot GPU"),
                (re.compile(r"^(idle GPUs?) .*"), r"\1"), (re.compile(r"^slow rank (\d+)$"), r"slow r\1"),
                (re.compile(r"^GPU (\d+) memory (\d+%)$"), r"g\1 mem \2")]


def narrow_flags(flags: list[str], room: int) -> list[str]:
    """The flags in their short words, as many as fit whole, then '+N' for the rest."""
    short = []
    for f in flags:
        for pat, repl in _SHORT_FLAGS:
            if pat.match(f):
                f = pat.sub(repl, f)
                break
        short.append(f)
    for n in range(len(short), 0, -1):
        shown = short[:n] + ([f"+{len(short) - n}"] if n < len(short) else [])
        if len(", ".join(shown)) <= room:
            return shown
    return [f"+{len(short)}"] if room >= 3 else []


def node_gpus_text(row: fl.NodeRow, state: RunView, width: int, family: dict | None) -> Text:
    """An open node's GPUs, a row each as a one-node run shows them, under its row."""
    n = row.sample
    if n is None or not n.gpus:
        return Text("    no GPU sample from this node yet" if n is None else "    no GPU on this node (NVML)",
                    style="dim")
    t = Text()
    for i, g in enumerate(n.gpus):
        if n.local:  # this host's processes: the ranks by their pids, else by the devices they reported
            ranks = gpu_ranks(g, state, family)
        else:
            ranks = sorted(r.rank for r in state.rank_list() if fl.node_of(r) == row.node
                           and f"cuda:{g.index}" in [d.strip() for d in r.device.split(",")])
        if i:
            t.append("\n")
        t.append("    ")
        t.append_text(gpu_row(g, ranks, n.util_history(g.index), width - 4))
    return t


class NodeHead(TextPane):
    """A node's row: click it (or Enter on it) to open its GPUs; again to close them."""

    can_focus = True
    BINDINGS = [Binding("enter", "toggle", "Open/close node")]

    def __init__(self, **kw):
        super().__init__(classes="node-head", **kw)
        self.node: int | None = None

    def action_toggle(self) -> None:
        pane = next((a for a in self.ancestors if isinstance(a, NodesPane)), None)
        if pane is not None and self.node is not None:
            pane.toggle(self.node)

    def on_click(self) -> None:
        self.focus()
        self.action_toggle()


class NodeSlot(Vertical):
    """One place in the node list: a node's row and, when open, its GPUs (made with it, so that the
    show that mounts it fills it)."""

    def __init__(self):
        self.head = NodeHead()
        self.gpus = TextPane(classes="node-gpus")
        self.gpus.display = False
        super().__init__(self.head, self.gpus)


class NodesPane(Vertical):
    """Every node of the run, worth-a-look ones first, in a list that scrolls past its height; an
    open node shows its GPUs; the imbalance across all GPUs below."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.open: int | None = None
        self._last = None  # what the last show() drew from, for a toggle's redraw
        self.order: list[int] = []  # the nodes in the order shown

    def compose(self):
        yield TextPane(id="nodes-head")
        yield VerticalScroll(id="node-rows")
        yield TextPane(id="nodes-foot")

    def toggle(self, node: int) -> None:
        self.open = None if self.open == node else node
        if self._last is not None:
            self.show(*self._last)

    def next_node(self) -> int | None:
        """Open the next node in the list (the first when none is open); after the last, none."""
        if not self.order:
            return None
        if self.open is None or self.open not in self.order:
            self.open = self.order[0]
        else:
            i = self.order.index(self.open) + 1
            self.open = self.order[i] if i < len(self.order) else None
        if self._last is not None:
            self.show(*self._last)
        if self.open is not None:
            slot = self._slot_of(self.open)
            if slot is not None:
                # Not focus's own scroll: it centres the head on the old layout (the node closed above
                # it still open), so the list jumped or not by timing; the whole slot once laid out.
                slot.head.focus(scroll_visible=False)
                self.call_after_refresh(slot.scroll_visible)
        return self.open

    def _slot_of(self, node: int):
        for slot in self.query_one("#node-rows").children:
            if isinstance(slot, NodeSlot) and slot.head.node == node:
                return slot
        return None

    def show(self, state: RunView, fleet: fl.Fleet, now: float, family: dict | None = None) -> None:
        self._last = (state, fleet, now, family)
        width = self.query_one("#nodes-head", TextPane).width(100)
        unit = fl.pace_unit(state.rank_list())
        rows = fl.node_rows(state, fleet, now)
        self.order = [r.node for r in rows]
        self.query_one("#nodes-head", TextPane).show(node_header(width, unit))
        box = self.query_one("#node-rows", VerticalScroll)
        slots = [w for w in box.children if isinstance(w, NodeSlot)]
        if len(slots) < len(rows):
            new = [NodeSlot() for _ in range(len(rows) - len(slots))]
            box.mount(*new)
            slots += new
        for slot in slots[len(rows):]:
            slot.remove()
        for slot, row in zip(slots, rows):
            head = slot.head
            head.node = row.node
            is_open = row.node == self.open
            head.show(node_text(row, width - 1, is_open, unit))  # 1: the list's scroll bar
            gpus = slot.gpus
            gpus.display = is_open
            if is_open:
                gpus.show(node_gpus_text(row, state, width - 1, family))
        foot = [fleet.imbalance_line() or "GPU imbalance: fewer than two GPUs sampled yet"]
        self.query_one("#nodes-foot", TextPane).show(_cut(Text(foot[0]), width) if len(foot[0]) > width
                                                      else Text(foot[0]))


def other_hosts_text(fleet: fl.Fleet, local: int = 0) -> Text | None:
    line = fleet.host_line(skip=local)
    return None if line is None else Text(line, style="dim")
