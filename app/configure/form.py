"""The configure form: every RunConfig setting, grouped, scrollable, keyboard-only.

The form turns widgets into a config dict and back; it does not validate. The screen feeds it
the problems engine.config finds, and the form marks those fields (`-invalid`) with the reason.

Its rooms: build.py mounts the sections a part at a time (the first frame comes early; until a
field is mounted its value comes from the loaded dict, so reading the form is always complete),
devices.py is the devices field and its GPU pickers, follow.py what a new strategy changes,
controls.py the form's own widgets. Here: reading and writing values, marking problems, edits.
"""
from __future__ import annotations

import copy

from textual.containers import VerticalScroll
from textual.message import Message
from textual.widgets import Input, Select, SelectionList, Static, Switch

from .build import FormBuilding
from .controls import FieldMessage, FormInput, group_id, show, slug
from .devices import DevicesField
from .fields import BY_PATH, CUSTOM, FIELDS, GROUPS, Field, format_value, get_path, parse_text, set_path
from .follow import StrategyFollowing
from .where import WhereField
from ...engine.config import SCHEMA_VERSION, RunConfig


class ConfigForm(FormBuilding, DevicesField, StrategyFollowing, WhereField, VerticalScroll):
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
        s = slug(f.path)
        ids = ["lbl-" + s, "ctl-" + s if (f.kind == "devices" or CUSTOM in f.choices) else f.wid, "msg-" + s]
        if f.kind == "devices":
            ids += ["f-devices-gpus", "gpu-note"]
        return [self._w[i] for i in ids if i in self._w]

    # ------------------------------------------------------------------ reading
    def value_of(self, path: str):
        f = BY_PATH[path]
        if not self._mounted(f):
            return get_path(self.data, path) if f.schema else self.where_initial
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
        if f.kind in ("str", "partition"):
            return w.value
        return parse_text(f.kind, w.value)

    def to_dict(self) -> dict:
        d: dict = {"schema_version": SCHEMA_VERSION}
        for f in FIELDS:
            if f.schema:  # where is the form's own: what F5 does with the config, not part of it
                set_path(d, f.path, self.value_of(f.path))
        return d

    # ------------------------------------------------------------------ writing
    def load(self, data: dict) -> None:
        """Show a normalized config dict (RunConfig.to_dict())."""
        self.data = copy.deepcopy(data)
        for f in FIELDS:
            if not self._mounted(f) or not f.schema:  # a preset leaves where as it was
                continue
            value = get_path(data, f.path)
            if f.kind == "devices":
                if data.get("accelerator") == "cpu":
                    self._w["f-devices-procs"].value = format_value("int", value)
                else:
                    self._apply_cuda_devices(value)
                continue
            w = self._w[f.wid]
            if f.kind == "partition":
                self.show_partition(value)
            elif f.kind == "choice":
                w.value = value if value in f.choices else CUSTOM
                if CUSTOM in f.choices:
                    self._w[f.wid + "-custom"].value = "" if value in f.choices else str(value)
            elif f.kind == "bool":
                w.value = bool(value)
            else:
                w.value = format_value(f.kind, value)
        self._last_strategy = data.get("strategy")
        self._set_names()

    # ------------------------------------------------------------------ problems and visibility
    def is_invalid(self, path: str) -> bool:
        return self._w["lbl-" + slug(path)].has_class("-invalid")

    def is_shown(self, path: str) -> bool:
        return self._w["lbl-" + slug(path)].display

    def message(self, path: str) -> str:
        if path == "devices":
            return str(self._w["gpu-note"].render())
        found = self._w.get("msg-" + slug(path))
        return str(found.render()) if found and found.display else ""

    def _message_widget(self, f: Field) -> Static:
        found = self._w.get("msg-" + slug(f.path))
        if found:
            return found
        msg = FieldMessage("", id="msg-" + slug(f.path), classes="field-msg span2", markup=False)
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
            # Each widget's display is set once, to its final value: shown then hidden again
            # in one pass is a new layout of the whole screen on every key.
            text = note = ""
            if f.kind != "devices":
                hint = _batch_hint(strategy) if f.path == "train.batch_size" else f.hint
                note = self.refused.get(f.path)  # a key just refused: said until the next edit
                text = note or why or warn or hint
            for w in self._parts(f):
                if w.id not in _SHOWN_BY_DEVICES:  # a message with nothing to say hides
                    w.display = shown and (bool(text) or not w.id.startswith("msg-"))
                w.set_class(why is not None, "-invalid")
                w.set_class(warn is not None, "-warning")
            if text:
                msg = self._message_widget(f)
                show(msg, text)
                msg.set_class(why is not None, "-error")
                msg.set_class(why is None and (warn is not None or note is not None), "-warning")
                msg.display = shown
        for group in self.mounted_groups:
            shown = any(why for f in FIELDS if f.group == group for why in [f.path in problems or f.shown(self.value_of)])
            self._w[group_id(group) + "-title"].display = shown
            self._w[group_id(group)].display = shown
        for path in ("model.name", "data.dataset"):
            if self._mounted(BY_PATH[path]):
                wid = "f-" + slug(path)
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


# the GPU list and the note under devices: update_devices shows them by the devices mode
_SHOWN_BY_DEVICES = ("f-devices-gpus", "gpu-note")


def _batch_hint(strategy) -> str:
    """What train.batch_size means for the strategy, under the field."""
    from ...engine.strategies import Strategy, get_strategy, known

    return (get_strategy(strategy) if known(strategy) else Strategy).batch_hint


