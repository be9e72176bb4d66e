"""Every node of a run on one screen: its GPUs and host, and its ranks grouped and picked so that a
view of 256 ranks on 32 nodes fits 24 rows.

One model for every node's samples: node 0's own GPUs (the Monitor's sampler, app/sources) and the
other nodes' `node_sample` events (streamed to node 0 and written into its events.jsonl) both go
through `Fleet.add`; the Monitor and `torchdeck run/attach` draw what it derives (`Node.util`,
`Fleet.imbalance`, `rank_picks`, `node_groups`). Torch-free and textual-free, like the rest of
engine.runs; it does not import the reducer (view.py holds a Fleet), it reads a RunView passed in.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from .. import fmt

# RunView and RankState (engine/runs/view.py) are named in annotations only: the reducer imports
# this module, and this one reads a view passed in.

HISTORY = 120  # utilization samples kept per GPU (one a second: two minutes)
IMBALANCE_POINTS = 20.0  # util/memory spread across GPUs worth shouting about
LIST_ALL_UPTO = 8  # ranks; beyond this the views list the ranks worth a look, not every rank
PICK_K = 3  # ranks listed per question (slowest, most data wait) in a run too big to list whole


@dataclass(frozen=True)
class GPU:
    """One GPU at one moment, whichever node it is on; a reading NVML could not get is None.
    Its fields are GPUSample's (app/sources/nvml.py), so a pane draws either."""

    index: int
    name: str = "?"
    util: float | None = None  # 0-100 %
    mem_used_mb: float | None = None
    mem_total_mb: float | None = None
    temp_c: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    pids: tuple = ()
    uuid: str = ""
    mem_util: float | None = None
    fan_pct: float | None = None
    node: int = 0

    @property
    def mem_percent(self) -> float | None:
        if self.mem_used_mb is None or not self.mem_total_mb:
            return None
        return 100.0 * self.mem_used_mb / self.mem_total_mb

    @property
    def label(self) -> str:
        return f"node {self.node} GPU {self.index}"


def _get(src, key):
    return src.get(key) if isinstance(src, dict) else getattr(src, key, None)


def gpu_of(src, node: int) -> GPU | None:
    """A GPU from a node_sample's dict or a sampler's GPUSample; None without a whole index."""
    index = _get(src, "index")
    if isinstance(index, bool) or not isinstance(index, int):
        return None
    pids = _get(src, "pids")
    return GPU(index=index, name=str(_get(src, "name") or "?"), util=fmt.real(_get(src, "util")),
               mem_used_mb=fmt.real(_get(src, "mem_used_mb")), mem_total_mb=fmt.real(_get(src, "mem_total_mb")),
               temp_c=fmt.real(_get(src, "temp_c")), power_w=fmt.real(_get(src, "power_w")),
               power_limit_w=fmt.real(_get(src, "power_limit_w")),
               pids=tuple(p for p in pids if isinstance(p, int)) if isinstance(pids, (list, tuple)) else (),
               uuid=str(_get(src, "uuid") or ""), mem_util=fmt.real(_get(src, "mem_util")),
               fan_pct=fmt.real(_get(src, "fan_pct")), node=node)


@dataclass(frozen=True)
class HostInfo:
    """A node's host: CPU, RAM, load (its processes are shown for the local node only)."""

    cpu_percent: float | None = None
    cores: int = 0
    ram_used_mb: float | None = None
    ram_total_mb: float | None = None
    load1: float | None = None

    @property
    def ram_percent(self) -> float | None:
        if self.ram_used_mb is None or not self.ram_total_mb:
            return None
        return 100.0 * self.ram_used_mb / self.ram_total_mb


def host_of(src) -> HostInfo | None:
    if src is None or isinstance(src, (str, int, float, list)):
        return None
    per = _get(src, "per_cpu")
    return HostInfo(cpu_percent=fmt.real(_get(src, "cpu_percent")), cores=len(per) if isinstance(per, (list, tuple)) else 0,
                    ram_used_mb=fmt.real(_get(src, "ram_used_mb")), ram_total_mb=fmt.real(_get(src, "ram_total_mb")),
                    load1=fmt.real(_get(src, "load1")))


def spread(values) -> tuple[float, float, float] | None:
    """(min, median, max) of the numbers given; None when there are none."""
    vals = sorted(v for v in values if v is not None)
    if not vals:
        return None
    return vals[0], statistics.median(vals), vals[-1]


@dataclass(frozen=True)
class Node:
    """A node's newest sample. Never changed in place (a new sample makes a new Node), so a view's
    snapshot shares them with the reader thread."""

    node_rank: int
    host: str = ""
    gpus: tuple = ()  # GPU, by index
    host_info: HostInfo | None = None
    t: float | None = None  # when it was taken (event time; the local sampler's clock)
    local: bool = False  # sampled here (node 0 seen from the Monitor), not from a node_sample event
    history: tuple = ()  # ((index, (util, ...)), ...): the newest HISTORY utilizations per GPU

    def util(self) -> tuple[float, float, float] | None:
        return spread(g.util for g in self.gpus)

    def mem(self) -> tuple[float, float, float] | None:
        """(min, median, max) percent of memory in use."""
        return spread(g.mem_percent for g in self.gpus)

    def mem_mb(self) -> tuple[float, float, float] | None:
        return spread(g.mem_used_mb for g in self.gpus)

    def mem_total_mb(self) -> float | None:
        return max((g.mem_total_mb for g in self.gpus if g.mem_total_mb), default=None)

    def hottest(self) -> GPU | None:
        hot = [g for g in self.gpus if g.temp_c is not None]
        return max(hot, key=lambda g: (g.temp_c, g.index)) if hot else None

    def util_history(self, index: int) -> tuple:
        return dict(self.history).get(index, ())


class Fleet:
    """The run's nodes, by node rank: what the GPU and host views of a multi-node run draw."""

    def __init__(self) -> None:
        self.nodes: dict[int, Node] = {}
        self.version = 0  # bumps on every sample

    def add(self, node_rank: int, host: str, gpus, host_sample=None, t: float | None = None,
            local: bool = False) -> Node:
        """One node's sample: GPUs as node_sample dicts or GPUSample objects, the host as a dict or
        a HostSample. Each GPU's utilization joins its history."""
        old = self.nodes.get(node_rank)
        readings = sorted((g for g in (gpu_of(x, node_rank) for x in gpus or ()) if g is not None),
                          key=lambda g: g.index)
        hist = dict(old.history) if old is not None else {}
        for g in readings:
            hist[g.index] = hist.get(g.index, ())[-(HISTORY - 1):] + (g.util,)
        node = self.nodes[node_rank] = Node(node_rank, host or (old.host if old else ""), tuple(readings),
                                            host_of(host_sample), t, local, tuple(sorted(hist.items())))
        self.version += 1
        return node

    def copy(self) -> "Fleet":
        c = Fleet()
        c.nodes, c.version = dict(self.nodes), self.version
        return c

    def merged(self, local: "Fleet") -> "Fleet":
        """This fleet (from the run's events) with the nodes a local sampler saw (node 0 seen from
        the Monitor on node 0) where the events say nothing of them: once that node's own
        node_sample events come, they win (the same GPUs, and every front end sees those)."""
        c = self.copy()
        for k, node in local.nodes.items():
            if k not in c.nodes:
                c.nodes[k] = node
        c.version += local.version
        return c

    def node_list(self) -> list[Node]:
        return [self.nodes[k] for k in sorted(self.nodes)]

    def gpus(self) -> list[GPU]:
        return [g for n in self.node_list() for g in n.gpus]

    def imbalance(self) -> dict | None:
        """The spread of utilization and memory across every GPU of the run, with the GPUs at both
        ends; None with fewer than two GPUs."""
        gpus = self.gpus()
        if len(gpus) < 2:
            return None
        out = {"gpus": len(gpus), "nodes": sum(1 for n in self.nodes.values() if n.gpus)}
        for what, key in (("util", lambda g: g.util), ("mem", lambda g: g.mem_percent)):
            have = [g for g in gpus if key(g) is not None]
            if len(have) < 2:
                out[what] = None
                continue
            lo, hi = min(have, key=key), max(have, key=key)
            out[what] = {"spread": key(hi) - key(lo), "lo": lo, "hi": hi,
                         "median": statistics.median(key(g) for g in have), "big": key(hi) - key(lo) > IMBALANCE_POINTS}
        return out

    def imbalance_line(self) -> str | None:
        """One line: the spread of utilization and memory across all GPUs, naming the GPU that
        stands out where the spread is large (the idlest for utilization: a straggler's, a node
        waiting on its link; the fullest for memory: the next to run out)."""
        b = self.imbalance()
        if b is None:
            return None
        parts = []
        for what, d, end in (("util", b["util"], "lo"), ("memory", b["mem"], "hi")):
            if d is None:
                parts.append(f"{what} n/a")
            elif d["big"]:
                g = d[end]
                parts.append(f"{what} {d['spread']:.0f} pts ({g.label} at {_n(_val(g, what))}%, "
                             f"median {d['median']:.0f}%)")
            else:
                parts.append(f"{what} {d['spread']:.0f} pts")
        return "GPU imbalance: " + "; ".join(parts)

    def host_line(self, skip: int | None = None) -> str | None:
        """The other nodes' hosts in one line: CPU and RAM min/median/max, the busiest named."""
        nodes = [n for n in self.node_list() if n.host_info is not None and n.node_rank != skip]
        if not nodes:
            return None
        cpu = spread(n.host_info.cpu_percent for n in nodes)
        ram = spread(n.host_info.ram_percent for n in nodes)
        busiest = max(nodes, key=lambda n: n.host_info.cpu_percent or 0.0)
        who = ("other " if skip is not None else "") + ("node" if len(nodes) == 1 else "nodes")
        text = f"{len(nodes)} {who}: CPU {_trio(cpu)}%  RAM {_trio(ram)}%"
        if cpu is not None:
            text += f"  busiest node {busiest.node_rank} ({_n(busiest.host_info.cpu_percent)}%, load " \
                    f"{fmt.num(busiest.host_info.load1, '.1f')})"
        return text


def _val(g: GPU, what: str) -> float | None:
    return g.util if what == "util" else g.mem_percent


def _n(v: float | None) -> str:
    return fmt.num(v, ".0f")


def _trio(s) -> str:
    return "-" if s is None else f"{s[0]:.0f}/{s[1]:.0f}/{s[2]:.0f}"


def fleet_line(fleet: Fleet) -> str | None:
    """Every GPU of the run in one line: how many, utilization and memory min/median/max, hottest."""
    gpus = fleet.gpus()
    if not gpus:
        return None
    util = spread(g.util for g in gpus)
    mem = spread(g.mem_percent for g in gpus)
    hot = [g for g in gpus if g.temp_c is not None]
    nodes = sum(1 for n in fleet.nodes.values() if n.gpus)
    text = f"GPUs: {len(gpus)} on {nodes} node{'s' if nodes != 1 else ''}  util {_trio(util)}%  mem {_trio(mem)}%"
    if hot:
        h = max(hot, key=lambda g: g.temp_c)
        text += f"  hottest {h.label} {h.temp_c:.0f}°C"
    return text


# ----------------------------------------------------------------------------- ranks at scale


def node_of(r: "RankState") -> int:
    """The node a rank is on (its events' node_rank; an untagged rank is on node 0, where the
    events are written)."""
    return r.node_rank if r.node_rank is not None else 0


def pace(r: "RankState") -> float | None:
    """How fast a rank goes, in the unit its run reports: samples/s, else tokens/s, else optimizer
    steps/s (a user's script that logs nothing)."""
    if r.samples_per_s > 0:
        return r.samples_per_s
    if r.tokens_per_s:
        return r.tokens_per_s
    return r.steps_per_s


def pace_unit(ranks) -> str:
    if any(r.samples_per_s > 0 for r in ranks):
        return "samples/s"
    if any(r.tokens_per_s for r in ranks):
        return "tokens/s"
    return "steps/s"


@dataclass
class Pick:
    why: str  # "stale", "exited", "median", "slowest", "data wait"
    rank: "RankState"
    vs_median: float | None = None  # its pace against the median rank's, -0.34: 34 % slower


def rank_picks(view: "RunView", now: float, k: int = PICK_K, trouble_cap: int = 4) -> tuple[list[Pick], int]:
    """The ranks worth a row in a run too big to list whole, and how many troubled ranks were left
    out: the stale and failed ones first (up to trouble_cap), then the median rank (the reference
    the others are read against), the k slowest, the k with the largest share of data wait. A rank
    in two lists is listed once, under the first."""
    ranks = view.rank_list()
    stale = {r.rank for r in view.stale_ranks(now)}
    trouble = [Pick("exited", r) for r in ranks if r.failed_exit] + [Pick("stale", r) for r in ranks
                                                                        if r.rank in stale and not r.failed_exit]
    left_out = max(0, len(trouble) - trouble_cap)
    picks = trouble[:trouble_cap]
    seen = {p.rank.rank for p in trouble}
    live = [r for r in ranks if r.rank not in seen and (r.exited is None or (view.final and not r.failed_exit))]
    paced = sorted((r for r in live if pace(r)), key=lambda r: (pace(r), r.rank))  # not by step: ranks of one
    # pace would swap places with every step event (a screen that flickers between them)
    med = paced[(len(paced) - 1) // 2] if paced else None
    ref = pace(med) if med is not None else None

    def vs(r):
        p = pace(r)
        return None if not ref or p is None else p / ref - 1.0

    if med is not None:
        picks.append(Pick("median", med, 0.0))
    shown = seen | ({med.rank} if med is not None else set())
    for r in [r for r in paced if r.rank not in shown][:k]:
        if ref is not None and pace(r) >= ref:
            break  # no slower than the median: nothing to see
        picks.append(Pick("slowest", r, vs(r)))
        shown.add(r.rank)
    waits = sorted((r for r in live if r.data_wait and r.rank not in shown), key=lambda r: (-r.data_wait, r.rank))
    for r in waits[:k]:
        picks.append(Pick("data wait", r, vs(r)))
    return picks, left_out


@dataclass
class NodeGroup:
    node: int
    host: str
    ranks: list = field(default_factory=list)
    steps: tuple[int, int] = (0, 0)
    pace: tuple[float, float, float] | None = None  # min, median, max
    wait: float | None = None  # the largest data-wait share among its ranks
    slowest: "RankState | None" = None
    stale: int = 0
    failed: int = 0

    @property
    def rank_span(self) -> str:
        return fmt.rank_span([r.rank for r in self.ranks])


def node_groups(view: "RunView", now: float) -> list[NodeGroup]:
    """The ranks by node: their steps, pace min/median/max, the most data wait, the slowest."""
    stale = {r.rank for r in view.stale_ranks(now)}
    by: dict[int, list] = {}
    for r in view.rank_list():
        by.setdefault(node_of(r), []).append(r)
    out = []
    for node in sorted(by):
        ranks = by[node]
        paced = [r for r in ranks if pace(r) and not r.failed_exit]
        waits = [r.data_wait for r in ranks if r.data_wait is not None]
        out.append(NodeGroup(node, next((r.host for r in ranks if r.host), ""), ranks,
                             (min(r.step for r in ranks), max(r.step for r in ranks)),
                             spread(pace(r) for r in paced), max(waits) if waits else None,
                             min(paced, key=lambda r: (pace(r), r.rank)) if paced else None,
                             sum(r.rank in stale for r in ranks), sum(r.failed_exit for r in ranks)))
    return out


def group_line(g: NodeGroup, unit: str, width: int = 10_000) -> str:
    """node 3 host-03  ranks 24-31  steps 1200-1210  samples/s 590/612/640  wait <=5%  slowest 27"""
    cells = [f"node {g.node:<2}", f"{g.host[:14]:<14}" if g.host else "", f"ranks {g.rank_span:<7}",
             f"steps {g.steps[0]}" + (f"-{g.steps[1]}" if g.steps[1] != g.steps[0] else ""),
             f"{unit} {_rate_trio(g.pace)}", f"wait <={fmt.pct(g.wait, 0)}",
             f"slowest {g.slowest.rank}" if g.slowest is not None else ""]
    if g.stale:
        cells.append(f"{g.stale} STALE")
    if g.failed:
        cells.append(f"{g.failed} exited")
    text = "  ".join(c for c in cells if c)
    return text if len(text) <= width else text[:max(0, width - 1)] + "…"


def _rate_trio(s) -> str:
    return "-" if s is None else "/".join(pace_text(v) for v in s)


def pace_text(v: float) -> str:
    """A pace in its unit (fleet.pace_unit) as every view writes a rate: three figures below 100
    (steps/s), whole and grouped above (samples/s, tokens/s); fmt.steps_rate says why."""
    return fmt.steps_rate(v)


# ----------------------------------------------------------------------------- one row per node

WAIT_FLAG = 0.10  # a node whose ranks wait this share of their step time for data is named
SLOW_FLAG = 0.05  # a node whose median pace is this far behind the others' is named
HOT_C = 83.0  # a GPU this hot is near where datacenter GPUs start to throttle
MEM_FULL = 95.0  # % of a GPU's memory: the next allocation may not fit


def multi_node(view: "RunView") -> bool:
    """A run on several nodes (by its start, its node samples or its ranks' events)."""
    return (view.num_nodes > 1 or len(view.fleet.nodes) > 1
            or len({node_of(r) for r in view.ranks.values()}) > 1)


@dataclass
class NodeRow:
    node: int
    host: str
    group: NodeGroup | None  # its ranks (None: no rank of it reported yet)
    sample: Node | None  # its GPUs and host (None: no sample yet)
    flags: list = field(default_factory=list)  # why it is worth a look: "slow 20%", "hot GPU 3 84°C"

    @property
    def bad(self) -> bool:
        return any(f.startswith(("lost", "stale", "exited")) for f in self.flags)


def node_rows(view: "RunView", fleet: Fleet, now: float) -> list[NodeRow]:
    """Every node, its ranks and its GPUs side by side, those worth a look first (then by node
    rank): stale or exited ranks, a median pace behind the others', the slowest rank, data wait,
    an idle, hot or full GPU. The order changes only when what is wrong changes."""
    groups = {g.node: g for g in node_groups(view, now)}
    keys = sorted(set(groups) | set(fleet.nodes) | set(view.lost_nodes))
    paced = [g.pace[1] for g in groups.values() if g.pace is not None]
    ref = statistics.median(paced) if paced else None
    utils = [g.util for g in fleet.gpus() if g.util is not None]
    util_ref = statistics.median(utils) if utils else None
    picks, _ = rank_picks(view, now)
    slowest = {p.rank.rank: p for p in picks if p.why == "slowest" and (p.vs_median or 0) <= -0.10}
    rows = []
    for k in keys:
        g, n = groups.get(k), fleet.nodes.get(k)
        flags = ["lost"] if k in view.lost_nodes else []  # node 0 stopped hearing its supervisor (node_lost)
        if g is not None:
            if g.failed:
                flags.append(f"exited {g.failed}")
            if g.stale:
                flags.append(f"stale {g.stale}")
            if g.pace is not None and ref and len(paced) > 1 and g.pace[1] < ref * (1 - SLOW_FLAG):
                flags.append(f"slow {1 - g.pace[1] / ref:.0%}")
            else:
                flags += [f"slow rank {r.rank}" for r in g.ranks if r.rank in slowest][:1]
            if g.wait is not None and g.wait >= WAIT_FLAG:
                flags.append(f"data wait {g.wait:.0%}")
        if n is not None and n.gpus:
            idle = [x for x in n.gpus if x.util is not None and util_ref is not None
                    and x.util < util_ref - IMBALANCE_POINTS]
            if idle:
                flags.append(f"idle GPU{'s' if len(idle) > 1 else ''} {min(x.util for x in idle):.0f}%")
            hot = n.hottest()
            if hot is not None and hot.temp_c >= HOT_C:
                flags.append(f"hot GPU {hot.index} {hot.temp_c:.0f}°C")
            full = [x for x in n.gpus if (x.mem_percent or 0) >= MEM_FULL]
            if full:
                flags.append(f"GPU {full[0].index} memory {full[0].mem_percent:.0f}%")
        host = (n.host if n is not None and n.host else "") or (g.host if g is not None else "")
        rows.append(NodeRow(k, host, g, n, flags))
    rows.sort(key=lambda r: (not r.bad, not r.flags, r.node))
    return rows
