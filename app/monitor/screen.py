"""The Monitor screen: one run, live or finished, with its GPUs, host, ranks, curves and log.

Two thread workers do the work off the event loop: one follows the run through the engine's
run core (engine.runs.follow: events, log tails, whether its processes live), posting a snapshot
of its RunView at most ~7 times a second (coalescing a busy run's hundreds of events per second);
one samples NVML and the host every second. The loop only paints.
"""
from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Callable

from textual import work
from textual.binding import Binding
from textual.command import DiscoveryHit, Hit, Hits, Provider
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Footer
from textual.worker import get_current_worker

from .nodes import FleetRanksPane, NodesPane, other_hosts_text
from .panes import (Curves, GPUHistory, LogPane, RanksPane, TextPane, gpu_text, header_text,
                               host_text)
from ...engine.runs import fleet as fl
from ...engine.runs.view import RunView

POLL_S = 0.05  # events file poll while events are coming
IDLE_POLL_S = 0.1
POST_EVERY_S = 0.15  # at most this often a snapshot goes to the UI (~16 ms of painting each at 8 ranks)
NODES_EVERY_S = 1.0  # the nodes pane (32 rows of figures that move once a second) at most this often
SAMPLE_EVERY_S = 1.0
PLOT_EVERY_S = 1.0


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
            if isinstance(screen, MonitorScreen):
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


class MonitorScreen(Screen):
    CSS_PATH = "monitor.tcss"
    COMMANDS = {MonitorCommands}
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (120, "-wide")]
    VERTICAL_BREAKPOINTS = [(0, "-short"), (36, "-tall")]
    BINDINGS = [
        Binding("s", "stop", "Stop"),
        Binding("k", "kill", "Kill"),
        Binding("t", "stacks", "Stacks"),
        Binding("R", "resume", "Resume"),
        Binding("l", "cycle_log", "Rank log"),
        Binding("n", "next_node", "Nodes"),  # shown for a run on several nodes only (check_action)
        Binding("escape", "leave", "Leave"),
        Binding("r", "runs", "Runs"),
        # Out of the key bar where they do not apply (check_action), these keys still answer why
        Binding("s", "not_now('stop')", show=False),
        Binding("k", "not_now('kill')", show=False),
        Binding("R", "not_now('resume')", show=False),
    ]

    class Update(Message):
        def __init__(self, state: RunView):
            super().__init__()
            self.run_state = state

    class Samples(Message):
        def __init__(self, gpus, ok: bool, reason: str, host, host_why: str):
            super().__init__()
            self.gpus, self.ok, self.reason, self.host, self.host_why = gpus, ok, reason, host, host_why

    def __init__(self, run_path: str | Path, now: Callable[[], float] | None = None,
                 sample_every: float = SAMPLE_EVERY_S):
        from ...engine.rundir.layout import RunDir

        super().__init__()  # no id: the runs list may stack a second Monitor of another run
        self.run_dir = RunDir(Path(run_path))
        self.now = now or time.time
        self.sample_every = sample_every
        self.run_state = RunView()
        self._quit_evt = threading.Event()
        self._pids: dict = {}
        self._gpus, self._gpu_ok, self._gpu_reason = [], True, "sampling GPUs..."
        self._host, self._host_why = None, "sampling the host..."
        self.gpu_history = GPUHistory()
        self._local = fl.Fleet()  # this host's samples, as node 0's (the Monitor runs where node 0 writes)
        self._multi = False  # the run is on several nodes: the nodes pane, and the n key
        self._nodes_t = 0.0  # when the nodes pane was last drawn
        self._family: dict = {}
        self._last_plot = 0.0
        self._plot_timer = None
        self._final = False  # the key bar offers s/k while the run goes on, R once it is over
        self._recorded_kind = None

    # ------------------------------------------------------------------ what kind of run
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

    # ------------------------------------------------------------------ layout
    def compose(self):
        yield TextPane(id="mon-header")
        with VerticalScroll(id="mon-body"):
            yield FleetRanksPane(id="mon-ranks", classes="pane")
            with Horizontal(id="mon-top"):
                with Vertical(id="mon-gpus", classes="pane"):
                    yield TextPane(id="gpu-one")
                    yield NodesPane(id="gpu-nodes")
                yield TextPane(id="mon-host", classes="pane")
            with Horizontal(id="mon-bottom"):
                yield Curves(id="mon-curves", classes="pane")
                yield LogPane(home=str(self.run_dir.path), id="mon-log", classes="pane")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#mon-gpus").border_title = "GPUs"
        self.query_one("#mon-host").border_title = "host"
        self.query_one("#mon-ranks").border_title = "ranks"
        self.query_one("#mon-curves").border_title = "curves"
        self.query_one("#mon-log").border_title = "log"
        self.sub_title = self.run_dir.name
        self._paint()
        self._read_events()
        self._sample()
        self.set_interval(1.0, self._tick)

    def on_unmount(self) -> None:
        self._quit_evt.set()

    # ------------------------------------------------------------------ workers
    @work(thread=True, exclusive=True, group="monitor-events")
    def _read_events(self) -> None:
        """Follow the run, post a snapshot when something changed (at most every POST_EVERY_S).
        A finished run's whole file is read in one go here."""
        from ...engine.runs.follow import Follower

        worker = get_current_worker()
        follower = Follower(self.run_dir, stop=self._quit_evt.is_set)  # a day-long file: not read on once left
        view = follower.view
        posted, last_post = -1, 0.0
        while not worker.is_cancelled and not self._quit_evt.is_set():
            n = follower.poll()
            mono = time.monotonic()
            if view.version != posted and mono - last_post >= POST_EVERY_S:
                self.post_message(self.Update(view.snapshot()))
                posted, last_post = view.version, mono
                continue
            self._quit_evt.wait(POLL_S if n else IDLE_POLL_S)

    @work(thread=True, exclusive=True, group="monitor-samples")
    def _sample(self) -> None:
        """GPU and host samples every second; a failing sampler is shown, never raised."""
        worker = get_current_worker()
        gpu = self.app.gpu_source
        try:
            ok, reason = gpu.status()
        except Exception as exc:  # a sampler bug must not take the screen down
            ok, reason = False, f"GPU sampling failed: {exc}"
        try:
            host = self.app.host_source
            host_why = "" if host is not None else "host sampling is not available (app.sources.host missing)"
        except Exception as exc:
            host, host_why = None, f"host sampling failed: {exc}"
        while not worker.is_cancelled and not self._quit_evt.is_set():
            gpus = []
            if ok:
                try:
                    gpus = list(gpu.sample())
                except Exception as exc:
                    ok, reason = False, f"GPU sampling failed: {exc}"
            if gpus:
                try:
                    from ..sources.nvml import pid_namespace_warning

                    warn = pid_namespace_warning(gpus)
                except Exception:
                    warn = None
                reason = warn or ""
            hs = None
            if host is not None:
                try:
                    hs = host.sample(dict(self._pids))
                    host_why = ""
                except Exception as exc:
                    host_why = f"host sampling failed: {exc}"
            self.post_message(self.Samples(gpus, ok, reason, hs, host_why))
            self._quit_evt.wait(self.sample_every)

    # ------------------------------------------------------------------ painting
    def on_monitor_screen_update(self, msg: Update) -> None:
        script = self.kind().is_script
        self.run_state = msg.run_state
        self._pids = msg.run_state.rank_pids()
        if msg.run_state.final != self._final or self.kind().is_script != script:
            self._final = msg.run_state.final
            self.refresh_bindings()  # s/k go when the run ends; R never shows for a script run
        self._paint(log=True)

    def on_monitor_screen_samples(self, msg: Samples) -> None:
        self._gpus, self._gpu_ok, self._gpu_reason = msg.gpus, msg.ok, msg.reason
        self._host, self._host_why = msg.host, msg.host_why
        # pid -> rank of every process of the run the host pane found (the ranks' children
        # included): a script's own workers on a GPU count as their rank's
        self._family = {p.pid: p.rank for p in (getattr(msg.host, "procs", None) or [])
                        if getattr(p, "rank", None) is not None}
        self.gpu_history.add(msg.gpus)
        import socket

        self._local.add(0, socket.gethostname(), msg.gpus, msg.host, self.now(), local=True)
        self._paint_samples()

    def _tick(self) -> None:
        """Once a second: elapsed, ETA, last-seen and stale flags move with the clock."""
        self._paint()

    def _paint(self, log: bool = False) -> None:
        now = self.now()
        st = self.run_state
        head = self.query_one("#mon-header", TextPane)
        head.show(header_text(st, now, self.run_dir.name, head.width(120)))
        self.query_one(RanksPane).show(st, now)
        if fl.multi_node(st) != self._multi:
            self._paint_samples()  # the GPU pane turns into the nodes pane
        elif self._multi and time.monotonic() - self._nodes_t >= NODES_EVERY_S:
            self._paint_nodes(now)  # node_sample events come with the run's events, once a second
        if log:
            self.query_one(LogPane).show(st)
        self._maybe_plot()

    def _maybe_plot(self) -> None:
        mono = time.monotonic()
        wait = PLOT_EVERY_S - (mono - self._last_plot)
        if wait <= 0:
            self._last_plot = mono
            self.query_one(Curves).show(self.run_state)
        elif self._plot_timer is None:
            def later():
                self._plot_timer = None
                self._maybe_plot()
            self._plot_timer = self.set_timer(wait, later)

    def _paint_samples(self) -> None:
        multi = fl.multi_node(self.run_state)
        if multi != self._multi:
            self._multi = multi
            self.query_one("#gpu-one").display = not multi
            self.query_one(NodesPane).display = multi
            self.query_one("#mon-gpus").border_title = "nodes: ranks and GPUs (n opens one)" if multi else "GPUs"
            self.query_one("#mon-top").set_class(multi, "-nodes")
            self.refresh_bindings()
        if multi:
            self._paint_nodes(self.now())
        else:
            gp = self.query_one("#gpu-one", TextPane)
            gp.show(gpu_text(self._gpus, self._gpu_ok, self._gpu_reason, self.gpu_history.by_index, self.run_state,
                             gp.width(), self._family))
        hp = self.query_one("#mon-host", TextPane)
        host = host_text(self._host, self.run_state, hp.width(), self._host_why)
        others = other_hosts_text(self.run_state.fleet) if multi else None
        if others is not None:
            host.append("\n")
            host.append_text(others)
        hp.show(host)

    def _paint_nodes(self, now: float) -> None:
        self._nodes_t = time.monotonic()
        self.query_one(NodesPane).show(self.run_state, self.run_state.fleet.merged(self._local), now, self._family)

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

    def on_resize(self) -> None:
        self.call_after_refresh(self.repaint)

    def repaint(self) -> None:
        """Every pane from what is known now (after a resize, or a test seeding GPU history)."""
        self._paint()
        self._paint_samples()

    # ------------------------------------------------------------------ actions
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
