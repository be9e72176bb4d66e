"""The Configure form's devices field: a CPU process count, or under cuda a GPU picker (one GPU,
several from NVML's list, or typed indices when there is no list), and the note under it.
Mixed into ConfigForm."""
from __future__ import annotations

import copy

from textual.widgets import Input, SelectionList
from textual.widgets.selection_list import Selection

from .controls import FormSelect, group_id, show
from .fields import BY_PATH, format_value, parse_text

_GiB = 1024.0


def gpu_label(g) -> str:
    """One picker line: index, name, memory, and whether another process already uses it."""
    used, total = getattr(g, "mem_used_mb", None), getattr(g, "mem_total_mb", None)
    mem = f"{used / _GiB:.1f}/{total / _GiB:.0f} GiB" if used is not None and total else "memory n/a"
    pids = getattr(g, "pids", None) or []
    busy = f"  busy ({len(pids)} proc)" if pids else "  free"
    return f"GPU {g.index}  {g.name}  {mem}{busy}"


def _one_device(strategy) -> bool:
    """The strategy trains on exactly one GPU: the form offers a one-GPU picker."""
    from ...engine.strategies import get_strategy, known

    return known(strategy) and get_strategy(strategy).one_device


class DevicesField:
    """The devices field's widgets, its value in each mode, and the GPUs it offers."""

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

    def devices_mode(self) -> str:
        """procs (CPU count) | text (no GPU list) | one (single GPU) | many (GPU multi-select)."""
        if self.value_of("accelerator") != "cuda":
            return "procs"
        if not self.gpus:
            return "text"
        return "one" if _one_device(self.value_of("strategy")) else "many"

    def _mode(self, accelerator, strategy) -> str:
        """devices_mode for an accelerator and strategy (the widgets may say others already)."""
        if accelerator != "cuda":
            return "procs"
        if not self.gpus:
            return "text"
        return "one" if _one_device(strategy) else "many"

    def _cuda_value(self, mode: str):
        if not self._cuda_ready:
            return copy.deepcopy(self._cuda_pending)
        if mode == "text":
            return parse_text("devices", self._w["f-devices-text"].value)
        if mode == "one":
            v = self._w["f-devices-gpu"].value
            return [v] if isinstance(v, int) else []
        return sorted(self._w["f-devices-gpus"].selected)

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
        show(note, text)
        note.set_class("devices" in self.problems, "-error")
        note.set_class("devices" not in self.problems and text in (self.refused.get("devices"),
                                                                   self._warnings.get("devices")), "-warning")
        note.display = bool(text)
