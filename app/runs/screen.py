"""The Runs list: past and live runs from their run directories, to open (watch or review) or delete.

Everything shown comes from small reads: `status.json`, the supervisor's pid, and the first and
last few KiB of `events.jsonl` (never the whole file: a long run's is hundreds of MiB). Those
reads run in a thread worker; the next poll is scheduled when one is done, so polls never pile
up on a slow disk, and polling pauses while another screen (the Monitor) covers this one.
"""
from __future__ import annotations

import json
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from rich.text import Text
from textual import work
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static

from engine.progress import fmt_duration
from engine.rundir import RunDir, list_runs, runs_root

REFRESH_S = 2.0
HEAD_BYTES = 16 * 1024  # run_started is the first event
TAIL_BYTES = 64 * 1024  # enough for the last step and epoch_end of any run
YOUNG_S = 60.0  # a run dir without a supervisor pid yet may still be starting
LIVE = ("running", "starting")

_STAMP = re.compile(r"^(\d{8}-\d{6})-(.+)$")
_STYLE = {"live": "bold green", "starting": "cyan", "finished": "green", "failed": "bold red",
          "stopped": "yellow", "lost": "red"}
COLUMNS = (("status", "Status"), ("run", "Run"), ("strategy", "Strategy"), ("world", "World"),
           ("started", "Started"), ("duration", "Duration"), ("progress", "Progress"))


@dataclass
class RunRow:
    key: str  # the run directory's name
    path: Path
    name: str  # the run's name, without the time stamp its directory starts with
    status: str  # live | starting | finished | failed | stopped | lost
    strategy: str = "?"
    world: int | None = None
    started: float | None = None
    duration: float | None = None
    progress: str = ""
    root_cause: str | None = None
    pid: int | None = None  # the supervisor's, from supervisor.pid

    @property
    def is_live(self) -> bool:
        return self.status in ("live", "starting")

    def cells(self) -> dict[str, Text]:
        return {
            "status": Text(self.status, style=_STYLE.get(self.status, "")),
            "run": Text(self.name),
            "strategy": Text(self.strategy),
            "world": Text("?" if self.world is None else str(self.world), justify="right"),
            "started": Text(time.strftime("%m-%d %H:%M", time.localtime(self.started)) if self.started else "-"),
            "duration": Text(fmt_duration(self.duration, missing="-", pad_minutes=False), justify="right"),
            "progress": Text(self.progress),
        }


# ------------------------------------------------------------------------------- reading runs

def _lines(data: bytes, cut_first: bool) -> list[dict]:
    """Complete JSON lines of a chunk; the first is cut when the chunk starts mid-file."""
    parts = data.split(b"\n")
    parts.pop()  # after the last newline: empty, or a line still being written
    if cut_first and parts:
        parts.pop(0)
    out = []
    for line in parts:
        try:
            ev = json.loads(line)
        except ValueError:
            continue
        if isinstance(ev, dict):
            out.append(ev)
    return out


def read_head_tail(path: Path) -> tuple[list[dict], list[dict]]:
    """The first and the last events of a file, reading at most HEAD_BYTES + TAIL_BYTES."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(HEAD_BYTES)
            size = fh.seek(0, 2)
            if size <= HEAD_BYTES:
                evs = _lines(head, False)
                return evs, evs
            start = max(0, size - TAIL_BYTES)
            fh.seek(start)
            tail = fh.read()
    except OSError:
        return [], []
    return _lines(head, False), _lines(tail, start > 0)


def _stamp_time(dirname: str) -> float | None:
    m = _STAMP.match(dirname)
    if not m:
        return None
    try:
        return time.mktime(time.strptime(m.group(1), "%Y%m%d-%H%M%S"))
    except ValueError:
        return None


def _config_facts(rd: RunDir) -> tuple[str, int | None]:
    """Strategy and world size from config.yaml, for runs whose events do not say yet."""
    try:
        cfg = rd.config()
        return cfg.strategy, cfg.world_size
    except Exception:  # an unreadable or old config still gets a row
        pass
    try:
        import yaml

        data = yaml.safe_load(rd.config_path.read_text()) or {}
        return str(data.get("strategy", "?")), None
    except Exception:
        return "?", None


def _static_facts(rd: RunDir) -> dict:
    """What only changes when the events or the status file change."""
    head, tail = read_head_tail(rd.events_path)
    started = next((e for e in head if e.get("kind") == "run_started"), None)
    facts: dict = {}
    if started:
        facts["strategy"] = str(started.get("strategy", "?"))
        facts["world"] = started.get("world_size")
        facts["started"] = started.get("t")
    else:
        facts["strategy"], facts["world"] = _config_facts(rd)
    if facts.get("started") is None:
        facts["started"] = _stamp_time(rd.name)
    try:
        facts["created"] = rd.config_path.stat().st_mtime
    except OSError:
        facts["created"] = None
    if facts["started"] is None:
        facts["started"] = facts["created"]
    last_t = max((e["t"] for e in tail if isinstance(e.get("t"), (int, float))), default=None)
    step = next((e for e in reversed(tail) if e.get("kind") == "step"), None)
    epoch = next((e for e in reversed(tail) if e.get("kind") == "epoch_end"
                  and e.get("val_acc") is not None), None)
    parts = []
    if step is not None:
        total = step.get("total_steps")
        parts.append(f"{step.get('step')}/{total}" if total else f"step {step.get('step')}")
    if epoch is not None:
        parts.append(f"val {100 * float(epoch['val_acc']):.1f}%")
    facts["progress"] = "  ".join(parts)
    facts["last_t"] = last_t
    final = rd.final_status() or {}
    facts["final"] = final
    return facts


def _signature(rd: RunDir) -> tuple:
    sig = []
    for p in (rd.events_path, rd.status_path):
        try:
            st = p.stat()
            sig.append((st.st_size, st.st_mtime_ns))
        except OSError:
            sig.append(None)
    return tuple(sig)


def collect(root: Path, cache: dict | None = None, now: float | None = None) -> list[RunRow]:
    """One row per run directory under `root`, newest first. `cache` keeps unchanged runs' facts."""
    cache = {} if cache is None else cache
    now = time.time() if now is None else now
    rows = []
    seen = set()
    for rd in list_runs(root):
        key = rd.name
        seen.add(key)
        sig = _signature(rd)
        hit = cache.get(key)
        if hit is None or hit[0] != sig:
            hit = (sig, _static_facts(rd))
            cache[key] = hit
        facts = hit[1]
        status = rd.status()
        status = "live" if status == "running" else status
        if status == "starting":  # no supervisor pid yet: only believable for a short while
            seen_t = max((t for t in (facts["last_t"], facts["created"]) if t), default=None)
            if seen_t is not None and now - seen_t > YOUNG_S:
                status = "lost"
        final = facts["final"]
        started = facts.get("started")
        if isinstance(final.get("elapsed_s"), (int, float)):
            duration = float(final["elapsed_s"])
        elif started is None:
            duration = None
        elif status in ("live", "starting"):
            duration = now - started
        else:
            duration = (facts["last_t"] - started) if facts["last_t"] else None
        m = _STAMP.match(key)
        rows.append(RunRow(key=key, path=rd.path, name=m.group(2) if m else key, status=status,
                           strategy=facts["strategy"],
                           world=facts["world"] if isinstance(facts["world"], int) else None,
                           started=started, duration=duration, progress=facts["progress"],
                           root_cause=final.get("root_cause"), pid=rd.supervisor_pid()))
    for gone in set(cache) - seen:
        del cache[gone]
    rows.sort(key=lambda r: (r.started or 0.0, r.key), reverse=True)
    return rows


def deletable(path: Path, root: Path) -> str | None:
    """Why this run directory must not be deleted now, or None when it may be."""
    path, root = Path(path), Path(root)
    if path.resolve().parent != root.resolve() or not (path / "config.yaml").is_file():
        return f"{path} is not a run directory under {root}; not deleting it"
    rd = RunDir(path)
    status = rd.status()
    if status == "running":
        return (f"run {rd.name} is live (supervisor pid {rd.supervisor_pid()}): open it (enter) and "
                f"stop it first, or wait until it ends")
    if status == "starting":
        try:
            age = time.time() - rd.config_path.stat().st_mtime
        except OSError:
            age = YOUNG_S
        if age < YOUNG_S:
            return f"run {rd.name} is still starting: wait for it, or stop it from its Monitor screen"
    return None


# ------------------------------------------------------------------------------- the screen

class RunsScreen(Screen):
    """Past and live runs. Enter opens one in the Monitor; d deletes a finished one."""

    DEFAULT_CSS = """
    RunsScreen #runs-header { height: 1; background: $panel; padding: 0 1; }
    RunsScreen #runs-table { height: 1fr; }
    RunsScreen #run-detail { height: auto; max-height: 4; padding: 0 1; background: $panel;
                             color: $text-muted; }
    RunsScreen #run-detail.-failed { color: $error; }
    """
    BINDINGS = [
        Binding("enter", "open", "Open", priority=True),
        Binding("r", "refresh", "Refresh"),
        Binding("d", "delete", "Delete"),
        Binding("escape", "back", "Back"),
    ]

    def __init__(self, root: str | Path | None = None):
        super().__init__(id="runs")
        self._root_arg = Path(root) if root else None
        self.rows: list[RunRow] = []
        self.loaded = False  # the first poll has been shown
        self.polls = 0
        self._cache: dict = {}
        self._polling = False
        self._again = False
        self._timer = None
        self._suspended = False

    @property
    def root(self) -> Path:
        if self._root_arg is not None:
            return self._root_arg
        app_root = getattr(self.app, "runs_root", None)
        return Path(app_root) if app_root else runs_root()

    def compose(self):
        yield Static("", id="runs-header")
        table = DataTable(id="runs-table", cursor_type="row", zebra_stripes=True)
        for key, label in COLUMNS:
            table.add_column(label, key=key)
        yield table
        yield Static("", id="run-detail")
        yield Footer()

    def on_mount(self) -> None:
        self._header(None)
        self.query_one("#run-detail", Static).update("reading run directories ...")
        self.query_one(DataTable).focus()
        self.poll()

    # ------------------------------------------------------------------ polling
    def poll(self) -> None:
        """Read the runs now (in a thread); the next poll is scheduled when this one lands."""
        if self._polling:
            self._again = True
            return
        if self._timer is not None:
            self._timer.stop()
            self._timer = None
        self._polling = True
        self._read_runs(self.root)

    @work(thread=True, group="runs-poll")
    def _read_runs(self, root: Path) -> None:
        try:
            rows: list[RunRow] | Exception = collect(root, self._cache)
        except Exception as exc:  # an unreadable root must not leave the list blank forever
            rows = exc
        try:
            self.app.call_from_thread(self._rows_arrived, rows)
        except RuntimeError:
            pass  # the app is gone

    def _rows_arrived(self, rows) -> None:
        self._polling = False
        if not self.is_attached:
            return
        self.polls += 1
        if isinstance(rows, Exception):
            self.notify(f"cannot read the runs in {self.root}: {rows}", severity="error", timeout=8)
        else:
            self._show(rows)
            self.loaded = True
        if self._again:
            self._again = False
            self.poll()
        elif not self._suspended:
            self._timer = self.set_timer(REFRESH_S, self.poll)

    def on_screen_suspend(self) -> None:
        self._suspended = True
        if self._timer is not None:
            self._timer.stop()
            self._timer = None

    def on_screen_resume(self) -> None:
        was = self._suspended
        self._suspended = False
        if was:
            self.poll()

    # ------------------------------------------------------------------ rendering
    def _header(self, rows: list[RunRow] | None) -> None:
        counts = ""
        if rows is not None:
            live = sum(r.is_live for r in rows)
            counts = f" · {len(rows)} run{'s' if len(rows) != 1 else ''}" + (f", {live} live" if live else "")
        self.query_one("#runs-header", Static).update(
            Text.assemble(("torchdeck", "bold"), f" · Runs · {self.root}{counts}"))

    def _show(self, rows: list[RunRow]) -> None:
        table = self.query_one(DataTable)
        selected = self.selected
        old_keys = [r.key for r in self.rows]
        new_keys = [r.key for r in rows]
        if old_keys == new_keys and table.row_count == len(rows):
            before = {r.key: r.cells() for r in self.rows}
            for r in rows:
                for col, cell in r.cells().items():
                    if before[r.key][col] != cell:
                        table.update_cell(r.key, col, cell, update_width=True)
        else:
            table.clear()
            for r in rows:
                c = r.cells()
                table.add_row(*(c[k] for k, _ in COLUMNS), key=r.key)
            if selected is not None and selected.key in new_keys:
                table.move_cursor(row=new_keys.index(selected.key))
        self.rows = rows
        self._header(rows)
        self._detail()

    @property
    def selected(self) -> RunRow | None:
        table = self.query_one(DataTable)
        if not self.rows or table.row_count == 0:
            return None
        idx = table.cursor_row
        return self.rows[idx] if 0 <= idx < len(self.rows) else None

    def _detail(self) -> None:
        w = self.query_one("#run-detail", Static)
        w.remove_class("-failed")
        if not self.rows:
            w.update(f"No runs in {self.root} yet. Launch one from Configure (F5), or headless with "
                     f"`torchdeck run PRESET` (set TORCHDECK_RUNS to look elsewhere).")
            return
        r = self.selected
        if r is None:
            w.update("")
            return
        lines = [str(r.path)]
        if r.root_cause:
            lines.append(f"root cause: {r.root_cause}")
            w.set_class(r.status == "failed", "-failed")
        elif r.status == "lost" and r.pid is None:
            lines.append("no supervisor pid and no final status: it never started, or ran outside "
                         "torchdeck's supervisor (torchrun?)")
        elif r.status == "lost":
            lines.append(f"its supervisor (pid {r.pid}) is gone and left no final status; "
                         f"see {r.path / 'supervisor.log'}")
        w.update(Text("\n".join(lines)))

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self._detail()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self.action_open()

    # ------------------------------------------------------------------ actions
    def action_refresh(self) -> None:
        self.poll()

    def action_back(self) -> None:
        if len(self.app.screen_stack) > 1 and self.app.screen is self:
            self.app.pop_screen()

    def action_open(self) -> None:
        """Live runs re-attach, finished ones are reviewed from their events file: both in the Monitor."""
        r = self.selected
        if r is None:
            self.notify("no run selected", severity="warning")
            return
        try:
            from app.monitor.screen import MonitorScreen
        except ImportError as exc:
            self.notify(f"cannot open {r.key}: the Monitor screen is not available ({exc})",
                        severity="error", timeout=8)
            return
        self.app.push_screen(MonitorScreen(r.path))

    def action_delete(self) -> None:
        r = self.selected
        if r is None:
            self.notify("no run selected", severity="warning")
            return
        why = deletable(r.path, self.root)
        if why:
            self.notify(f"Not deleted: {why}", severity="error", timeout=8)
            return
        from app.configure.dialogs import ConfirmDialog

        def answer(yes: bool | None) -> None:
            if yes:
                self._delete(r.path)

        self.app.push_screen(ConfirmDialog(
            f"Delete run {r.key} ({r.status})?\n{r.path}\nIts events, logs and checkpoints go too."), answer)

    def _delete(self, path: Path) -> None:
        why = deletable(path, self.root)  # asked again: time has passed since the question
        if why:
            self.notify(f"Not deleted: {why}", severity="error", timeout=8)
            return
        self._delete_worker(path)

    @work(thread=True, group="runs-delete")
    def _delete_worker(self, path: Path) -> None:
        try:
            shutil.rmtree(path)
            msg, severity = f"deleted {path.name}", "information"
        except OSError as exc:
            msg, severity = f"could not delete {path}: {exc.strerror or exc}", "error"
        try:
            self.app.call_from_thread(self._deleted, msg, severity)
        except RuntimeError:
            pass  # the app is gone

    def _deleted(self, msg: str, severity: str) -> None:
        self.notify(msg, severity=severity)
        if self.is_attached:
            self.poll()
