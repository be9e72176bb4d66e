"""The catalog of runs: one summary per run directory, for `torchdeck runs` and the Runs screen.

A summary comes from small reads: status.json, the pid files, origin.json, the first and last
few KiB of events.jsonl, and its epoch_end lines (a run's best epoch is anywhere: one streaming
pass, resumed where it stopped while the file grows; never the whole file in memory), folded
through the same reducer and status rule as `torchdeck attach` and the Monitor, so every front
end says the same of a run. A long run with a view checkpoint (view.ckpt.json) is summarized from
it and the events after it instead: no pass over the middle of its file; from its row summary
(view.sum.json, written with the checkpoint: the view without its curves) where it has one.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import UsageError
from ..events import parse
from .. import fmt
from . import metric
from .follow import EventTail
from ..rundir.layout import RunDir, comparison_of, list_runs, pid_alive, runs_root
from ..rundir.status import Status
from .view import RunView, checkpoint
from ..strategies import world_size

HEAD_BYTES = 16 * 1024  # run_started is the first event
TAIL_BYTES = 64 * 1024  # enough for the last step and epoch_end of any run
CHECKPOINT_FROM_BYTES = 1 << 20  # a longer events file is summarized from its view checkpoint ...
CHECKPOINT_TAIL_BYTES = 16 << 20  # ... where at most this much was written after it


@dataclass
class RunSummary:
    key: str  # the run directory's name
    path: Path
    name: str  # the run's name, without the time stamp its directory starts with
    status: Status
    strategy: str = "?"
    world: int | None = None
    started: float | None = None
    duration: float | None = None
    step: int = 0
    total_steps: int = 0
    val_acc: float | None = None
    best_val_acc: float | None = None
    main: str | None = None  # its main validation metric (metric.main_of): val_acc, val_loss, or None yet
    main_value: float | None = None  # that metric's newest value ...
    main_best: float | None = None  # ... and its best, where better than the newest
    root_cause: str | None = None
    pid: int | None = None  # the supervisor's (or torchrun agent's) while it lives
    preset: str = ""
    overrides: list = field(default_factory=list)  # the --set values it was launched with

    @property
    def is_live(self) -> bool:
        return self.status.live

    @property
    def progress(self) -> str:
        if not self.step and not self.total_steps:
            return ""
        return f"{self.step}/{self.total_steps}" if self.total_steps else f"step {self.step}"

    @property
    def val(self) -> str:
        """The main validation metric with its best: 93.4% (best 95.0%) for an accuracy, 1.6021
        (best 1.5900) for a loss (the column's label says which: `columns`)."""
        if self.main is None or self.main_value is None:
            return ""
        best = f" (best {metric.show(self.main, self.main_best)})" if self.main_best is not None else ""
        return metric.show(self.main, self.main_value) + best

    @property
    def differs(self) -> str:
        """What tells this run apart from others of the same preset: its --set values."""
        return " ".join(self.overrides)

    def cells(self) -> dict[str, str]:
        """The row as words, the same in `torchdeck runs` and the Runs screen."""
        return {
            "status": str(self.status),
            "run": self.name,
            "dir": self.key,
            "strategy": self.strategy,
            "world": "?" if self.world is None else str(self.world),
            "started": time.strftime("%m-%d %H:%M", time.localtime(self.started)) if self.started else "-",
            "duration": fmt.duration(self.duration, missing="-"),
            "progress": self.progress,
            "val": self.val,
            "set": self.differs,
        }


# `torchdeck runs`: the directory name is what `attach`, `stop` and `resume` take
COLUMNS = (("status", "STATUS"), ("dir", "RUN"), ("strategy", "STRATEGY"), ("world", "WORLD"),
           ("started", "STARTED"), ("duration", "DURATION"), ("progress", "PROGRESS"), ("val", "VAL ACC"),
           ("set", "--SET"))


def val_label(rows, *labels: str) -> str:
    """The main metric column's label for these runs (metric.column_label: VAL ACC, VAL LOSS)."""
    return metric.column_label((r.main for r in rows), *labels)


def columns(rows) -> tuple[tuple[str, str], ...]:
    """COLUMNS with the main metric's label for these rows."""
    return tuple((k, val_label(rows) if k == "val" else label) for k, label in COLUMNS)


# Left out first in a narrow terminal: the start time is in the run's name already.
NARROW_DROP = ("set", "started", "world", "duration", "strategy")


def read_head_tail(path: Path, tail: EventTail | None = None) -> tuple[list[dict], list[dict]]:
    """The first and the last events of a file, reading at most HEAD_BYTES + TAIL_BYTES, with no
    event in both. `tail` (a fresh EventTail) counts the malformed lines."""
    reader = tail or EventTail(path)
    try:
        with open(path, "rb") as fh:
            head = fh.read(HEAD_BYTES)
            size = fh.seek(0, 2)
            if size <= HEAD_BYTES:
                return reader._parse(head.split(b"\n")[:-1]), []
            start = max(len(head), size - TAIL_BYTES)
            fh.seek(start)
            rest = fh.read(size - start)  # the tail only, however far the file grew since
    except OSError:
        return [], []
    head_lines = head.split(b"\n")
    cut = head_lines.pop()  # a line the head cut in two: it is read with the tail
    rest = cut + rest if start == len(head) else rest
    tail_lines = rest.split(b"\n")[:-1]
    if start > len(head) and tail_lines:
        tail_lines = tail_lines[1:]  # started mid-line
    return reader._parse(head_lines), reader._parse(tail_lines)


SCAN_CHUNK = 1 << 20
EPOCH_MARK = b'"epoch_end"'


class EpochScan:
    """The epoch_end events between a file's head and tail, found by streaming it once: a run's
    best (and every epoch's figures) can be in the middle, which the head and tail never see.
    Kept between calls (collect's cache), a growing file is read on from where the last scan
    stopped; only lines holding an epoch_end are parsed."""

    def __init__(self):
        self.key, self.upto, self.events = None, 0, []

    def scan(self, path: Path, fh, start: int, stop: int) -> list[dict]:
        """The epoch_end events of whole lines in [start, stop) (both at line starts)."""
        try:
            st = path.stat()
            key = (st.st_dev, st.st_ino)
        except OSError:
            key = None
        if key != self.key or not start <= self.upto <= stop:  # another file, or it shrank: from the start
            self.key, self.upto, self.events = key, start, []
        fh.seek(self.upto)
        pos, carry = self.upto, b""
        while pos < stop:
            chunk = fh.read(min(SCAN_CHUNK, stop - pos))
            if not chunk:
                break
            pos += len(chunk)
            data = carry + chunk
            last_nl = data.rfind(b"\n")
            whole, carry = data[:last_nl + 1], data[last_nl + 1:]
            if len(carry) > 16 * SCAN_CHUNK:  # no line is this long: garbage, skipped
                carry = b""
            at = whole.find(EPOCH_MARK)
            while at >= 0:
                end = whole.find(b"\n", at)  # whole ends with one
                ev = parse(whole[whole.rfind(b"\n", 0, at) + 1:end])
                if ev is not None and ev.get("kind") == "epoch_end":
                    self.events.append(ev)
                at = whole.find(EPOCH_MARK, end)
            self.upto = pos - len(carry)  # a line not whole yet is read again next time
        return self.events


def read_parts(path: Path, scan: EpochScan | None = None) -> tuple[list[dict], list[dict], list[dict]]:
    """(head, the epoch_end events between, tail) of an events file: read_head_tail's small reads
    plus one streaming pass (resumed where `scan` stopped) over the middle for its epoch_end lines."""
    scan = scan or EpochScan()
    reader = EventTail(path)
    try:
        with open(path, "rb") as fh:
            head = fh.read(HEAD_BYTES)
            size = fh.seek(0, 2)
            if size <= HEAD_BYTES:
                return reader._parse(head.split(b"\n")[:-1]), [], []
            start = max(len(head), size - TAIL_BYTES)
            fh.seek(start)
            rest = fh.read(size - start)  # the tail only, however far the file grew since
            head_lines = head.split(b"\n")
            cut = head_lines.pop()
            head_end = len(head) - len(cut)
            if start == len(head):  # no middle: the tail goes on from the head's cut line
                return reader._parse(head_lines), [], reader._parse((cut + rest).split(b"\n")[:-1])
            nl = rest.find(b"\n")
            tail_start = start + nl + 1 if nl >= 0 else start + len(rest)
            middle = scan.scan(path, fh, head_end, tail_start)
    except OSError:
        return [], [], []
    tail_lines = rest[tail_start - start:].split(b"\n")[:-1]
    return reader._parse(head_lines), list(middle), reader._parse(tail_lines)


def _config_facts(rd: RunDir) -> tuple[str, int | None]:
    """Strategy and world size from config.yaml, for runs whose events do not say yet."""
    try:
        cfg = rd.config()
        return cfg.strategy, world_size(cfg)
    except Exception:  # an unreadable or old config still gets a row
        pass
    try:
        import yaml

        data = yaml.safe_load(rd.config_path.read_text()) or {}
        return str(data.get("strategy", "?")) if isinstance(data, dict) else "?", None
    except Exception:
        return "?", None


def _from_checkpoint(rd: RunDir) -> RunView | None:
    """The whole run's view, from its view checkpoint and the events after it, where it has one it
    can trust and the file is long enough for it to pay (a short file's head and tail are cheaper)."""
    try:
        size = rd.events_path.stat().st_size
    except OSError:
        return None
    if size < CHECKPOINT_FROM_BYTES:
        return None
    got = checkpoint.load_row(rd.events_path)  # the row summary: a few fields, not the curves
    if got is None or size - got[1] > CHECKPOINT_TAIL_BYTES:
        got = checkpoint.load(rd.events_path, None)  # a run without one: its whole checkpoint
    if got is None or size - got[1] > CHECKPOINT_TAIL_BYTES:
        return None
    view, offset, _ = got
    tail = EventTail(rd.events_path)
    tail.start_at(offset)
    tail.feed(view.feed)
    return view


def _fold(rd: RunDir, scan: EpochScan | None = None) -> tuple[RunView, float | None]:
    """A RunView of the head, every epoch_end and the tail of the events, and the newest event time
    (or of every event, from the run's view checkpoint)."""
    view = _from_checkpoint(rd)
    if view is not None:
        return view, view.last_t
    view = RunView()
    for part in read_parts(rd.events_path, scan):
        view.feed_all(part)
    return view, view.last_t


def summarize(rd: RunDir, now: float | None = None, folded=None) -> RunSummary:
    now = time.time() if now is None else now
    view, last_t = folded if folded is not None else _fold(rd)
    view = view.snapshot()  # observe() below must not leak into a cached fold
    final = rd.final_status()
    pid = rd.owner_pid()
    alive = final is None and rd.owner_alive()  # a SLURM run: its job, as SLURM says
    final = final or rd.final_status()  # owner_alive may have recorded a SLURM job's end
    view.observe(final, alive, pid is not None, rd.quiet_s(now), now)
    strategy, world = view.strategy, view.world_size or None
    if strategy == "?" or world is None:
        cs, cw = _config_facts(rd)
        strategy = cs if strategy == "?" else strategy
        world = cw if world is None else world
    started = view.started_t or rd.stamp_time
    if started is None:
        try:
            started = rd.config_path.stat().st_mtime
        except OSError:
            started = None
    elapsed = (final or {}).get("elapsed_s")
    if isinstance(elapsed, (int, float)) and not isinstance(elapsed, bool):
        duration = float(elapsed)
    elif started is None:
        duration = None
    elif view.status.live:
        duration = now - started
    else:
        duration = (last_t - started) if last_t else None
    step, total = view.progress()
    origin = rd.origin()
    overrides = origin.get("overrides") if isinstance(origin.get("overrides"), list) else []
    return RunSummary(
        key=rd.name, path=rd.path, name=rd.short_name, status=view.status, strategy=strategy,
        world=world if isinstance(world, int) else None, started=started, duration=duration,
        step=step, total_steps=total, val_acc=view.latest_val_acc(), best_val_acc=view.best_val_acc,
        **_main(view),
        root_cause=view.root_cause, pid=pid if alive else None, preset=str(origin.get("preset") or ""),
        overrides=[str(o) for o in overrides])


def _main(view: RunView) -> dict:
    m = view.main()
    return {} if m is None else {"main": m[0], "main_value": m[1], "main_best": m[2]}


def _signature(rd: RunDir) -> tuple:
    sig = []
    for p in (rd.events_path, rd.status_path):
        try:
            st = p.stat()
            sig.append((st.st_size, st.st_mtime_ns))
        except OSError:
            sig.append(None)
    return tuple(sig)


def collect(root: Path | None = None, cache: dict | None = None, now: float | None = None) -> list[RunSummary]:
    """One summary per run directory under `root`, newest first. `cache` keeps the folded events
    of runs whose files did not change since the last call."""
    root = Path(root) if root else runs_root()
    cache = {} if cache is None else cache
    now = time.time() if now is None else now
    rows, seen = [], set()
    for rd in list_runs(root):
        seen.add(rd.name)
        sig = _signature(rd)
        hit = cache.get(rd.name)
        if hit is None or hit[0] != sig:
            scan = hit[2] if hit is not None else EpochScan()  # a live run's file: read on, not again
            hit = cache[rd.name] = (sig, _fold(rd, scan), scan)
        rows.append(summarize(rd, now, hit[1]))
    for gone in set(cache) - seen:
        del cache[gone]
    rows.sort(key=lambda r: (r.started or 0.0, r.key), reverse=True)
    return rows


def find_run(ref: str, root: Path | None = None) -> RunDir:
    """A run from what a user types: a run directory, its name under the runs root, or 'latest'."""
    root = Path(root).resolve() if root else runs_root()
    if ref == "latest":
        runs = list_runs(root)
        if not runs:
            raise UsageError(f"no runs under {root} (start one with `torchdeck run PRESET`)")
        return runs[0]
    p = Path(ref).expanduser()
    for cand in (p, root / ref):
        if RunDir(cand).config_path.is_file():
            return RunDir(cand.resolve())
    for rd in list_runs(root):  # a run of a comparison, by its name
        if rd.name == ref:
            return RunDir(rd.path.resolve())
    raise UsageError(f"no run {ref!r}: give a run directory, a name under {root}, or 'latest' "
                     f"(`torchdeck runs` lists them)")


def deletable(path: Path, root: Path) -> str | None:
    """Why this run directory must not be deleted now, or None when it may be."""
    path, root = Path(path), Path(root)
    parent = path.resolve().parent
    in_comparison = parent.parent == root.resolve() and comparison_of(RunDir(path)) is not None
    if (parent != root.resolve() and not in_comparison) or not RunDir(path).config_path.is_file():
        return f"{path} is not a run directory under {root}; not deleting it"
    rd = RunDir(path)
    if not rd.status().live:
        return None
    pid = rd.owner_pid()
    if pid is None:
        return f"run {rd.name} is still starting: wait for it, or stop it from its Monitor screen"
    return (f"run {rd.name} is live (supervisor pid {pid}): open it (enter) and stop it first, or wait "
            "until it ends")
