"""The Runs list: past and live runs, to open (watch or review), resume or delete.

The rows come from the engine's run catalog (engine.runs.catalog: small reads of each run
directory, the same summaries `torchdeck runs` prints). Those reads run in a thread worker; the
next poll is scheduled when one is done, so polls never pile up on a slow disk, and polling
pauses while another screen (the Monitor) covers this one. What the keys do is in actions.py.
"""
from __future__ import annotations

from pathlib import Path

from rich.text import Text
from textual import work
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static

from .actions import RunsActions
from .jobs import STYLE as JOB_STYLE, JobStates, JobWord
from ...engine.runs.catalog import NARROW_DROP, RunSummary, collect, val_label
from ...engine.fmt import fit_columns
from ...engine.rundir.layout import runs_root
from ..widgets.status import STATUS_STYLE

REFRESH_S = 2.0
COLUMNS = (("status", "Status"), ("run", "Run"), ("strategy", "Strategy"), ("world", "World"),
           ("started", "Started"), ("duration", "Duration"), ("progress", "Progress"), ("val", "Val acc"),
           ("set", "--set"))
_RIGHT = ("world", "duration")


def row_cells(r: RunSummary, marked: bool = False, job: JobWord | None = None) -> dict[str, Text]:
    """The catalog's words for a run, styled: the status by colour, numbers to the right; a run
    marked for comparing wears a dot before its name; a SLURM job not reporting yet, SLURM's state."""
    out = {}
    for key, text in r.cells().items():
        if key == "status" and job is not None and job.status:
            text = job.status
        style = STATUS_STYLE.get(text, "") if key == "status" else "dim" if key == "set" else ""
        if key == "status" and not style:
            style = JOB_STYLE.get(text.split()[0], "") if text else ""
        if key == "run" and marked:
            text, style = "● " + text, "bold"
        out[key] = Text(text, style=style, justify="right" if key in _RIGHT else "left")
    return out


def fitted(cols, cells: list[dict[str, Text]], width: int, drop=()) -> tuple[list, list[int], str]:
    """What a DataTable of `cells` shows in `width` columns: (the columns kept, their widths, a
    line naming those left out, or ""). The rule is `torchdeck runs`' (engine.fmt.fit_columns:
    the keys in `drop` go in that order until a row fits); a DataTable pads each cell by one on
    both sides. The widths are set, not left to the table to find later: every column as wide as
    its widest cell, whenever the rows are shown."""
    plain = [{k: t.plain for k, t in c.items()} for c in cells]
    kept, left_out = fit_columns(list(cols), plain, width - 2, drop)
    widths = [max([len(label)] + [len(c[k]) for c in plain]) for k, label in kept]
    note = ""
    if left_out:
        n = len(left_out)
        note = f"{n} column{'s' if n > 1 else ''} left out: {', '.join(left_out)} (widen the terminal)"
    return kept, widths, note


# ------------------------------------------------------------------------------- the screen

class RunsScreen(RunsActions, Screen):
    """Past and live runs. Enter opens one in the Monitor; d deletes a finished one; space marks
    runs and c compares them (or opens the comparison the run under the cursor belongs to)."""

    DEFAULT_CSS = """
    RunsScreen #runs-header { height: 1; background: $panel; padding: 0 1; }
    RunsScreen #runs-table { height: 1fr; }
    RunsScreen #runs-left-out { height: auto; padding: 0 1; color: $text-muted; }
    RunsScreen #run-detail { height: auto; max-height: 4; padding: 0 1; background: $panel;
                             color: $text-muted; }
    RunsScreen #run-detail.-failed { color: $error; }
    """
    BINDINGS = [
        Binding("enter", "open", "Open", priority=True),
        Binding("r", "refresh", "Refresh", show=False),  # it refreshes itself every few seconds
        Binding("d", "delete", "Delete"),
        Binding("R", "resume", "Resume"),
        Binding("R", "not_now('resume')", show=False),  # a script run's row: pressed, it says why
        Binding("space", "mark", "Mark", key_display="spc"),
        Binding("c", "compare", "Compare"),
        Binding("escape", "back", "Back"),
    ]

    def __init__(self, root: str | Path | None = None):
        super().__init__(id="runs")
        self._root_arg = Path(root) if root else None
        self.rows: list[RunSummary] = []
        self.loaded = False  # the first poll has been shown
        self.polls = 0
        self._cache: dict = {}
        self._polling = False
        self._again = False
        self._timer = None
        self._suspended = False
        self.marked: set[str] = set()  # keys of the runs marked for comparing
        self.shown: tuple = ()  # (column keys, widths, labels) the table has now
        self._cells: dict[str, dict[str, Text]] = {}  # what it shows of each run
        self._jobs = JobStates()  # SLURM's word on the runs submitted to it (asked in the poll's thread)
        self.job_words: dict[str, JobWord] = {}

    @property
    def root(self) -> Path:
        if self._root_arg is not None:
            return self._root_arg
        app_root = getattr(self.app, "runs_root", None)
        return Path(app_root) if app_root else runs_root()

    def compose(self):
        yield Static("", id="runs-header")
        yield DataTable(id="runs-table", cursor_type="row", zebra_stripes=True)  # columns: _show
        yield Static("", id="runs-left-out")
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
        words = {}
        try:
            rows: list[RunSummary] | Exception = collect(root, self._cache)
            words = self._jobs.words(rows)
        except Exception as exc:  # an unreadable root must not leave the list blank forever
            rows = exc
        try:
            self.app.call_from_thread(self._rows_arrived, rows, words)
        except RuntimeError:
            pass  # the app is gone

    def _rows_arrived(self, rows, words=None) -> None:
        self._polling = False
        if not self.is_attached:
            return
        self.polls += 1
        self.job_words = words or {}
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
    def _header(self, rows: list[RunSummary] | None) -> None:
        counts = ""
        if rows is not None:
            live = sum(r.is_live for r in rows)
            counts = f" · {len(rows)} run{'s' if len(rows) != 1 else ''}" + (f", {live} live" if live else "")
            if self.marked:
                counts += f" · {len(self.marked)} marked (c compares)"
        self.query_one("#runs-header", Static).update(
            Text.assemble(("torchdeck", "bold"), f" · Runs · {self.root}{counts}"))

    def _show(self, rows: list[RunSummary]) -> None:
        table = self.query_one(DataTable)
        selected = self.selected
        old_keys = [r.key for r in self.rows]
        new_keys = [r.key for r in rows]
        self.marked &= set(new_keys)
        cells = [row_cells(r, r.key in self.marked, self.job_words.get(r.key)) for r in rows]
        width = self.app.size.width
        if len(rows) + 1 > table.size.height > 0:  # a vertical scrollbar takes its share
            width -= table.styles.scrollbar_size_vertical
        # as `torchdeck runs`: no column that no run fills (--set, most often), then the fit
        val = val_label(rows, "Val acc", "Val loss", "Val acc/loss")  # the run's main metric (catalog's rule)
        cols = [(k, val if k == "val" else label) for k, label in COLUMNS if not cells or any(c[k].plain for c in cells)]
        cols, widths, note = fitted(cols, cells, width, NARROW_DROP)
        shown = (tuple(k for k, _ in cols), tuple(widths), tuple(label for _, label in cols))
        if shown == self.shown and old_keys == new_keys and table.row_count == len(rows):
            for r, c in zip(rows, cells):
                before = self._cells.get(r.key, {})
                for col in shown[0]:
                    if before.get(col) != c[col]:
                        table.update_cell(r.key, col, c[col])
        else:
            table.clear(columns=shown != self.shown)
            if shown != self.shown:
                for (key, label), w in zip(cols, widths):
                    table.add_column(label, key=key, width=w)
                self.shown = shown
            for r, c in zip(rows, cells):
                table.add_row(*(c[k] for k in shown[0]), key=r.key)
            if selected is not None and selected.key in new_keys:
                table.move_cursor(row=new_keys.index(selected.key))
        self._cells = {r.key: c for r, c in zip(rows, cells)}
        left_out = self.query_one("#runs-left-out", Static)
        left_out.update(note)
        left_out.display = bool(note)
        self.rows = rows
        self._header(rows)
        self._detail()

    def on_resize(self) -> None:
        if self.loaded:
            self._show(self.rows)

    @property
    def selected(self) -> RunSummary | None:
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
        if r.key in self.job_words:
            lines.append(self.job_words[r.key].detail)
        if r.root_cause:
            lines.append(f"why: {r.root_cause}" if r.status.ended_well else f"root cause: {r.root_cause}")
            w.set_class(r.status.went_wrong, "-failed")
        w.update(Text("\n".join(lines)))

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self._detail()
        self.refresh_bindings()  # R is in the key bar only where the row's run can be resumed

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self.action_open()
