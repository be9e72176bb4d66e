"""The Configure screen: the form, live validation and summary. Its actions (presets, launch,
export, compare, memory) are in actions.py, its section navigation in sections.py."""
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
from .controls import show
from .actions import PresetActions, RunActions, preset_label, preset_source
from .fields import BY_PATH, FIELDS
from .form import ConfigForm
from .sections import SectionNavigation
from ...engine import config as cfgmod
from ...engine import preflight
from ...engine.config import ConfigError
from ...engine.hardware import Hardware


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


class ConfigureScreen(PresetActions, RunActions, SectionNavigation, Screen):
    AUTO_FOCUS = "#f-strategy"
    # Short descriptions: the footer must hold them all at 80 columns (the palette says more).
    BINDINGS = [
        Binding("f5,ctrl+r", "launch", "Launch"),
        Binding("f5,ctrl+r", "submit", "Submit"),  # where SLURM: the same key, said as what it does
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
        self._slurm_shown = False  # where the key bar's F5 says Submit

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
        self._probe_slurm()

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

    @work(thread=True, exclusive=True, group="slurm-probe")
    def _probe_slurm(self) -> None:
        """sinfo's partitions (or why SLURM cannot be used from here), asked off the UI thread."""
        from .where import probe

        parts, why = probe()
        try:
            self.app.call_from_thread(self._slurm_arrived, parts, why)
        except RuntimeError:
            pass  # the app is gone

    def _slurm_arrived(self, parts: list, why: str) -> None:
        self.form.set_slurm(parts, why)
        self.revalidate()

    def _gpus_arrived(self, samples, ok, reason, mpi=None) -> None:
        self.hw = Hardware(gpu_count=len(samples) if ok else 0, mpi_available=mpi)
        self.form.set_gpus(samples, ok, reason)
        self.gpus_loaded = True
        self.revalidate()

    def check_action(self, action: str, parameters) -> bool | None:
        if action in ("launch", "submit"):
            try:
                slurm = self.form.to_slurm
            except Exception:  # not composed yet
                slurm = False
            return slurm == (action == "submit")
        return True

    def action_submit(self) -> None:
        self.action_launch()  # it reads where itself

    # ------------------------------------------------------------------ validation and summary
    def on_config_form_edited(self, event: ConfigForm.Edited) -> None:
        if self.form.to_slurm != self._slurm_shown:
            self._slurm_shown = self.form.to_slurm
            self.refresh_bindings()  # F5 says Launch or Submit
        self.revalidate()

    def revalidate(self) -> None:
        """Validate what the form says now; mark fields, refresh the summary and the command."""
        data = self.form.to_dict()
        slurm = self.form.to_slurm  # the job's nodes, not this host, run it: no check against this host
        self.cfg, problems = find_problems(data, None if slurm else self.hw, self.baseline)
        if "devices" in problems and data.get("accelerator") == "cuda" and data.get("devices") == []:
            from .follow import no_gpu_picked

            problems["devices"] = no_gpu_picked(data.get("strategy"))  # dp: two GPUs, not "at least one"
        if self.cfg is not None:
            # valid; can it start here (or, for SLURM, its files be found)? Saving and export still can
            for field, why in (preflight.file_problems(self.cfg) if slurm else preflight.check(self.cfg)):
                problems.setdefault(field, why)
        if slurm and self.form.slurm_why:
            problems["where"] = f"SLURM cannot be used from here: {self.form.slurm_why}"
        self.problems = problems
        self.warnings = dict(preflight.advice(self.cfg)) if self.cfg is not None else {}
        self.form.show_problems(problems, self.warnings)
        warn = self.query_one("#warnings", Static)
        show(warn, "\n".join(f"warning: {k}: {v}" for k, v in self.warnings.items()))
        warn.display = bool(self.warnings)
        stray = [f"{k or 'preset'}: {v}" for k, v in problems.items() if k not in BY_PATH]
        box = self.query_one("#problems", Static)
        show(box, "\n".join(stray))
        box.display = bool(stray)
        self._update_bar()
        s = self.query_one("#summary", Static)
        side = self.query_one("#side-summary", Static)
        if self.memory is not None and self.memory[0] != data:
            self.memory = None  # estimated for another form: gone with the first edit
        mem = self.memory[1] if self.memory is not None else []
        if not problems:
            show(s, "\n".join([summary.describe(self.cfg)] + mem))
            body = "\n".join(summary.describe_lines(self.cfg) + mem)
        else:
            show(s, summary.problems_line(problems))
            body = "invalid: " + summary.problems_line(problems)
        show(side, Content.assemble(("Run", "bold"), "\n", body))  # the body as plain text: brackets stay
        for w in (s, side):
            w.set_class(bool(problems), "-invalid")
        self._update_sections()
        cmd = summary.headless_command(self.preset_name or "PRESET.yaml", data, self.base, slurm=slurm)
        show(self.query_one("#command", Static), "$ " + cmd)

    def _update_bar(self) -> None:
        mark = "  [b]● modified[/b]" if self.modified else ""
        src = f" ({self.preset_source})" if self.preset_source else ""
        if self.preset_source == "deleted":
            src, mark = "", "  [b]● deleted: Ctrl+S saves the form[/b]"
        show(self.query_one("#preset-bar", Static),
            f"[b]torchdeck[/b] · Configure · preset [b]{self.preset_name or '-'}[/b]{src}{mark}")

    def action_runs(self) -> None:
        self.app.action_runs()
