"""The Configure screen's actions, apart from its layout and validation: the presets it loads and
saves, and what it does with a valid form (launch, export, compare, estimate memory). Mixed into
ConfigureScreen, whose `form`, `cfg`, `problems` and `revalidate` they use."""
from __future__ import annotations

from pathlib import Path

from textual import work

from . import summary
from .fields import BY_PATH
from .submit import SlurmSubmit
from ...engine import config as cfgmod
from ...engine import preflight
from ...engine.config import ConfigError


def preset_label(path: Path) -> str:
    """How the headless command names a preset: its name when it is a known one, else its path."""
    from ...engine.presets import shipped_presets_dir, user_presets_dir

    path = Path(path).resolve()
    for folder in (shipped_presets_dir(), user_presets_dir()):
        try:
            if path.parent == Path(folder).resolve():
                return path.stem
        except OSError:
            pass
    return str(path)


def preset_source(path: Path) -> str:
    """user | shipped | file: where a preset comes from, for the preset bar."""
    from ...engine.presets import user_presets_dir

    if preset_label(path) == str(Path(path).resolve()):
        return "file"
    return "user" if Path(path).resolve().parent == user_presets_dir().resolve() else "shipped"


class PresetActions:
    """Load, save (and describe) presets; follow a user preset deleted under the form."""

    def load_preset(self, path: Path) -> bool:
        try:
            cfg = preflight.load(path)
        except ConfigError as exc:
            self.notify(f"cannot load this preset:\n{exc}", severity="error", timeout=10)
            return False
        self._show_config(cfg.to_dict(), Path(path), preset_source(path), preset_label(path))
        return True

    def _show_config(self, data: dict, path: Path | None, source: str, name: str) -> None:
        self.preset_path, self.preset_source, self.preset_name = path, source, name
        self.base = data
        self.form.load(data)
        self.baseline = self.form.to_dict()
        self.revalidate()

    @property
    def modified(self) -> bool:
        """The form differs from its preset file, or that file is gone (the form is saved nowhere)."""
        return self.preset_source == "deleted" or self.form.to_dict() != self.baseline

    def preset_deleted(self, path: Path) -> None:
        """A user preset was deleted. If the form came from it, the form now stands alone: nothing
        may name the file (header, command line) or read it (Export writes the form's own YAML)."""
        if self.preset_path is None or Path(path).resolve() != self.preset_path.resolve():
            return
        self.deleted_name = self.preset_name
        self.preset_path, self.preset_source, self.preset_name = None, "deleted", ""
        self.base = cfgmod.RunConfig().to_dict()  # the command line sets what differs from the defaults
        self.revalidate()

    def action_load_preset(self) -> None:
        from ..widgets.dialogs import ConfirmDialog  # not needed for the first frame
        from .dialogs import LoadPresetDialog

        def load(info) -> None:
            if self.load_preset(info.path):
                self.notify(f"loaded {info.source} preset {info.name}")

        def chosen(info) -> None:
            if info is None:
                return
            if not self.modified:
                load(info)
                return
            self.app.push_screen(ConfirmDialog(f"Discard the changes to {self.preset_name or 'the form'} "
                                               f"and load {info.name}?"),
                                 lambda yes: load(info) if yes else None)

        self.app.push_screen(LoadPresetDialog(on_deleted=self.preset_deleted), chosen)

    def action_save_preset(self) -> None:
        try:
            cfg = preflight.from_dict(self.form.to_dict())  # no hardware check: a GPU preset saves anywhere
        except ConfigError as exc:
            field, why = exc.problems[0]
            self.notify(f"Cannot save: {field}: {why}" if field else f"Cannot save: {why}", severity="error")
            return
        from .dialogs import SavePresetDialog

        if self.preset_source == "deleted":
            suggested = self.deleted_name
        else:
            suggested = self.preset_name if self.preset_source == "user" else f"my-{cfg.name}"

        def named(answer: tuple[str, str] | None) -> None:
            if answer:
                name, description = answer
                cfg.description = description
                self.save_as(cfg, name)

        self.app.push_screen(SavePresetDialog(suggested, lambda name: self.describe_as(name, cfg)), named)

    def describe_as(self, name: str, cfg: cfgmod.RunConfig) -> str:
        """The description offered for saving the form as `name`: its own when saved over the preset
        it came from, or one the user typed into the form; under a new name, where it came from and
        what changed ("mine: from quickstart, with epochs 1, lr 0.02")."""
        came_from = self.deleted_name if self.preset_source == "deleted" else self.preset_name
        if name == came_from and self.preset_source in ("user", "deleted"):
            return cfg.description
        if cfg.description and cfg.description != self.base.get("description", ""):
            return cfg.description  # written in the form: the user's words (emptied: say where it came from)
        changed = []
        for item in summary.overrides(self.form.to_dict(), self.base):
            key, _, value = item.partition("=")
            if key not in ("name", "description"):
                changed.append(f"{BY_PATH[key].label if key in BY_PATH else key} {value}")
        origin = f"from {came_from}" if came_from else "from the defaults"
        if not changed:
            return f"{name}: a copy of {came_from}" if came_from else f"{name}: the defaults"
        shown = changed if len(changed) <= 4 else changed[:3] + [f"{len(changed) - 3} more"]
        return f"{name}: {origin}, with " + (", ".join(shown[:-1]) + " and " + shown[-1] if len(shown) > 1 else shown[0])

    def save_as(self, cfg: cfgmod.RunConfig, name: str, overwrite: bool = False) -> None:
        from ...engine.presets import PresetExists, save_user_preset

        try:
            path = save_user_preset(cfg, name, overwrite=overwrite)
        except PresetExists:
            from ..widgets.dialogs import ConfirmDialog

            def answer(yes: bool | None) -> None:
                if yes:
                    self.save_as(cfg, name, overwrite=True)

            self.app.push_screen(ConfirmDialog(f"User preset {name!r} exists. Overwrite it?"), answer)
            return
        except ConfigError as exc:
            self.notify(str(exc), severity="error")
            return
        except OSError as exc:
            self.notify(f"cannot write the preset: {exc}", severity="error")
            return
        self.load_preset(path)


class RunActions(SlurmSubmit):
    """What a valid form starts: a run, an export, a comparison, a memory estimate."""

    def _refused(self, verb: str) -> bool:
        """Validate now; when the form is invalid say why, go to the field, and return True."""
        self.revalidate()
        if not self.problems or (self.cfg is not None and verb not in ("launch", "submit")):
            return False
        field, why = next(iter(self.problems.items()))
        self.notify(f"Cannot {verb}: {field}: {why}" if field else f"Cannot {verb}: {why}",
                    severity="error", timeout=8)
        if field in BY_PATH:
            self._focus_field(field)
        return True

    def action_pick_free_gpus(self) -> None:
        """The command palette's "Pick free GPUs" (the GPU picker's count, free ones by NVML)."""
        if self.form.devices_mode() not in ("one", "many"):
            self.notify("Pick free GPUs: needs accelerator cuda and a GPU list from NVML", severity="warning")
            return
        ok, why = self.form.pick_free_gpus()
        self.notify(why, severity="information" if ok else "error", timeout=8)

    def action_estimate_memory(self) -> None:
        """Memory per rank for the form (as `torchdeck validate --memory`), measured in a child
        process: building the model needs torch, which the app never imports."""
        from ...engine.kinds import kind_of

        kind = kind_of(self.form.value_of("strategy"))
        if not kind.can_estimate_memory:  # a script's model is its own
            self.notify(kind.does_not_apply("a memory estimate", kind.no_memory_estimate), severity="warning",
                        timeout=8)
            return
        if self._refused("estimate memory"):
            return
        data = self.form.to_dict()
        self.memory = (data, ["memory: estimating (building the model in a separate process) ..."])
        self.revalidate()
        self._estimate(data, self.cfg)

    @work(thread=True, exclusive=True, group="memory")
    def _estimate(self, data: dict, cfg) -> None:
        import subprocess
        import sys
        import tempfile

        with tempfile.TemporaryDirectory(prefix="torchdeck-memory-") as tmp:
            path = Path(tmp) / "config.yaml"
            try:
                cfgmod.save(cfg, path)
                out = subprocess.run([sys.executable, "-m", "torchdeck.engine.memory", str(path)], capture_output=True,
                                     text=True, timeout=300, stdin=subprocess.DEVNULL)
                found = out.stdout.strip().splitlines() if out.returncode == 0 else \
                    [(out.stderr.strip().splitlines() or [f"memory: the estimate failed (exit {out.returncode})"])[-1]]
            except (OSError, subprocess.TimeoutExpired) as exc:
                found = [f"memory: the estimate failed: {exc}"]
        self.app.call_from_thread(self._memory_arrived, data, found)

    def _memory_arrived(self, data: dict, found: list[str]) -> None:
        if self.memory is None or self.memory[0] != data:
            return  # the form changed meanwhile
        self.memory = (data, found)
        self.revalidate()
        warn = any("warning" in ln for ln in found)
        self.notify("\n".join(found), title="Memory per rank", severity="warning" if warn else "information",
                    timeout=12)

    def action_export(self) -> None:
        """torchrun per node and an sbatch script for the form, as `torchdeck export` prints them."""
        if self._refused("export"):
            return
        from .export import ExportDialog, build

        try:
            exp = build(self.cfg, self.form.to_dict(), self.base, self.preset_path, self.preset_name,
                        self.modified)
        except ValueError as exc:
            self.notify(f"Cannot export: {exc}", severity="error", timeout=8)
            return
        self.app.push_screen(ExportDialog(exp, self.cfg))

    def action_launch(self) -> None:
        if self.form.to_slurm:
            self.submit_to_slurm()
            return
        if self._refused("launch"):
            return
        from ...engine.runs import control

        origin = {"preset": self.preset_name or str(self.preset_path or ""),
                  "overrides": summary.overrides(self.form.to_dict(), self.base)}
        try:
            run = control.start(self.cfg, self.app.runs_root, origin)
        except (OSError, ConfigError) as exc:
            self.notify(f"Cannot launch: {exc}", severity="error", timeout=10)
            return
        self.opened(run.path)

    def opened(self, path) -> None:
        """A run started or submitted: watched in the Monitor."""
        self.app.last_run = path
        from ..monitor.screen import MonitorScreen  # imported on first launch, not on the first frame

        self.app.push_screen(MonitorScreen(path))

    def action_compare(self) -> None:
        """The form's job under several strategies, one after another, watched in the Compare screen."""
        from ...engine.kinds import kind_of

        kind = kind_of(self.form.value_of("strategy"))
        if kind.is_script:  # the strategies are torchdeck's loop's; a script does its own distributed setup
            self.notify(kind.does_not_apply("comparing strategies", "the strategies are torchdeck's own training "
                                            "loop's, and your script does its own distributed setup"),
                        severity="warning", timeout=8)
            return
        if self._refused("compare"):
            return
        from ..compare.dialog import CompareDialog

        cfg = self.cfg

        def picked(choice: dict | None) -> None:
            if not choice:
                return
            from ...engine.errors import TorchdeckError
            from ...engine.runs import compare

            try:
                path = compare.launch(cfg, choice["strategies"], steps=choice["steps"], target=choice["target"],
                                      root=self.app.runs_root, hw=self.hw)
            except (TorchdeckError, OSError) as exc:
                self.notify(f"Cannot compare: {exc}", severity="error", timeout=10)
                return
            from ..compare.screen import CompareScreen

            self.app.push_screen(CompareScreen(comparison=path))

        self.app.push_screen(CompareDialog(cfg.name), picked)

    def _focus_field(self, path: str) -> None:
        w = self.form.control(path)
        if w is not None:
            w.focus()
