"""The Monitor screen: one run, live or finished, with its GPUs, host, ranks, curves and log.

Two thread workers do the work off the event loop: one follows the run through the engine's
run core (engine.runs.follow: events, log tails, whether its processes live), posting a snapshot
of its RunView at most ~7 times a second (coalescing a busy run's hundreds of events per second);
one samples NVML and the host every second. The loop only paints. What the keys do is in
actions.py.
"""
from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Callable

from textual import work
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Footer
from textual.worker import get_current_worker

from .actions import MonitorActions, MonitorCommands
from .queued import SlurmWaiting
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


class MonitorScreen(MonitorActions, SlurmWaiting, Screen):
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
        self.watch_job()  # a SLURM job still queued: its header says so until node 0 reports
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
        head.show(self.queued_header() or header_text(st, now, self.run_dir.name, head.width(120)))
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

    def on_resize(self) -> None:
        self.call_after_refresh(self.repaint)

    def repaint(self) -> None:
        """Every pane from what is known now (after a resize, or a test seeding GPU history)."""
        self._paint()
        self._paint_samples()

