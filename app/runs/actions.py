"""The Runs list's keys: open, mark and compare, resume, delete (after asking), refresh, back.
Mixed into RunsScreen, apart from its polling and its table."""
from __future__ import annotations

import shutil
from pathlib import Path

from textual import work

from ...engine.kinds import kind_of
from ...engine.runs.catalog import deletable


class RunsActions:
    """What the keys do to the run under the cursor (`selected`) or to the marked ones."""

    def check_action(self, action: str, parameters) -> bool | None:
        if action == "not_now":
            return not self.check_action(parameters[0], ())
        if action == "resume":
            r = self.selected
            return r is None or kind_of(r.strategy).can_resume  # a script run: torchdeck holds no checkpoint
        return True

    def action_not_now(self, action: str) -> None:
        """R on a script run's row: not in the key bar, and refused with the run kind's reason."""
        r = self.selected
        if r is not None:
            self.app.resume_run(r.path)

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
            from ..monitor.screen import MonitorScreen  # noqa: F401
        except ImportError as exc:
            self.notify(f"cannot open {r.key}: the Monitor screen is not available ({exc})",
                        severity="error", timeout=8)
            return
        self.app.open_monitor(r.path)  # its Monitor already on the stack, if it is there

    def action_mark(self) -> None:
        r = self.selected
        if r is None:
            return
        self.marked ^= {r.key}
        self._show(self.rows)  # the mark widens the name: the columns are fitted again

    def action_compare(self) -> None:
        """The marked runs side by side; with none marked, the comparison the run under the cursor
        was part of (`torchdeck compare`)."""
        from ...engine.rundir.layout import RunDir, comparison_of

        picked = [r.path for r in self.rows if r.key in self.marked]
        if len(picked) >= 2:
            self.app.open_compare(runs=picked)
            return
        r = self.selected
        where = comparison_of(RunDir(r.path)) if r is not None else None
        if where is not None and not picked:
            self.app.open_compare(comparison=where)
            return
        self.notify("mark two or more runs with space, then press c (or put the cursor on a run of a "
                    "`torchdeck compare` comparison)", severity="warning", timeout=6)

    def action_resume(self) -> None:
        r = self.selected
        if r is None:
            self.notify("no run selected", severity="warning")
            return
        self.app.resume_run(r.path)

    def action_delete(self) -> None:
        r = self.selected
        if r is None:
            self.notify("no run selected", severity="warning")
            return
        why = deletable(r.path, self.root)
        if why:
            self.notify(f"Not deleted: {why}", severity="error", timeout=8)
            return
        from ..widgets.dialogs import ConfirmDialog

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
