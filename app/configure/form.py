"""The configure form: every RunConfig setting, grouped, scrollable, keyboard-only.

The form turns widgets into a config dict and back; it does not validate. The screen feeds it
the problems engine.config finds, and the form marks those fields (`-invalid`) with the reason.

Speed: Textual mounts a few hundred widgets in about a second on a small machine, so the first
frame gets only the first fields of the Essentials group (built from the preset's values, so
nothing changes right after it); the rest of it, then each other group, title included, is
mounted one per refresh after it. Until a field is mounted its value comes from the loaded dict,
so reading the form is always complete. Each group
is a two-column grid (label, control) so a field costs two widgets, not five.
"""
from __future__ import annotations

import copy

from textual.containers import Grid, Horizontal, VerticalScroll
from textual.message import Message
from textual.widgets import Input, Label, Select, SelectionList, Static, Switch
from textual.widgets.selection_list import Selection

from .fields import (BY_PATH, CUSTOM, FIELDS, GROUPS, Field, format_value, get_path,
                                  parse_text, set_path)
from ...engine.config import SCHEMA_VERSION, RunConfig
from ...engine.kinds import kind_of

# Fields of the first section built with the first frame. None: the first frame is the screen's
# frame (title, section heading, summary, key bar) and the whole first section follows one refresh
# later, before the other sections. `python -m bench.first_frame_parts --reps 9` (80x24, against a
# Textual hello world): with 3 fields first, first frame 1.55x and the section complete at 1.97x;
# with none, 1.23x and 1.86x (the first field itself comes later: 1.56x -> 1.85x).
FIRST_FRAME_FIELDS = 0

_INPUT_TYPE = {"int": "integer", "float": "number"}


class FormSelect(Select):
    """A Select that skips its mount-time setup once the app is shutting down: the form mounts its
    groups after the first paint, and a Select whose Mount arrives mid-shutdown (its inner label
    already gone) made Textual fail the exit with NoMatches '#label'."""

    def on_mount(self, event) -> None:
        if not self.app.is_running:
            event.prevent_default()  # Select's own mount handler would query the removed label


class FormInput(Input):
    """An Input that says why it refused a key: a number field drops letters (Textual's `type`
    restriction plays the terminal bell, which many terminals mute), and the form shows a note
    on the field until its next edit."""

    class Refused(Message):
        def __init__(self, input: "FormInput") -> None:
            super().__init__()
            self.input = input

    def restricted(self) -> None:
        super().restricted()
        self.post_message(self.Refused(self))


class FormSwitch(Switch):
    """A Switch that says "on" or "off" in words beside its slider: over SSH the colours that tell
    one from the other are often lost. (No widget and no import more: it draws both itself.)"""

    WORD_WIDTH = 4  # " off"

    def render(self):
        return _SliderWord(super().render(), " on" if self.value else " off", self.WORD_WIDTH)

    def get_content_width(self, container, viewport) -> int:
        return super().get_content_width(container, viewport) + self.WORD_WIDTH


class _SliderWord:
    """Switch's slider (4 cells) then a word, on one line."""

    def __init__(self, slider, word: str, width: int):
        self.slider, self.word, self.width = slider, word, width

    def __rich_console__(self, console, options):
        from rich.segment import Segment  # loaded with Textual already; imported here, not at the first frame

        slider_width = max(1, options.max_width - self.width)
        line = console.render_lines(self.slider, options.update(width=slider_width, height=1), pad=False)[0]
        yield from line
        yield Segment(self.word.ljust(self.width))
        yield Segment.line()


class FieldMessage(Static):
    """A field's hint or problem, spanning both grid columns. Textual sizes an auto grid row by
    one column's width even for a widget spanning two, so a hint over ~29 characters at 80
    columns got a second, empty row: measure it by the width it really has."""

    def get_content_height(self, container, viewport, width: int) -> int:
        return super().get_content_height(container, viewport, max(width, container.width - self.styles.gutter.width))
_GiB = 1024.0


def _slug(path: str) -> str:
    return path.replace(".", "-")


def group_id(group: str) -> str:
    return "grp-" + group.split()[0].lower()


def gpu_label(g) -> str:
    """One picker line: index, name, memory, and whether another process already uses it."""
    used, total = getattr(g, "mem_used_mb", None), getattr(g, "mem_total_mb", None)
    mem = f"{used / _GiB:.1f}/{total / _GiB:.0f} GiB" if used is not None and total else "memory n/a"
    pids = getattr(g, "pids", None) or []
    busy = f"  busy ({len(pids)} proc)" if pids else "  free"
    return f"GPU {g.index}  {g.name}  {mem}{busy}"


class ConfigForm(VerticalScroll):
    """All settings. Posts `Edited` (coalesced) whenever anything changes."""

    can_focus = False  # focus goes to the fields; the form scrolls to follow it

    class Edited(Message):
        pass

    def __init__(self, data: dict | None = None, **kwargs):
        super().__init__(**kwargs)
        self.gpus: list = []  # GPU samples (index, name, mem_used_mb, mem_total_mb, pids)
        self.gpus_known = False
        self.gpu_reason = "looking for GPUs…"
        # values of fields not mounted yet (and what the first frame shows)
        self.data: dict = copy.deepcopy(data) if data is not None else RunConfig().to_dict()
        self.mounted_groups: set[str] = set()  # groups with a title and grid on screen
        self._mounted_paths: set[str] = set()  # fields with widgets (the rest read from self.data)
        self._later: list = []  # fields of the first group mounted right after the first frame
        self.problems: dict[str, str] = {}
        self._warnings: dict[str, str] = {}
        self.refused: dict[str, str] = {}  # field -> why the last key typed into it was dropped
        self._pending = False
        self._last_strategy: str | None = None
        self._set_names()
        self._w: dict = {}
        self.quit_when_complete = False
        # The GPU pickers cost about a tenth of the first frame: for a CPU preset they are mounted
        # right after it, and a cuda devices value set before then waits here.
        self._cuda_ready = False
        self._cuda_pending = []

    # ------------------------------------------------------------------ building
    def compose(self):
        self._last_strategy = self.data.get("strategy")
        first = [f for f in FIELDS if f.group == GROUPS[0]]
        self._later = first[FIRST_FRAME_FIELDS:]  # a Select is six widgets: the rest come right after
        yield from self._group_widgets(GROUPS[0], first[:FIRST_FRAME_FIELDS])
        self._mounted_paths.update(f.path for f in first[:FIRST_FRAME_FIELDS])
        self.mounted_groups.add(GROUPS[0])

    def on_mount(self) -> None:
        self.call_after_refresh(self._mount_next)

    async def _mount_next(self) -> None:
        if self._quitting():
            return  # quit within the first half second: nothing more to build
        if self._later:
            later, self._later = self._later, []
            widgets = [w for f in later for w in self._field_widgets(f)]
            await self._w[group_id(GROUPS[0])].mount_all(widgets)
            self._mounted_paths.update(f.path for f in later)
            if self.screen.is_current and self.screen.focused is None:
                self.screen.focus_next()  # the first field, as auto-focus would have chosen at mount
            self._edited()
            self.call_after_refresh(self._mount_next)
            return
        if not self._cuda_ready:
            await self._mount_cuda()
            self.call_after_refresh(self._mount_next)
            return
        rest = [g for g in GROUPS if g not in self.mounted_groups]
        if rest:
            await self._mount_group(rest[0])
            self.call_after_refresh(self._mount_next)
        elif self.quit_when_complete:
            self.app.exit()

    def _quitting(self) -> bool:
        """The app is shutting down (exit() was called, or this form is being removed): a quit in
        the first half second must not fail on the half-built form."""
        return self.app.return_code is not None or not self.is_attached or not self.app.is_running

    @property
    def complete(self) -> bool:
        """Every group mounted (tests and snapshots wait for this)."""
        return len(self.mounted_groups) == len(GROUPS) and self._cuda_ready and not self._later

    def _group_widgets(self, group: str, fields: list | None = None) -> list:
        """Title and grid of one group (or of its first fields), fields shown or hidden as the
        values say before mounting."""
        if fields is None:
            fields = [f for f in FIELDS if f.group == group]
        title = Static(group, classes="group-title", id=group_id(group) + "-title")
        grid = Grid(*[w for f in fields for w in self._field_widgets(f)], classes="group", id=group_id(group))
        self._w[title.id], self._w[grid.id] = title, grid
        shown_any = False
        for f in fields:
            shown = f.path in self.problems or f.shown(self.value_of)  # unmounted: the loaded values
            shown_any = shown_any or shown
            for w in self._parts(f):
                w.display = shown
        title.display = grid.display = shown_any
        return [title, grid]

    async def _mount_group(self, group: str) -> None:
        await self.mount_all(self._group_widgets(group))  # groups mount in order: appending keeps it
        # Only now are its fields read from their widgets and marked: a revalidation during the
        # mount (the GPU probe's answer) read blank Selects and mounted messages into a grid
        # that had no parent yet (MountError at start-up).
        self._mounted_paths.update(f.path for f in FIELDS if f.group == group)
        self.mounted_groups.add(group)
        self._edited()  # the screen re-applies problems and visibility to the new fields

    def _field_widgets(self, f: Field) -> list:
        value = get_path(self.data, f.path)
        label = Label(f.label, id="lbl-" + _slug(f.path), classes="field-label")
        out = [label]
        if f.kind == "choice":
            opts = [(("custom…" if c == CUSTOM else c), c) for c in f.choices]
            sel = FormSelect(opts, allow_blank=False, value=value if value in f.choices else CUSTOM,
                         id=f.wid, compact=True)
            if CUSTOM in f.choices:
                custom = Input("" if value in f.choices else str(value), placeholder="package.module:callable",
                               id=f.wid + "-custom", compact=True)
                out.append(Horizontal(sel, custom, id="ctl-" + _slug(f.path), classes="field-ctl"))
            else:
                out.append(sel)
        elif f.kind == "bool":
            out.append(FormSwitch(bool(value), id=f.wid))
        elif f.kind == "devices":
            cpu = self.data.get("accelerator") == "cpu"
            procs = FormInput(format_value("int", value) if cpu else "1", type="integer", id="f-devices-procs",
                          compact=True)
            row, below = ([], []) if cpu else self._cuda_widgets(format_value("devices", value))
            self._cuda_ready = not cpu
            out.append(Horizontal(procs, *row, id="ctl-devices", classes="field-ctl"))
            out.extend(below)
            out.append(FieldMessage("", id="gpu-note", classes="field-msg span2", markup=False))
        else:
            out.append(FormInput(format_value(f.kind, value), type=_INPUT_TYPE.get(f.kind, "text"),
                             id=f.wid, compact=True))
        if f.hint or f.path == "train.batch_size":
            # markup=False: a reason may hold brackets ("pip install 'torchdeck[deepspeed]'", [0, 1])
            out.append(FieldMessage(f.hint, id="msg-" + _slug(f.path), classes="field-msg span2", markup=False))
        for w in out:  # ids looked up often: a query walks the whole DOM, a dict does not
            for x in (w, *w._pending_children):
                self._w[x.id] = x
        return out

    def _cuda_widgets(self, text: str) -> tuple[list, list]:
        """GPU pickers: (in the devices row: one-GPU select, typed indices), (below it: multi-select)."""
        row = [FormSelect([], allow_blank=True, prompt="pick a GPU", id="f-devices-gpu", compact=True),
               Input(text, placeholder="GPU indices: 0,1 or all", id="f-devices-text", compact=True)]
        below = [SelectionList(id="f-devices-gpus", compact=True, classes="span2")]
        for w in row + below:
            w.display = False  # update_devices shows the one the mode needs
        return row, below

    async def _mount_cuda(self) -> None:
        row, below = self._cuda_widgets("")
        ctl = self._w["ctl-devices"]
        await ctl.mount_all(row)
        await self._w[group_id(BY_PATH["devices"].group)].mount_all(below, after=ctl)
        for w in row + below:
            self._w[w.id] = w
        if self._quitting():
            return  # quit during the mount: the Selects' inner parts may be gone already
        self._cuda_ready = True
        self._apply_cuda_devices(self._cuda_pending)
        self._edited()  # the screen re-applies visibility: update_devices picks the widget to show

    def w(self, wid: str):
        """A field widget by id (mounted or about to be)."""
        return self._w[wid]

    # ------------------------------------------------------------------ sections
    def group_shown(self, group: str) -> bool:
        """Whether a section has anything to show for the values the form holds now."""
        return any(f.path in self.problems or f.shown(self.value_of) for f in FIELDS if f.group == group)

    def group_of(self, widget) -> str | None:
        """The section a widget sits in, if any."""
        ids = {group_id(g): g for g in GROUPS}
        for node in widget.ancestors_with_self:
            if node.id in ids:
                return ids[node.id]
        return None

    def control(self, path: str):
        """The widget that takes focus for a field; None while it is hidden or not mounted."""
        f = BY_PATH[path]
        if not self._mounted(f):
            return None
        for part in self._parts(f):
            if not part.display:
                continue
            for w in [part, *part.query("Input, Select, Switch, SelectionList")]:
                if isinstance(w, (Input, Select, Switch, SelectionList)) and w.display and w.focusable:
                    return w
        return None

    def first_control(self, group: str):
        return next((w for f in FIELDS if f.group == group for w in [self.control(f.path)] if w is not None), None)

    def _mounted(self, f: Field) -> bool:
        return f.path in self._mounted_paths

    def _parts(self, f: Field) -> list:
        """The widgets that make up one field on screen (label, control, message)."""
        s = _slug(f.path)
        ids = ["lbl-" + s, "ctl-" + s if (f.kind == "devices" or CUSTOM in f.choices) else f.wid, "msg-" + s]
        if f.kind == "devices":
            ids += ["f-devices-gpus", "gpu-note"]
        return [self._w[i] for i in ids if i in self._w]

    # ------------------------------------------------------------------ reading
    def devices_mode(self) -> str:
        """procs (CPU count) | text (no GPU list) | one (single GPU) | many (GPU multi-select)."""
        if self.value_of("accelerator") != "cuda":
            return "procs"
        if not self.gpus:
            return "text"
        return "one" if _one_device(self.value_of("strategy")) else "many"

    def _cuda_value(self, mode: str):
        if not self._cuda_ready:
            return copy.deepcopy(self._cuda_pending)
        if mode == "text":
            return parse_text("devices", self._w["f-devices-text"].value)
        if mode == "one":
            v = self._w["f-devices-gpu"].value
            return [v] if isinstance(v, int) else []
        return sorted(self._w["f-devices-gpus"].selected)

    def value_of(self, path: str):
        f = BY_PATH[path]
        if not self._mounted(f):
            return get_path(self.data, path)
        if f.kind == "devices":
            mode = self.devices_mode()
            if mode == "procs":
                return parse_text("int", self._w["f-devices-procs"].value)
            return self._cuda_value(mode)
        w = self._w[f.wid]
        if f.kind == "choice":
            if w.value == CUSTOM:
                return self._w[f.wid + "-custom"].value.strip()
            return w.value
        if f.kind == "bool":
            return bool(w.value)
        if f.kind == "str":
            return w.value
        return parse_text(f.kind, w.value)

    def to_dict(self) -> dict:
        d: dict = {"schema_version": SCHEMA_VERSION}
        for f in FIELDS:
            set_path(d, f.path, self.value_of(f.path))
        return d

    # ------------------------------------------------------------------ writing
    def load(self, data: dict) -> None:
        """Show a normalized config dict (RunConfig.to_dict())."""
        self.data = copy.deepcopy(data)
        for f in FIELDS:
            if not self._mounted(f):
                continue
            value = get_path(data, f.path)
            if f.kind == "devices":
                if data.get("accelerator") == "cpu":
                    self._w["f-devices-procs"].value = format_value("int", value)
                else:
                    self._apply_cuda_devices(value)
                continue
            w = self._w[f.wid]
            if f.kind == "choice":
                w.value = value if value in f.choices else CUSTOM
                if CUSTOM in f.choices:
                    self._w[f.wid + "-custom"].value = "" if value in f.choices else str(value)
            elif f.kind == "bool":
                w.value = bool(value)
            else:
                w.value = format_value(f.kind, value)
        self._last_strategy = data.get("strategy")
        self._set_names()

    def _set_names(self) -> None:
        """A loop preset's name and description say nothing of a user's script: a script run takes
        its name from the script (as `torchdeck launch` does) while the name is one the form or such
        a preset put there, never one the user typed."""
        loop = not kind_of(self.data.get("strategy")).is_script
        self._loop_name = self.data.get("name", "")
        self._given_names = {self._loop_name} if loop else set()
        self._loop_description = self.data.get("description") if loop else None

    def _put(self, path: str, text: str) -> None:
        """Set a text field, mounted or not (an unmounted field reads from self.data)."""
        f = BY_PATH[path]
        if self._mounted(f):
            self._w[f.wid].value = text
        else:
            set_path(self.data, path, text)

    def _name_from_script(self) -> None:
        if not kind_of(self.value_of("strategy")).is_script or self.value_of("name") not in self._given_names:
            return
        name = script_name(self.value_of("script.path"), self.value_of("script.module"))
        self._given_names.add(name)
        if name != self.value_of("name"):
            self._put("name", name)
            self._edited()

    def _apply_cuda_devices(self, value) -> None:
        """Put a cuda devices value into every cuda widget, so switching modes keeps it."""
        if not self._cuda_ready:
            self._cuda_pending = copy.deepcopy(value)
            return
        self._w["f-devices-text"].value = format_value("devices", value)
        known = [g.index for g in self.gpus]
        chosen = known if value == "all" else (value if isinstance(value, list) else [])
        missing = [i for i in chosen if i not in known]
        sl = self._w["f-devices-gpus"]
        sl.clear_options()
        sl.add_options([Selection(gpu_label(g), g.index, g.index in chosen) for g in self.gpus]
                       + [Selection(f"GPU {i}  not on this host", i, True) for i in missing])
        if sl.option_count:
            sl.highlighted = 0
        one = self._w["f-devices-gpu"]
        one.set_options([(gpu_label(g), g.index) for g in self.gpus]
                        + [(f"GPU {i}  not on this host", i) for i in missing])
        if chosen:
            one.value = chosen[0]

    def pick_free_gpus(self) -> tuple[bool, str]:
        """The GPU picker's "pick free GPUs": as many as are chosen now (at least one), by the rule
        of `devices: free:N` (engine.hardware: no other process, least memory used first)."""
        from ...engine.hardware import GPUInfo, pick_free_gpus

        mode = self.devices_mode()
        n = 1 if mode == "one" else max(1, len(self._cuda_value("many")))
        infos = [GPUInfo(g.index, g.name, int(g.mem_total_mb or 0), int(g.mem_used_mb or 0), bool(g.pids),
                         [(p, 0) for p in g.pids]) for g in self.gpus]
        picked, why = pick_free_gpus(infos, n)
        if picked is None:
            return False, why
        self._apply_cuda_devices(picked)
        self.post_message(self.Edited())
        return True, why

    def set_gpus(self, samples: list, ok: bool, reason: str) -> None:
        """The GPU list arrived (from a thread); keep whatever devices the form already holds."""
        was = "text" if not self.gpus else ("one" if _one_device(self.value_of("strategy")) else "many")
        current = self._cuda_value(was)  # hidden widgets keep their state under accelerator cpu
        self.gpus = list(samples)
        self.gpus_known = True
        self.gpu_reason = "" if ok and samples else (reason or "no NVIDIA GPU found")
        self._apply_cuda_devices(current)
        self.update_devices()

    def update_devices(self) -> None:
        if "f-devices-procs" not in self._w:
            return  # not mounted yet: show_problems calls this again once it is
        mode = self.devices_mode()
        self._w["f-devices-procs"].display = mode == "procs"
        if self._cuda_ready:
            self._w["f-devices-text"].display = mode == "text"
            self._w["f-devices-gpu"].display = mode == "one"
            self._w["f-devices-gpus"].display = mode == "many"
        note = self._w["gpu-note"]
        if "devices" in self.refused and mode == "procs":
            text = self.refused["devices"]
        elif "devices" in self.problems:
            text = self.problems["devices"]
        elif "devices" in self._warnings:  # more CPU ranks than cores (engine.preflight.advice)
            text = self._warnings["devices"]
        elif mode == "procs":
            from ...engine.strategies import get_strategy, names

            strategy = self.value_of("strategy")
            text = get_strategy(strategy).cpu_devices_hint() if strategy in names() else ""
        elif mode == "text":
            text = f"no GPU list: {self.gpu_reason}" if self.gpus_known else "looking for GPUs…"
        else:
            text = "space: pick/unpick a GPU" if mode == "many" else ""
        note.update(text)
        note.set_class("devices" in self.problems, "-error")
        note.set_class("devices" not in self.problems and text in (self.refused.get("devices"),
                                                                   self._warnings.get("devices")), "-warning")
        note.display = bool(text)

    # ------------------------------------------------------------------ problems and visibility
    def is_invalid(self, path: str) -> bool:
        return self._w["lbl-" + _slug(path)].has_class("-invalid")

    def is_shown(self, path: str) -> bool:
        return self._w["lbl-" + _slug(path)].display

    def message(self, path: str) -> str:
        if path == "devices":
            return str(self._w["gpu-note"].render())
        found = self._w.get("msg-" + _slug(path))
        return str(found.render()) if found and found.display else ""

    def _message_widget(self, f: Field) -> Static:
        found = self._w.get("msg-" + _slug(f.path))
        if found:
            return found
        msg = FieldMessage("", id="msg-" + _slug(f.path), classes="field-msg span2", markup=False)
        parts = self._parts(f)
        self._w[group_id(f.group)].mount(msg, after=parts[-1])
        self._w[msg.id] = msg
        return msg

    def show_problems(self, problems: dict[str, str], warnings: dict[str, str] | None = None) -> None:
        """Mark fields with errors (they refuse Launch) and warnings (they only advise)."""
        self.problems = problems
        warnings = self._warnings = warnings or {}
        strategy = self.value_of("strategy")
        for f in FIELDS:
            if not self._mounted(f):
                continue
            why = problems.get(f.path)
            warn = warnings.get(f.path) if why is None else None
            shown = why is not None or f.shown(self.value_of)
            parts = self._parts(f)
            for w in parts:
                w.display = shown
                w.set_class(why is not None, "-invalid")
                w.set_class(warn is not None, "-warning")
            if f.kind == "devices":
                continue
            hint = f.hint
            if f.path == "train.batch_size":
                hint = _batch_hint(strategy)
            note = self.refused.get(f.path)  # a key just refused: said until the next edit
            if why is not None or warn is not None or hint or note:
                msg = self._message_widget(f)
                msg.update(note or why or warn or hint)
                msg.set_class(why is not None, "-error")
                msg.set_class(why is None and (warn is not None or note is not None), "-warning")
                msg.display = shown
            elif "msg-" + _slug(f.path) in self._w:  # a fixed error on a field without a hint
                self._w["msg-" + _slug(f.path)].display = False
        for group in self.mounted_groups:
            shown = any(why for f in FIELDS if f.group == group for why in [f.path in problems or f.shown(self.value_of)])
            self._w[group_id(group) + "-title"].display = shown
            self._w[group_id(group)].display = shown
        for path in ("model.name", "data.dataset"):
            if self._mounted(BY_PATH[path]):
                wid = "f-" + _slug(path)
                self._w[wid + "-custom"].display = self._w[wid].value == CUSTOM
        self.update_devices()

    # ------------------------------------------------------------------ edits
    def _edited(self) -> None:
        if not self._pending:
            self._pending = True
            self.call_after_refresh(self._emit)

    def _emit(self) -> None:
        self._pending = False
        self.post_message(self.Edited())

    def on_input_changed(self, event: Input.Changed) -> None:
        event.stop()
        path = self._path_of(event.input)
        if path in self.refused:
            del self.refused[path]  # an edit that went in: the note on the refused key goes
        if path in ("script.path", "script.module"):
            self._name_from_script()
        self._edited()

    def on_form_input_refused(self, event: FormInput.Refused) -> None:
        event.stop()
        path = self._path_of(event.input)
        if path is None:
            return
        f = BY_PATH[path]
        if f.kind == "float":
            self.refused[path] = f"{f.label} takes a number such as 0.01 or 1e-3"
        else:
            self.refused[path] = f"{f.label} takes a whole number such as {get_path(RunConfig().to_dict(), path)}"
        self.show_problems(self.problems, self._warnings)

    def _path_of(self, widget) -> str | None:
        if widget.id == "f-devices-procs":
            return "devices"
        f = next((f for f in FIELDS if f.wid == widget.id), None)
        return f.path if f is not None else None

    def on_switch_changed(self, event: Switch.Changed) -> None:
        event.stop()
        self._edited()

    def on_selection_list_selected_changed(self, event: SelectionList.SelectedChanged) -> None:
        event.stop()
        self._edited()

    def on_select_changed(self, event: Select.Changed) -> None:
        event.stop()
        if event.select.id == "f-strategy" and event.value != self._last_strategy:
            old, self._last_strategy = self._last_strategy, event.value
            self._follow_strategy(event.value, old)
        self._edited()

    def _follow_strategy(self, strategy, old_strategy) -> None:
        """A new strategy keeps what fits it and resets what it refuses, and says what changed in
        one line: the accelerator it needs (cpu for a CPU strategy, or where this host has no GPU),
        a CPU process count it takes, a backend it can use; a GPU choice carries over between the
        one-GPU picker and the list."""
        from ...engine.strategies import get_strategy, names

        if strategy not in names():
            return
        if kind_of(strategy).is_script:
            self._name_from_script()
            if self._loop_description and self.value_of("description") == self._loop_description:
                self._put("description", "")  # the loop preset's words, not this script's
        elif kind_of(old_strategy).is_script and self._loop_description is not None:  # back to the loop preset's
            if self.value_of("name") in self._given_names:
                self._put("name", self._loop_name)
            if self.value_of("description") == "":
                self._put("description", self._loop_description)
        strat = get_strategy(strategy)
        acc = self._w["f-accelerator"]
        old_acc = acc.value
        old_mode = self._mode(old_acc, old_strategy)
        old_devices = self.value_of("devices") if old_mode == "procs" else self._cuda_value(old_mode)
        changes = []
        new_acc = old_acc
        if strat.needs_cuda and old_acc != "cuda":
            new_acc, why = "cuda", f"{strategy} runs on GPUs"
        elif strat.cpu_only and old_acc != "cpu":
            new_acc, why = "cpu", f"{strategy} trains on the CPU"
        elif old_acc == "cuda" and not strat.needs_cuda and self.gpus_known and not self.gpus:
            new_acc, why = "cpu", "this host has no GPU"
        if new_acc != old_acc:
            acc.value = new_acc
            changes.append(f"accelerator {old_acc} -> {new_acc} ({why})")
        nodes = self.value_of("nodes.num_nodes")
        nodes = nodes if isinstance(nodes, int) and nodes >= 1 else 1
        if new_acc == "cpu":
            have = old_devices if old_mode == "procs" and isinstance(old_devices, int) else None
            fits = [k for k in ([have] if have else []) + [1, 2]
                    if devices_problem(strategy, "cpu", k, nodes) is None]
            if fits and fits[0] != have:
                was = str(have) if have is not None else (format_value("devices", old_devices) or "none")
                unit = "process" if fits[0] == 1 else ("processes" if strat.distributed else "stages")
                why = f"{strategy} runs one process" if fits[0] == 1 else f"{strategy} needs {fits[0]} or more {unit}"
                changes.append(f"devices {was} -> {fits[0]} ({why})")
                self._w["f-devices-procs"].value = str(fits[0])
        elif {old_mode, self._mode(new_acc, strategy)} == {"one", "many"} and isinstance(old_devices, list):
            # the GPUs picked in one picker stay picked in the other, unless it holds them already
            one = self._w["f-devices-gpu"]
            if old_mode == "many" and old_devices and one.value not in old_devices:
                one.value = old_devices[0]
            elif old_mode == "one" and not set(old_devices) <= set(self._cuda_value("many")):
                self._apply_cuda_devices(old_devices)
            if old_mode == "many" and len(old_devices) > 1:
                changes.append(f"devices {format_value('devices', old_devices)} -> {one.value} (gpu uses one GPU)")
        backend = self.value_of("backend")
        if backend != "auto" and strat.distributed and backend_problem(strategy, new_acc, backend):
            self._w["f-backend"].value = "auto"
            changes.append(f"backend {backend} -> auto ({backend_problem(strategy, new_acc, backend)})")
        if changes:
            self.notify(f"strategy {strategy}: " + "; ".join(changes), timeout=8)

    def _mode(self, accelerator, strategy) -> str:
        """devices_mode for an accelerator and strategy (the widgets may say others already)."""
        if accelerator != "cuda":
            return "procs"
        if not self.gpus:
            return "text"
        return "one" if _one_device(strategy) else "many"


def _one_device(strategy) -> bool:
    """The strategy trains on exactly one GPU: the form offers a one-GPU picker."""
    from ...engine.strategies import get_strategy, known

    return known(strategy) and get_strategy(strategy).one_device


def _batch_hint(strategy) -> str:
    """What train.batch_size means for the strategy, under the field."""
    from ...engine.strategies import Strategy, get_strategy, known

    return (get_strategy(strategy) if known(strategy) else Strategy).batch_hint


def script_name(path, module) -> str:
    """A script run's name, by `torchdeck launch`'s rule: the module's last part, else the
    script's file stem, else "script"."""
    from pathlib import Path

    if isinstance(module, str) and module.strip():
        return module.strip().rsplit(".", 1)[-1] or "script"
    return (Path(path.strip()).stem if isinstance(path, str) and path.strip() else "") or "script"


def _probe(strategy: str, accelerator: str, devices, nodes: int = 1, backend: str = "auto"):
    """A default config with these settings, for asking a strategy what it takes."""
    cfg = RunConfig(strategy=strategy, accelerator=accelerator, devices=devices, backend=backend)
    cfg.nodes.num_nodes = nodes
    cfg.nodes.master_port = 29500  # several nodes need a fixed port; not what is asked here
    return cfg


def devices_problem(strategy: str, accelerator: str, devices, nodes: int = 1) -> str | None:
    """What `strategy` says of these devices, or None when it takes them (its own words)."""
    from ...engine.strategies import get_strategy

    found = get_strategy(strategy).check(_probe(strategy, accelerator, devices, nodes), None)
    return next((why for f, why in found if f == "devices"), None)


def backend_problem(strategy: str, accelerator: str, backend: str) -> str | None:
    """Why `backend` cannot serve `strategy` on `accelerator` (the schema's or the strategy's words)."""
    from ...engine import config as cfgmod
    from ...engine.strategies import get_strategy

    if backend == "nccl" and accelerator != "cuda":
        return "nccl needs CUDA GPUs"
    if backend not in cfgmod.BACKENDS:
        return None
    devices = 2 if accelerator == "cpu" else [0, 1]
    found = get_strategy(strategy).check(_probe(strategy, accelerator, devices, backend=backend), None)
    return next((why.split(":")[0] for f, why in found if f == "backend"), None)


def no_gpu_picked(strategy: str) -> str:
    """devices under accelerator cuda with no GPU picked: what the strategy needs (dp two, not one)."""
    from ...engine.strategies import names

    one = devices_problem(strategy, "cuda", [0]) if strategy in names() else None
    return f"no GPU picked: {one}" if one else "pick at least one GPU"
