"""The stacks view: where each rank of the run was, grouped by place (engine/rundir/stacks.py).

Opened from the Monitor (t). It shows the newest stacks the run recorded (the supervisor's
watchdog takes them when a rank goes silent); t asks the live ranks of this host again, in a
thread worker (a dump takes up to a few seconds). For a run that is over it shows what
`torchdeck stacks` prints: engine.rundir.stacks.last_recorded, the newer of the watchdog's event and
the files an earlier asking left (rank<N>.stacks, supervisor.stacks).
"""
from __future__ import annotations

import time

from rich.text import Text
from textual import work
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static


def stacks_text(groups: list, heading: str, live: bool = True) -> Text:
    from ...engine.rundir.stacks import render

    t = Text(heading + "\n", style="bold")
    if not groups:
        if live:
            t.append("no stacks yet: t asks the ranks of this host now", style="dim")
        return t
    for line in render(groups, depth=10):
        if line.startswith("    "):
            t.append(line + "\n", style="dim")
        else:
            who, _, where = line.partition(": ")
            t.append(who + ": ", style="bold yellow")
            t.append(where + "\n")
    return t


def recorded_heading(rec: dict) -> str:
    """When stacks were recorded, why, and in which files (as `torchdeck stacks` says them)."""
    when = time.strftime("%H:%M:%S", time.localtime(rec.get("t") or 0))
    files = f"; {', '.join(rec['files'])}" if rec.get("files") else ""
    return f"taken at {when} ({rec.get('reason')}{files})"


class StacksScreen(ModalScreen):
    BINDINGS = [Binding("t", "take", "Take again"), Binding("escape,q", "close", "Close")]

    def __init__(self, run_dir, recorded: dict | None):
        super().__init__(classes="dialog-screen")
        self.run_dir, self.recorded = run_dir, recorded

    def compose(self):
        with Vertical(classes="dialog dialog-wide", id="stacks-dialog"):
            with VerticalScroll():
                yield Static(id="stacks-body")
            yield Static("t: ask the ranks again now   escape: close", classes="field-hint")

    def on_mount(self) -> None:
        self.query_one("#stacks-dialog").border_title = f"stacks of {self.run_dir.name}"
        rec = self.recorded
        if not self.run_dir.is_live():
            self._show([], "reading the stacks the run recorded...")
            self._last_recorded()  # its events file may be long: not on the event loop
        elif rec:
            self._show(rec.get("groups") or [], recorded_heading(rec))
        else:
            self.action_take()

    def _show(self, groups, heading: str) -> None:
        self.query_one("#stacks-body", Static).update(stacks_text(groups, heading, self.run_dir.is_live()))

    def action_take(self) -> None:
        if not self.run_dir.is_live():
            self.notify("The run is not running: these are the last stacks it recorded", severity="warning")
            return
        self._show([], "asking the ranks of this host for their stacks...")
        self._take()

    @work(thread=True, exclusive=True, group="stacks")
    def _last_recorded(self) -> None:
        from ...engine.rundir.stacks import last_recorded

        try:
            last = last_recorded(self.run_dir)
        except Exception as exc:  # shown, never raised
            self.app.call_from_thread(self._show, [], f"could not read the recorded stacks: {exc}")
            return
        if last is None:
            self.app.call_from_thread(self._show, [], "the run is over and recorded no stacks")
        else:
            self.app.call_from_thread(self._show, last["groups"], recorded_heading(last))

    @work(thread=True, exclusive=True, group="stacks")
    def _take(self) -> None:
        from ...engine.rundir.stacks import take

        try:
            groups, taken = take(self.run_dir)
        except Exception as exc:  # shown, never raised
            self.app.call_from_thread(self._show, [], f"could not take stacks: {exc}")
            return
        heading = (f"now ({time.strftime('%H:%M:%S')}): {len(taken)} process(es) on this host" if taken
                   else "no process of the run on this host answers (ranks register once started)")
        self.app.call_from_thread(self._show, groups, heading)

    def action_close(self) -> None:
        self.dismiss()
