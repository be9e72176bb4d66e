"""The Configure screen: the form, live validation and summary, presets, and Launch."""
from __future__ import annotations

from pathlib import Path

from textual import work
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.content import Content
from textual.screen import Screen
from textual.widgets import Static

from . import summary
from ..keybar import KeyBar
from .fields import BY_PATH, FIELDS, GROUPS
from .form import ConfigForm, group_id
from ...engine import config as cfgmod
from ...engine import preflight
from ...engine.config import ConfigError
from ...engine.hardware import Hardware


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


# Fields whose value is never stood in for while looking for more problems: changing one changes
# what the others mean (a GPU list under accelerator cpu is itself an error), so a problem found
# with a stand-in would not be the user's.
_NO_STAND_IN = ("strategy", "accelerator", "devices")


def find_problems(data: dict, hw: Hardware, baseline: dict) -> tuple:
    """(the config, {}) when `data` is valid, else (None, every problem found, one per field).

    preflight.from_dict stops at the first stage that finds anything (a field that is not a number
    hides every range rule; a field out of range hides the strategy's rules), so an emptied lr
    hid a batch size of 0 until lr was fixed. Here each field with a problem is given a stand-in
    (the loaded preset's value, else the default) and the form checked again, until no new
    problem turns up: every problem at once, each with the schema's own words."""
    import copy

    from .fields import get_path, set_path

    problems: dict[str, str] = {}
    trial = data
    default = None
    for _ in range(4):  # type errors, then ranges and combinations, then the strategy's rules
        try:
            cfg = preflight.from_dict(trial, hw=hw)
        except ConfigError as exc:
            found = exc.by_field()
        else:
            if trial is data:
                return cfg, {}
            break
        new = {k: v for k, v in found.items() if k not in problems}
        problems.update(new)
        trial = copy.deepcopy(trial) if trial is data else trial
        default = default or cfgmod.RunConfig().to_dict()
        stood_in = False
        for path in new:
            if path not in BY_PATH or path in _NO_STAND_IN:
                continue
            now = get_path(trial, path)
            for stand_in in (get_path(baseline, path), get_path(default, path)):
                if stand_in is not None and stand_in != now:
                    set_path(trial, path, stand_in)
                    stood_in = True
                    break
        if not stood_in:
            break
    order = {f.path: i for i, f in enumerate(FIELDS)}  # the form's order: the summary names them as they come
    return None, dict(sorted(problems.items(), key=lambda kv: order.get(kv[0], -1)))


class ConfigureScreen(Screen):
    AUTO_FOCUS = "#f-strategy"
    # Short descriptions: the footer must hold them all at 80 columns (the palette says more).
    BINDINGS = [
        Binding("f5,ctrl+r", "launch", "Launch"),
        Binding("ctrl+o,f3", "load_preset", "Load"),
        Binding("ctrl+s,f4", "save_preset", "Save"),
        Binding("ctrl+g", "sections", "Sections"),
        Binding("ctrl+down", "section(1)", "Next section", show=False),
        Binding("ctrl+up", "section(-1)", "Previous section", show=False),
        Binding("f2", "runs", "Runs"),
        Binding("f6,ctrl+t", "export", "Export"),
        Binding("f7", "compare", "Compare", show=False),  # the palette's "Compare strategies"
        Binding("f8", "estimate_memory", "Memory", show=False),  # the palette's "Estimate memory"
    ]
    WIDE = 120  # from this many columns a side panel lists the sections and shows the run

    def __init__(self, preset: str | Path | None = None):
        super().__init__(id="configure")
        self._preset_arg = preset
        self.preset_path: Path | None = None
        self.preset_name = ""
        self.preset_source = ""  # user | shipped | file | defaults | deleted (the loaded user preset)
        self.deleted_name = ""
        self.base: dict = {}  # the loaded preset, normalized
        self.baseline: dict = {}  # what the form showed right after loading it
        self.problems: dict[str, str] = {}
        self.warnings: dict[str, str] = {}  # valid, but probably not meant (engine.preflight.advice)
        self.cfg: cfgmod.RunConfig | None = None  # the form as a valid config (with hardware), else None
        self.hw = Hardware(gpu_count=None)
        self.gpus_loaded = False
        self.memory: tuple[dict, list[str]] | None = None  # (the form it was estimated for, its lines)

    def compose(self):
        self._initial = self._read_initial()
        yield Static("", id="preset-bar")
        with Horizontal(id="configure-body"):
            yield ConfigForm(self._initial[0], id="form")  # built with the preset's values: no second pass
            with Vertical(id="side") as side:
                yield Static("", id="sections")  # markup of its own making only (section names, counts)
                yield Static("", id="side-summary", markup=False)
        side.display = self.app.size.width >= self.WIDE  # known now: no second layout for the first frame
        yield Static("", id="problems", markup=False)
        yield Static("", id="warnings", markup=False)
        yield Static("", id="summary", markup=False).set_styles(display="none" if side.display else "block")
        yield Static("", id="command", markup=False)
        yield KeyBar()

    def _read_initial(self) -> tuple:
        """(data, path, source, name) of the preset to open with; the defaults when it is broken."""
        from ...engine.presets import DEFAULT_PRESET, resolve

        self._initial_error = ""
        try:
            path = resolve(self._preset_arg or DEFAULT_PRESET)
        except ConfigError as exc:
            self._initial_error = str(exc)
        else:
            try:
                cfg = preflight.load(path, cache=True)  # its JSON copy when unchanged: no PyYAML import
            except ConfigError as exc:
                self._initial_error = f"cannot load this preset:\n{exc}"
            else:
                return cfg.to_dict(), Path(path), preset_source(path), preset_label(path)
        return cfgmod.RunConfig().to_dict(), None, "defaults", ""

    def on_mount(self) -> None:
        if self._initial_error:
            self.notify(self._initial_error, severity="error", timeout=10)
        self._show_config(*self._initial)
        self.call_after_refresh(self._first_frame_shown)

    def _first_frame_shown(self) -> None:
        """NVML start-up (and its import) would compete with the first frame for the GIL: after it."""
        self.app.first_frame_shown()
        self._probe_gpus()

    @property
    def form(self) -> ConfigForm:
        return self.query_one(ConfigForm)

    # ------------------------------------------------------------------ GPUs (thread: NVML may be slow)
    @work(thread=True, exclusive=True, group="gpus")
    def _probe_gpus(self) -> None:
        from ...engine.hardware import mpi_available

        src = self.app.gpu_source
        try:
            ok, reason = src.status()
            samples = src.sample() if ok else []
        except Exception as exc:  # a sampler bug must not take the form down
            ok, reason, samples = False, f"GPU probe failed: {exc}", []
        mpi = mpi_available()  # torch's libraries read, not imported: a millisecond
        self.app.call_from_thread(self._gpus_arrived, samples, ok, reason, mpi)

    def _gpus_arrived(self, samples, ok, reason, mpi=None) -> None:
        self.hw = Hardware(gpu_count=len(samples) if ok else 0, mpi_available=mpi)
        self.form.set_gpus(samples, ok, reason)
        self.gpus_loaded = True
        self.revalidate()

    # ------------------------------------------------------------------ presets
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
        self.notify(f"saved user preset {name} ({path})")

    # ------------------------------------------------------------------ validation and summary
    def on_config_form_edited(self, event: ConfigForm.Edited) -> None:
        self.revalidate()

    def revalidate(self) -> None:
        """Validate what the form says now; mark fields, refresh the summary and the command."""
        data = self.form.to_dict()
        self.cfg, problems = find_problems(data, self.hw, self.baseline)
        if "devices" in problems and data.get("accelerator") == "cuda" and data.get("devices") == []:
            from .form import no_gpu_picked

            problems["devices"] = no_gpu_picked(data.get("strategy"))  # dp: two GPUs, not "at least one"
        if self.cfg is not None:
            # valid; can it start here? (saving and export still can)
            for field, why in preflight.check(self.cfg):
                problems.setdefault(field, why)
        self.problems = problems
        self.warnings = dict(preflight.advice(self.cfg)) if self.cfg is not None else {}
        self.form.show_problems(problems, self.warnings)
        warn = self.query_one("#warnings", Static)
        warn.update("\n".join(f"warning: {k}: {v}" for k, v in self.warnings.items()))
        warn.display = bool(self.warnings)
        stray = [f"{k or 'preset'}: {v}" for k, v in problems.items() if k not in BY_PATH]
        box = self.query_one("#problems", Static)
        box.update("\n".join(stray))
        box.display = bool(stray)
        self._update_bar()
        s = self.query_one("#summary", Static)
        side = self.query_one("#side-summary", Static)
        if self.memory is not None and self.memory[0] != data:
            self.memory = None  # estimated for another form: gone with the first edit
        mem = self.memory[1] if self.memory is not None else []
        if not problems:
            s.update("\n".join([summary.describe(self.cfg)] + mem))
            body = "\n".join(summary.describe_lines(self.cfg) + mem)
        else:
            s.update(summary.problems_line(problems))
            body = "invalid: " + summary.problems_line(problems)
        side.update(Content.assemble(("Run", "bold"), "\n", body))  # the body as plain text: brackets stay
        for w in (s, side):
            w.set_class(bool(problems), "-invalid")
        self._update_sections()
        cmd = summary.headless_command(self.preset_name or "PRESET.yaml", data, self.base)
        self.query_one("#command", Static).update("$ " + cmd)

    def _update_bar(self) -> None:
        mark = "  [b]● modified[/b]" if self.modified else ""
        src = f" ({self.preset_source})" if self.preset_source else ""
        if self.preset_source == "deleted":
            src, mark = "", "  [b]● deleted: Ctrl+S saves the form[/b]"
        self.query_one("#preset-bar", Static).update(
            f"[b]torchdeck[/b] · Configure · preset [b]{self.preset_name or '-'}[/b]{src}{mark}")

    # ------------------------------------------------------------------ launch and runs
    def _refused(self, verb: str) -> bool:
        """Validate now; when the form is invalid say why, go to the field, and return True."""
        self.revalidate()
        if not self.problems or (self.cfg is not None and verb != "launch"):
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
        self.app.last_run = run.path
        from ..monitor.screen import MonitorScreen  # imported on first launch, not on the first frame

        self.app.push_screen(MonitorScreen(run.path))

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

    # ------------------------------------------------------------------ sections
    def sections(self) -> list[tuple[str, bool, int]]:
        """(section, has something to show, problems in it), in form order."""
        count = {g: 0 for g in GROUPS}
        for path in self.problems:
            if path in BY_PATH:
                count[BY_PATH[path].group] += 1
        return [(g, self.form.group_shown(g), count[g]) for g in GROUPS]

    def _update_sections(self) -> None:
        """The side panel's section list: numbers (Ctrl+G, then the digit), problems, where focus is."""
        if not self.query_one("#side").display:
            return  # narrow: not shown (on_resize fills it when it appears)
        here = self.form.group_of(self.focused) if self.focused else None
        lines = ["[b]Sections[/b] [dim]^g, ctrl+↑↓[/dim]"]
        for i, (group, shown, bad) in enumerate(self.sections(), 1):
            mark = f"  [b $error]✗ {bad} problem{'s' if bad > 1 else ''}[/]" if bad else ""
            text = f"{i} {group}{mark}"
            if group == here:
                text = f"[reverse]{text}[/reverse]"
            elif not shown:
                text = f"[dim]{text} –[/dim]"
            lines.append(" " + text)
        self.query_one("#sections", Static).update("\n".join(lines))

    def on_resize(self, event) -> None:
        """Wide: sections and summary at the side. A class on the screen (Textual breakpoints)
        would restyle every widget of the form on the first frame; two displays do not."""
        wide = event.size.width >= self.WIDE
        self.query_one("#side").display = wide
        self.query_one("#summary").display = not wide
        self._update_sections()

    def on_descendant_focus(self, event) -> None:
        self._update_sections()

    def action_sections(self) -> None:
        from .dialogs import SectionsDialog

        here = self.form.group_of(self.focused) if self.focused else None
        self.app.push_screen(SectionsDialog(self.sections(), here),
                             lambda group: self.go_to_section(group) if group else None)

    def action_section(self, step: int) -> None:
        """Ctrl+Down / Ctrl+Up: the next / previous section that has something to show."""
        shown = [i for i, (_, ok, _) in enumerate(self.sections()) if ok]
        if not shown:
            return
        here = self.form.group_of(self.focused) if self.focused else None
        at = GROUPS.index(here) if here in GROUPS else -1
        if step > 0:
            target = next((i for i in shown if i > at), shown[0])
        else:
            target = next((i for i in reversed(shown) if i < at), shown[-1])
        self.go_to_section(GROUPS[target])

    def go_to_section(self, group: str, tries: int = 0) -> None:
        """Focus a section's first field with its title in view."""
        if group not in self.form.mounted_groups:  # mounted one per refresh after the first frame
            if tries < 200:
                self.set_timer(0.05, lambda: self.go_to_section(group, tries + 1))
            return
        w = self.form.first_control(group)
        if w is None:
            return
        w.focus(scroll_visible=False)
        self._title_to_top(group, w)

    def _title_to_top(self, group: str, field, tries: int = 0) -> None:
        """Until the groups after it are mounted the form may be too short for this title to reach
        the top: scroll again as they come, while the user is still in that section."""
        title = self.form.w(group_id(group) + "-title")
        self.form.scroll_to_widget(title, top=True, animate=False)
        if self.focused is not field:
            return
        if not self.form.complete and tries < 100:
            self.set_timer(0.05, lambda: self._title_to_top(group, field, tries + 1))
        elif tries:  # the last group was mounted, maybe not laid out yet
            self.call_after_refresh(lambda: self.form.scroll_to_widget(title, top=True, animate=False))

    def action_runs(self) -> None:
        self.app.action_runs()
