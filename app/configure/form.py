"""The configure form: one row per RunConfig setting, grouped, scrollable, keyboard-only.

The form turns widgets into a config dict and back; it does not validate. The screen feeds it
the problems engine.config finds, and the form marks those rows (`-invalid`) with the reason.
"""
from __future__ import annotations

from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.widgets import Input, Label, Select, SelectionList, Static, Switch
from textual.widgets.selection_list import Selection

from app.configure.fields import (CUSTOM, FIELDS, GROUPS, Field, format_value, get_path, parse_text,
                                  set_path)
from engine.config import SCHEMA_VERSION

_INPUT_TYPE = {"int": "integer", "float": "number"}
_GiB = 1024.0


def row_id(path: str) -> str:
    return "row-" + path.replace(".", "-")


def gpu_label(g) -> str:
    """One picker line: index, name, memory, and whether another process already uses it."""
    mem = f"{g.mem_used_mb / _GiB:.1f}/{g.mem_total_mb / _GiB:.0f} GiB" if g.mem_total_mb else "memory n/a"
    busy = f"  busy ({len(g.pids)} proc)" if g.pids else "  free"
    return f"GPU {g.index}  {g.name}  {mem}{busy}"


class ConfigForm(VerticalScroll):
    """All settings. Posts `Edited` (coalesced) whenever the user changes anything."""

    class Edited(Message):
        pass

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.gpus: list = []  # GPU samples (index, name, mem_used_mb, mem_total_mb, pids)
        self.gpus_known = False
        self.gpu_reason = "looking for GPUs…"
        self._pending = False
        self._last_strategy: str | None = None

    # ------------------------------------------------------------------ building
    def compose(self):
        for group in GROUPS:
            yield Static(group, classes="group-title", id="group-" + group.split()[0].lower())
            for f in FIELDS:
                if f.group == group:
                    yield self._row(f)

    def _row(self, f: Field) -> Vertical:
        line = [Label(f.label, classes="field-label")]
        below = []
        if f.kind == "choice":
            opts = [(("custom…" if c == CUSTOM else c), c) for c in f.choices]
            line.append(Select(opts, allow_blank=False, value=f.choices[0], id=f.wid, compact=True))
            if CUSTOM in f.choices:
                line.append(Input(placeholder="package.module:callable", id=f.wid + "-custom", compact=True))
        elif f.kind == "bool":
            line.append(Switch(id=f.wid))
        elif f.kind == "devices":
            line.append(Input(type="integer", id="f-devices-procs", compact=True, tooltip="CPU processes"))
            line.append(Select([], allow_blank=True, prompt="pick a GPU", id="f-devices-gpu", compact=True))
            line.append(Input(placeholder="GPU indices: 0,1 or all", id="f-devices-text", compact=True))
            below.append(SelectionList(id="f-devices-gpus", compact=True))
            below.append(Static("", id="gpu-note", classes="field-hint"))
        else:
            line.append(Input(type=_INPUT_TYPE.get(f.kind, "text"), id=f.wid, compact=True))
        return Vertical(Horizontal(*line, classes="field-line"), *below,
                        Static("", classes="field-error"),
                        Static(f.hint, classes="field-hint" + ("" if f.hint else " -empty")),
                        id=row_id(f.path), classes="field")

    # ------------------------------------------------------------------ reading
    def devices_mode(self) -> str:
        """procs (CPU count) | text (no GPU list) | one (single GPU) | many (GPU multi-select)."""
        if self.query_one("#f-accelerator", Select).value != "cuda":
            return "procs"
        if not self.gpus:
            return "text"
        return "one" if self.query_one("#f-strategy", Select).value == "gpu" else "many"

    def _cuda_value(self, mode: str):
        if mode == "text":
            return parse_text("devices", self.query_one("#f-devices-text", Input).value)
        if mode == "one":
            v = self.query_one("#f-devices-gpu", Select).value
            return [v] if isinstance(v, int) else []
        return sorted(self.query_one("#f-devices-gpus", SelectionList).selected)

    def value_of(self, path: str):
        f = next(x for x in FIELDS if x.path == path)
        if f.kind == "devices":
            mode = self.devices_mode()
            if mode == "procs":
                return parse_text("int", self.query_one("#f-devices-procs", Input).value)
            return self._cuda_value(mode)
        w = self.query_one("#" + f.wid)
        if f.kind == "choice":
            if w.value == CUSTOM:
                return self.query_one("#" + f.wid + "-custom", Input).value.strip()
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
        for f in FIELDS:
            value = get_path(data, f.path)
            if f.kind == "devices":
                self._load_devices(value, data.get("accelerator"))
                continue
            w = self.query_one("#" + f.wid)
            if f.kind == "choice":
                if value in f.choices:
                    w.value = value
                else:
                    w.value = CUSTOM
                    self.query_one("#" + f.wid + "-custom", Input).value = str(value)
            elif f.kind == "bool":
                w.value = bool(value)
            else:
                w.value = format_value(f.kind, value)
        self._last_strategy = data.get("strategy")

    def _load_devices(self, value, accelerator) -> None:
        if accelerator == "cpu":
            self.query_one("#f-devices-procs", Input).value = format_value("int", value)
            return
        self._apply_cuda_devices(value)

    def _apply_cuda_devices(self, value) -> None:
        """Put a cuda devices value into every cuda widget, so switching modes keeps it."""
        self.query_one("#f-devices-text", Input).value = format_value("devices", value)
        known = [g.index for g in self.gpus]
        chosen = known if value == "all" else (value if isinstance(value, list) else [])
        sl = self.query_one("#f-devices-gpus", SelectionList)
        sl.clear_options()
        missing = [i for i in chosen if i not in known]
        sl.add_options([Selection(gpu_label(g), g.index, g.index in chosen) for g in self.gpus]
                       + [Selection(f"GPU {i}  not on this host", i, True) for i in missing])
        if sl.option_count:
            sl.highlighted = 0
        one = self.query_one("#f-devices-gpu", Select)
        one.set_options([(gpu_label(g), g.index) for g in self.gpus]
                        + [(f"GPU {i}  not on this host", i) for i in missing])
        if chosen:
            one.value = chosen[0]

    def set_gpus(self, samples: list, ok: bool, reason: str) -> None:
        """The GPU list arrived (from a thread); keep whatever devices the form already holds."""
        was = "text" if not self.gpus else (
            "one" if self.query_one("#f-strategy", Select).value == "gpu" else "many")
        current = self._cuda_value(was)  # hidden widgets keep their state under accelerator cpu
        self.gpus = list(samples)
        self.gpus_known = True
        self.gpu_reason = "" if ok and samples else (reason or "no NVIDIA GPU found")
        self._apply_cuda_devices(current)
        self.update_devices()

    def update_devices(self) -> None:
        mode = self.devices_mode()
        self.query_one("#f-devices-procs").display = mode == "procs"
        self.query_one("#f-devices-text").display = mode == "text"
        self.query_one("#f-devices-gpu").display = mode == "one"
        self.query_one("#f-devices-gpus").display = mode == "many"
        note = self.query_one("#gpu-note", Static)
        if mode == "procs":
            text = "number of CPU processes"
        elif mode == "text":
            text = f"no GPU list: {self.gpu_reason}" if self.gpus_known else "looking for GPUs…"
        else:
            text = "space: pick/unpick a GPU" if mode == "many" else ""
        note.update(text)
        note.display = bool(text)

    # ------------------------------------------------------------------ problems and visibility
    def show_problems(self, problems: dict[str, str]) -> None:
        for f in FIELDS:
            row = self.query_one("#" + row_id(f.path))
            why = problems.get(f.path)
            row.set_class(why is not None, "-invalid")
            err = row.query_one(".field-error", Static)
            err.update(why or "")
            err.display = why is not None
            shown = why is not None or f.shown(self.value_of)
            row.display = shown
        for group in GROUPS:
            title = self.query_one("#group-" + group.split()[0].lower())
            title.display = any(self.query_one("#" + row_id(f.path)).display for f in FIELDS if f.group == group)
        for path in ("model.name", "data.dataset"):
            wid = "#f-" + path.replace(".", "-")
            self.query_one(wid + "-custom").display = self.query_one(wid, Select).value == CUSTOM
        dp = self.query_one("#f-strategy", Select).value == "dp"
        hint = self.query_one("#" + row_id("train.batch_size")).query_one(".field-hint", Static)
        hint.update("batch size is the total across GPUs (dp splits each batch)" if dp else "per process")
        hint.remove_class("-empty")
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
        self._edited()

    def on_switch_changed(self, event: Switch.Changed) -> None:
        event.stop()
        self._edited()

    def on_selection_list_selected_changed(self, event: SelectionList.SelectedChanged) -> None:
        event.stop()
        self._edited()

    def on_select_changed(self, event: Select.Changed) -> None:
        event.stop()
        if event.select.id == "f-strategy" and event.value != self._last_strategy:
            self._last_strategy = event.value
            self._follow_strategy(event.value)
        self._edited()

    def _follow_strategy(self, strategy) -> None:
        """Strategies that only make sense on one accelerator switch it for the user."""
        from engine.strategies import get_strategy

        acc = self.query_one("#f-accelerator", Select)
        strat = get_strategy(strategy)
        if strat.needs_cuda and acc.value != "cuda":
            acc.value = "cuda"
        elif strategy == "cpu" and acc.value != "cpu":
            acc.value = "cpu"
            self.query_one("#f-devices-procs", Input).value = "1"
