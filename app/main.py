"""The torchdeck app: opens on the Configure screen; Monitor and Runs screens are pushed from it.

Never imports torch (nor engine.worker/supervisor): the first frame must come well under 0.5 s.
GPU and host samplers are created lazily, so tests can pass fakes and the real NVML reader is
only started when something asks for it.
"""
from __future__ import annotations

import gc

# Start-up builds tens of thousands of objects and frees almost none: cyclic collections during
# the imports below only cost time (about 4 % of the first frame). At the end of this module the
# imported objects (modules, classes: they live as long as the process) are frozen out of later
# collections, and the GC is restored.
_GC_WAS_ON = gc.isenabled()
gc.disable()

from pathlib import Path  # noqa: E402
from typing import Callable, Iterable  # noqa: E402

from textual.app import App, SystemCommand  # noqa: E402
from textual.binding import Binding  # noqa: E402
from textual.screen import Screen  # noqa: E402

from .configure.screen import ConfigureScreen  # noqa: E402


class TorchdeckApp(App):
    CSS_PATH = Path(__file__).with_name("main.tcss")  # absolute: subclasses elsewhere keep it
    TITLE = "torchdeck"
    BINDINGS = [Binding("ctrl+q", "quit", "Quit", priority=True)]

    def __init__(self, preset: str | Path | None = None, gpu_source=None, host_source=None,
                 runs_root: str | Path | None = None):
        super().__init__()
        self._preset = preset
        self._gpu_source = gpu_source
        self._host_source = host_source
        self.runs_root: Path | None = Path(runs_root) if runs_root else None
        self.last_run: Path | None = None

    # ------------------------------------------------------------------ samplers (lazy)
    @property
    def gpu_source(self):
        if self._gpu_source is None:
            from .sources.nvml import GPUSource  # pynvml itself is imported on first use

            self._gpu_source = GPUSource()
        return self._gpu_source

    @property
    def host_source(self):
        if self._host_source is None:
            from .sources.host import HostSource  # psutil: only when a screen samples the host

            self._host_source = HostSource()
        return self._host_source

    # ------------------------------------------------------------------ start-up
    def run(self, *args, **kwargs):
        """Run with the cyclic GC paused until the first frame is on screen (see first_frame_shown)."""
        was_on = gc.isenabled()
        gc.disable()
        self._gc_paused = was_on
        try:
            return super().run(*args, **kwargs)
        finally:
            if was_on:
                gc.enable()

    def on_mount(self) -> None:
        self.set_timer(2.0, self.first_frame_shown)  # in case the first screen is not Configure

    def first_frame_shown(self) -> None:
        """The Configure screen calls this once painted: the start-up objects live as long as the
        app, so freeze them (later collections skip them) and let the GC run again."""
        if getattr(self, "_gc_paused", False):
            self._gc_paused = False
            gc.freeze()
            gc.enable()

    def update_styles(self, node, animate: bool = True) -> None:
        """Textual restyles a node on every class change, even one made in its constructor, before
        it is mounted; mounting styles it anyway. The form's compact Inputs and Selects (~70) were
        each matched against the whole stylesheet once more for nothing: ~15 % of a Configure start."""
        if node is self or node.is_attached:
            super().update_styles(node, animate)

    # ------------------------------------------------------------------ screens
    def get_default_screen(self) -> Screen:
        """The Configure screen is the base screen: one screen styled on start, not two."""
        self.configure_screen = ConfigureScreen(self._preset)
        return self.configure_screen

    async def action_quit(self) -> None:
        """Quit; while the form is still mounting its groups, quit right after (Textual dislikes
        tearing down widgets that are half mounted)."""
        form = self.configure_screen.query("#form")
        if form and not form.first().complete:
            form.first().quit_when_complete = True
            return
        self.exit()

    def go_to(self, found: Callable[[Screen], bool], make: Callable[[], Screen]) -> Screen:
        """The screen on the stack that `found` picks, brought back (the screens over it popped);
        else a new one from make(), pushed. A screen is never stacked twice: the Runs list has one
        id (a second one would crash the app), and esc should not walk back through copies."""
        for screen in reversed(self.screen_stack):
            if found(screen):
                while self.screen is not screen:
                    self.pop_screen()
                return screen
        screen = make()
        self.push_screen(screen)
        return screen

    def action_runs(self) -> None:
        from .runs.screen import RunsScreen  # imported when first opened: not on the first frame

        self.go_to(lambda s: isinstance(s, RunsScreen), RunsScreen)

    def open_monitor(self, path, replace: bool = False) -> None:
        """The Monitor of the run at `path`: the one on the stack if there is one, else a new one,
        pushed, or with `replace` in place of the screen on top (a resumed run's Monitor takes
        the place of the Monitor it was resumed from)."""
        from .monitor.screen import MonitorScreen

        path = Path(path).resolve()
        if not replace:
            self.go_to(lambda s: isinstance(s, MonitorScreen) and s.run_dir.path.resolve() == path,
                       lambda: MonitorScreen(path))
            return
        self.switch_screen(MonitorScreen(path))

    def open_compare(self, comparison=None, runs=None) -> None:
        """The Compare screen of a comparison directory or of runs picked by hand. There is one at
        most (it has an id): one already on the stack is brought back, showing these."""
        from .compare.screen import CompareScreen

        screen = self.go_to(lambda s: isinstance(s, CompareScreen),
                            lambda: CompareScreen(comparison=comparison, runs=runs))
        if not screen.shows(comparison, runs):
            screen.show_runs(comparison, runs)

    def resume_run(self, path) -> None:
        """Start a run that continues `path` from its newest checkpoint and watch it (the Monitor's
        and the Runs list's Resume; `torchdeck resume RUN` headless)."""
        from ..engine.errors import TorchdeckError
        from ..engine.runs import control
        try:
            cfg, origin, step, ckpt = control.resume_config(path)
            run = control.start(cfg, Path(path).parent, origin)
        except (TorchdeckError, OSError) as exc:
            self.notify(f"Cannot resume: {exc}", severity="error", timeout=10)
            return
        self.last_run = run.path
        self.notify(f"Resuming {Path(path).name} from {ckpt.name} (step {step}) as {run.name}")
        from .monitor.screen import MonitorScreen

        # From a Monitor, the new run's Monitor takes its place: esc does not walk back through
        # one Monitor per resume.
        self.open_monitor(run.path, replace=isinstance(self.screen, MonitorScreen))

    def _on_configure(self, action: str):
        """A palette command that acts on the Configure screen, returning to it first."""
        def go() -> None:
            while self.screen is not self.configure_screen and len(self.screen_stack) > 1:
                self.pop_screen()
            if self.screen is self.configure_screen:
                getattr(self.configure_screen, f"action_{action}")()
        return go

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield SystemCommand("Launch", "Validate the form and start the run (F5)", self._on_configure("launch"))
        yield SystemCommand("Save preset", "Save the form as a user preset (Ctrl+S)", self._on_configure("save_preset"))
        yield SystemCommand("Load preset", "Load a shipped or user preset (Ctrl+O)", self._on_configure("load_preset"))
        yield SystemCommand("Go to section", "Jump to a section of the form (Ctrl+G; Ctrl+Up/Down: previous/next)",
                            self._on_configure("sections"))
        yield SystemCommand("Export torchrun / sbatch",
                            "torchrun command per node and a SLURM sbatch script for the form (F6)",
                            self._on_configure("export"))
        yield SystemCommand("Compare strategies",
                            "Run the form's job under several strategies, one after another, and compare them (F7)",
                            self._on_configure("compare"))
        yield SystemCommand("Estimate memory", "Memory per rank for the form: parameters, gradients, optimizer state, "
                            "measured activations (F8; as torchdeck validate --memory)", self._on_configure("estimate_memory"))
        yield SystemCommand("Pick free GPUs", "Choose as many GPUs as are picked now, the free ones with the least "
                            "memory used (as devices: free:N)", self._on_configure("pick_free_gpus"))
        yield SystemCommand("Runs list", "Past and live runs (F2)", self.action_runs)
        yield from super().get_system_commands(screen)


gc.freeze()
if _GC_WAS_ON:
    gc.enable()


def run(preset_path: str | None = None) -> int:
    """Run the app; its exit status: 0, or non-zero when an error it did not handle stopped it
    (Textual prints the traceback and sets return_code, while run() itself returns normally)."""
    app = TorchdeckApp(preset=preset_path)
    app.run()
    return app.return_code or 0


if __name__ == "__main__":
    import sys

    sys.exit(run())
