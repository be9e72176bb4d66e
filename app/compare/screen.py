"""The Compare screen: several runs side by side, a comparison directory (`torchdeck compare`)
or runs marked in the Runs list. The table is engine.runs.compare's rows, the same numbers
`torchdeck compare` prints; under it the runs' loss and validation-accuracy curves overlaid (the
validation loss where no run has an accuracy),
one colour per run, x by step or by wall time (x toggles).

The events files are read in a thread worker; while a run of it is live the screen reads them
again every couple of seconds (the next read is scheduled when one lands, so reads never pile up).
"""
from __future__ import annotations

from pathlib import Path

from rich.text import Text
from textual import work
from textual.binding import Binding
from textual.containers import Horizontal
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static

from ..monitor.panes import step_ticks
from ..runs.screen import fitted
from ..widgets.status import STATUS_STYLE
from ...engine.runs import compare
from ...engine.rundir.status import LIVE as RUN_LIVE

REFRESH_S = 2.0
# (plotext colour, the same colour for rich): the legend must match the lines
COLOURS = (("cyan", "cyan"), ("red", "red"), ("green", "green"), ("yellow", "yellow"), ("magenta", "magenta"),
           ("blue", "blue"), ("orange", "dark_orange"), ("white", "white"))
LIVE = RUN_LIVE | {"waiting"}  # a row still to come: its run lives, or waits its turn


class CompareScreen(Screen):
    """Rows and overlaid curves of a comparison directory, or of runs picked by hand."""

    DEFAULT_CSS = """
    CompareScreen #cmp-header { height: auto; max-height: 3; background: $panel; padding: 0 1; }
    CompareScreen #cmp-table { height: auto; max-height: 10; }
    CompareScreen #cmp-left-out { height: auto; padding: 0 1; color: $text-muted; }
    CompareScreen #cmp-why { height: auto; max-height: 3; padding: 0 1; color: $text-muted; }
    CompareScreen #cmp-legend { height: 1; padding: 0 1; }
    CompareScreen #cmp-plots { height: 1fr; min-height: 6; }
    CompareScreen #cmp-plots PlotextPlot { width: 1fr; }
    """
    BINDINGS = [
        Binding("x", "toggle_x", "x: step/time"),
        Binding("r", "refresh", "Refresh"),
        Binding("s", "stop", "Stop"),
        Binding("escape", "back", "Back"),
    ]

    def __init__(self, comparison: str | Path | None = None, runs: list | None = None):
        super().__init__(id="compare")
        self.comparison = Path(comparison) if comparison else None
        self.run_paths = [Path(p) for p in runs or []]
        self.rows: list[compare.Row] = []
        self.curves: list[compare.Curve] = []
        self.header: list[str] = []
        self.target = None  # engine.runs.metric.Target of the comparison, if it has one
        self.error: str | None = None  # why the comparison was stopped for the user to fix (as compare says it)
        self.x_by = "step"  # or "time"
        self.loaded = False
        self._timer = None

    def shows(self, comparison=None, runs=None) -> bool:
        """Whether this screen shows that comparison directory, or these runs picked by hand."""
        if comparison is not None:
            return self.comparison is not None and self.comparison.resolve() == Path(comparison).resolve()
        return self.comparison is None and [p.resolve() for p in self.run_paths] == [Path(p).resolve()
                                                                                   for p in runs or []]

    def show_runs(self, comparison=None, runs=None) -> None:
        """Show another comparison (or other runs) here: the app keeps one Compare screen."""
        if self._timer is not None:
            self._timer.stop()
            self._timer = None
        self.comparison = Path(comparison) if comparison else None
        self.run_paths = [Path(p) for p in runs or []]
        self.rows, self.curves, self.header, self.target, self.loaded = [], [], [], None, False
        self.on_mount()

    def compose(self):
        from textual_plotext import PlotextPlot

        yield Static("", id="cmp-header")
        yield DataTable(id="cmp-table", cursor_type="row", zebra_stripes=True)
        yield Static("", id="cmp-left-out")
        yield Static("", id="cmp-why")
        yield Static("", id="cmp-legend")
        with Horizontal(id="cmp-plots"):
            yield PlotextPlot(id="cmp-loss")
            yield PlotextPlot(id="cmp-acc")
        yield Footer()

    def on_mount(self) -> None:
        what = self.comparison.name if self.comparison else f"{len(self.run_paths)} runs"
        self.query_one("#cmp-header", Static).update(Text.assemble(("torchdeck", "bold"), f" · Compare · {what}",
                                                                   " · reading ..."))
        self.query_one(DataTable).focus()
        self._read()

    # ------------------------------------------------------------------ reading
    @work(thread=True, group="compare-read", exclusive=True)
    def _read(self) -> None:
        what = (self.comparison, list(self.run_paths))  # a read of what this screen showed before is dropped
        try:
            if self.comparison is not None:
                c = compare.load(self.comparison)
                rows, header, target, error = c.rows, c.header(), c.target, c.error
            else:
                rows, target, error = compare.of_runs(self.run_paths), None, None
                header = ["runs picked in the Runs list; rates leave out warm-up (each rank's first logged window)"]
            curves = [compare.curves(r.run, r.name) for r in rows if r.run]
            result = (rows, header, target, curves, error)
        except Exception as exc:  # an unreadable directory must not leave the screen blank
            result = exc
        try:
            self.app.call_from_thread(self._arrived, result, what)
        except RuntimeError:
            pass  # the app is gone

    def _arrived(self, result, what=None) -> None:
        if not self.is_attached or (what is not None and what != (self.comparison, self.run_paths)):
            return
        if isinstance(result, Exception):
            self.notify(f"cannot read the comparison: {result}", severity="error", timeout=8)
            return
        self.rows, self.header, self.target, self.curves, self.error = result
        self.loaded = True
        self._show()
        if any(r.status in LIVE for r in self.rows):
            self._timer = self.set_timer(REFRESH_S, self._read)

    # ------------------------------------------------------------------ drawing
    def _colour(self, i: int) -> tuple[str, str]:
        return COLOURS[i % len(COLOURS)]

    def _show(self) -> None:
        what = self.comparison.name if self.comparison else f"{len(self.run_paths)} runs"
        head = Text.assemble(("torchdeck", "bold"), f" · Compare · {what}")
        now = [i for i, r in enumerate(self.rows) if r.status in RUN_LIVE]
        if now:
            todo = [r for r in self.rows if r.status != compare.SKIPPED]
            r = self.rows[now[0]]
            head.append(f" · running {r.name} ({todo.index(r) + 1} of {len(todo)})", style="bold green")
        for line in self.header[1:] if self.comparison else self.header:
            head.append("\n" + line, style="dim")
        self.query_one("#cmp-header", Static).update(head)
        self._table()
        why = [f"{r.name}: {r.status}: {r.reason}" for r in self.rows if r.reason]
        text = Text("\n".join(why))
        if self.error:  # the comparison stopped on it (`torchdeck compare` exits 2 with it): first, in red
            text = Text.assemble((f"stopped: {self.error}", "bold red"), "\n" if why else "", text)
            why.append(self.error)
        self.query_one("#cmp-why", Static).update(text)
        self.query_one("#cmp-why").display = bool(why)
        self._plot()

    def _table(self) -> None:
        """The rows, with the columns that fit the screen (the rule and the order of
        `torchdeck compare`'s printed table); a line under it names those left out."""
        table = self.query_one(DataTable)
        cursor = table.cursor_row
        table.clear(columns=True)
        cells = []
        for r in self.rows:
            c = r.cells(self.target)
            cells.append({k: Text(v, style=STATUS_STYLE.get(v, "") if k == "status" else "",
                                  justify="left" if k in ("strategy", "status", "mem") else "right")
                          for k, v in c.items()})
        cols, widths, note = fitted(compare.columns(self.target, self.rows), cells, self.app.size.width,
                                    compare.narrow_drop(self.rows))
        more = note[:-1] + f"; all in {compare.TABLE_FILE})" if note and self.comparison else note
        note = more if len(more) <= self.app.size.width - 2 else note
        for (key, label), w in zip(cols, widths):
            table.add_column(label, key=key, width=w)
        for c in cells:
            table.add_row(*(c[k] for k, _ in cols))
        left_out = self.query_one("#cmp-left-out", Static)
        left_out.update(note)
        left_out.display = bool(note)
        if self.rows:
            table.move_cursor(row=min(max(cursor, 0), len(self.rows) - 1))

    def on_resize(self) -> None:
        if self.loaded:
            self._table()

    def _plot(self) -> None:
        from textual_plotext import PlotextPlot

        legend = Text()
        for i, c in enumerate(self.curves):
            legend.append("━━ ", style=self._colour(i)[1])
            legend.append(c.label + "   ")
        legend.append(f"x: {'step' if self.x_by == 'step' else 'seconds since start'} (x toggles)", style="dim")
        self.query_one("#cmp-legend", Static).update(legend)
        at = 0 if self.x_by == "step" else 1
        val = (("#cmp-acc", "val acc %", "val_acc", 100.0, "dot") if any(c.val_acc for c in self.curves)
               or not any(c.val_loss for c in self.curves) else ("#cmp-acc", "val loss", "val_loss", 1.0, "dot"))
        for wid, title, attr, scale, marker in (("#cmp-loss", "training loss", "loss", 1.0, "braille"), val):
            widget = self.query_one(wid, PlotextPlot)
            p = widget.plt
            p.clear_data()
            p.clear_figure()
            p.title(title)
            p.xlabel("step" if self.x_by == "step" else "s")
            xs = []
            for i, c in enumerate(self.curves):
                pts = getattr(c, attr)
                if pts:
                    x = [pt[at] for pt in pts]
                    xs += x
                    p.plot(x, [scale * pt[2] for pt in pts], marker=marker, color=self._colour(i)[0])
            if xs and self.x_by == "step":
                ticks = step_ticks(min(xs), max(xs))
                p.xticks(ticks, [str(t) for t in ticks])
            widget.refresh()

    # ------------------------------------------------------------------ actions
    def action_toggle_x(self) -> None:
        self.x_by = "time" if self.x_by == "step" else "step"
        self._plot()

    def action_refresh(self) -> None:
        if self._timer is not None:
            self._timer.stop()
            self._timer = None
        self._read()

    def action_stop(self) -> None:
        """The running strategy stops (it checkpoints) and the rest do not start: the comparison's
        runner (the app's background one, or `torchdeck compare`) polls the stop file."""
        if not any(r.status in LIVE for r in self.rows):
            self.notify("nothing is running here", severity="warning")
        elif self.comparison is None:
            self.notify("these runs are not one comparison: stop a run from its Monitor (enter on it in the "
                        "Runs list, then s)", severity="warning", timeout=8)
        else:
            compare.request_stop(self.comparison)
            self.notify("stopping: the running strategy checkpoints and ends; the rest do not start")

    def action_back(self) -> None:
        if self._timer is not None:
            self._timer.stop()
        if len(self.app.screen_stack) > 1 and self.app.screen is self:
            self.app.pop_screen()
