"""The Monitor's keys and palette entries: stop, kill, stacks, resume, leave, the log's rank and
the nodes pane's node, each offered only where it applies to the run (the run kind decides).
Mixed into MonitorScreen, apart from its layout and painting."""
from __future__ import annotations

from textual import work
from textual.command import DiscoveryHit, Hit, Hits, Provider

from .nodes import NodesPane
from .panes import LogPane


class MonitorCommands(Provider):
    """Command palette entries for the Monitor's actions."""

    COMMANDS = (
        ("Stop run", "stop", "Graceful stop: ranks finish the step, rank 0 checkpoints (s)"),
        ("Kill run", "kill", "SIGKILL every process of the run (k)"),
        ("Show stacks", "stacks", "Where each rank is: Python stacks grouped by place (t)"),
        ("Resume run", "resume", "A new run that continues this one from its newest checkpoint (R)"),
        ("Leave monitor", "leave", "Back to the previous screen; the run goes on (escape)"),
    )  # "Runs list" is the app's own palette entry, on every screen

    def _hits(self):
        screen = self.screen
        for title, action, help_text in self.COMMANDS:
            if isinstance(screen, MonitorActions):
                if not screen.check_action(action, ()):
                    continue  # as the key bar: what does not apply to this run is not offered
                if action == "stop":
                    help_text = f"Graceful stop: {screen.stop_wording()} (s)"
            yield title, getattr(screen, f"action_{action}", None), help_text

    async def discover(self) -> Hits:
        for title, cb, help_text in self._hits():
            if cb is not None:
                yield DiscoveryHit(title, cb, help=help_text)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for title, cb, help_text in self._hits():
            score = matcher.match(title)
            if cb is not None and score > 0:
                yield Hit(score, matcher.highlight(title), cb, help=help_text)


class MonitorActions:
    """What the keys do to the run on screen; what applies depends on its kind and whether it ended."""

    def kind(self):
        """torchdeck's loop or the user's script (engine.kinds): the one place the Monitor asks,
        so its keys, palette, stop dialog and toast say what applies to this run."""
        from ...engine.kinds import kind_of, kind_of_run

        if self.run_state.run_kind:
            return kind_of(self.run_state)
        if self._recorded_kind is None:  # before run_started is read: the recorded config
            self._recorded_kind = kind_of_run(self.run_dir)
        return self._recorded_kind

    def stop_wording(self) -> str:
        from ...engine.kinds import stop_grace_of

        kind = self.kind()
        return kind.stop_wording(stop_grace_of(self.run_dir) if kind.is_script else None)

    def check_action(self, action: str, parameters) -> bool | None:
        if action == "not_now":
            return not self.check_action(parameters[0], ())
        if action == "next_node":
            return self._multi  # a one-node run has no nodes to open: no key for it in the bar
        if action in ("stop", "kill"):
            return not self._final  # an ended run has nothing left to stop
        if action == "resume":
            return self.kind().can_resume  # a script run: torchdeck holds no checkpoint of it
        return True

    def action_not_now(self, action: str) -> None:
        """s, k or R where they do not apply: say why (they are not in the key bar)."""
        if action in ("stop", "kill"):
            self._live(action)
        else:
            self.app.resume_run(self.run_dir.path)  # refused there with the run kind's reason

    def action_next_node(self) -> None:
        """Open the next node of the nodes pane (its GPUs under its row); after the last, none."""
        if self._multi:
            self.query_one(NodesPane).next_node()

    def _live(self, what: str) -> bool:
        status = self.run_dir.status()
        if status.live and not self.run_state.final:
            return True
        self.notify(f"Cannot {what}: the run is not running (status "
                    f"{self.run_state.status if self.run_state.final else status})", severity="warning")
        return False

    def action_stop(self) -> None:
        if not self._live("stop"):
            return
        from ..widgets.dialogs import ConfirmDialog

        def answer(yes: bool | None) -> None:
            if not yes:
                return
            from ...engine.runs.control import request_stop

            try:
                request_stop(self.run_dir)
            except OSError as exc:
                self.notify(f"Cannot stop: cannot write {self.run_dir.stop_path}: {exc.strerror or exc}",
                            severity="error")
                return
            then = "" if self.kind().is_script else ", then all exit"
            self.notify(f"Stop requested: {self.stop_wording()}{then} (k kills at once)")

        how = self.stop_wording()
        self.app.push_screen(ConfirmDialog(f"Stop {self.run_dir.name} gracefully?\n{how[0].upper() + how[1:]}."),
                             answer)

    def action_kill(self) -> None:
        if not self._live("kill"):
            return
        from ..widgets.dialogs import ConfirmDialog

        def answer(yes: bool | None) -> None:
            if yes:
                self._kill()

        lost = ("The script gets no chance to save anything." if self.kind().is_script
                else "Nothing is saved since the last checkpoint.")
        self.app.push_screen(ConfirmDialog(f"Kill every process of {self.run_dir.name} now (SIGKILL)?\n{lost}"),
                             answer)

    @work(thread=True, exclusive=True, group="monitor-kill")
    def _kill(self) -> None:
        from ...engine.runs.control import kill

        try:
            pids = kill(self.run_dir)
        except Exception as exc:
            self.app.call_from_thread(self.notify, f"Kill failed: {exc}", severity="error")
            return
        self.app.call_from_thread(self.notify, f"Killed {len(pids)} process(es) of the run", severity="warning")

    def action_stacks(self) -> None:
        from .stacks import StacksScreen

        self.app.push_screen(StacksScreen(self.run_dir, self.run_state.stacks))

    def action_resume(self) -> None:
        """Continue a stopped, failed or lost run from its newest checkpoint, in a new run."""
        if not self.run_state.final:
            self.notify("Resume continues a run that is over: this one is still going (s stops it)",
                        severity="warning")
            return
        self.app.resume_run(self.run_dir.path)

    def action_leave(self) -> None:
        if not self.run_state.final and self.run_dir.is_live():
            self.app.notify(f"{self.run_dir.name} goes on; reopen it from the runs list")
        if len(self.app.screen_stack) > 1:
            self.app.pop_screen()
        else:
            self.app.exit()

    def action_cycle_log(self) -> None:
        """The log pane: every line with its rank, then one rank's log at a time (l cycles)."""
        ranks = [r.rank for r in self.run_state.rank_list() if not r.from_report]
        only = self.query_one(LogPane).cycle(ranks)
        pane = self.query_one("#mon-log")
        pane.border_title = "log: all ranks" if only is None else f"log: rank {only}"
        pane.scroll_visible(animate=False)  # at 80x24 the pane is below the fold: l seemed to do nothing

    def action_runs(self) -> None:
        self.app.action_runs()
