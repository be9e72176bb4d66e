"""What the Configure form does when the strategy changes: it keeps what fits the new one and
resets what it refuses (accelerator, devices, backend), saying so in one line; a script run takes
its name from the script. Mixed into ConfigForm."""
from __future__ import annotations

from .fields import BY_PATH, format_value, set_path
from ...engine.config import RunConfig
from ...engine.kinds import kind_of


class StrategyFollowing:
    """The form's answer to a new strategy (and to a script's path or module for its name)."""

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

    def _follow_strategy(self, strategy, old_strategy) -> None:
        """A new strategy keeps what fits it and resets what it refuses, and says what changed in
        one line: the accelerator it needs (cpu for a CPU strategy, or where this host has no GPU),
        a CPU process count it takes, a backend it can use; a GPU choice carries over between the
        one-GPU picker and the list."""
        from ...engine.strategies import get_strategy, names

        if strategy not in names():
            return
        self._follow_kind(strategy, old_strategy)
        strat = get_strategy(strategy)
        acc = self._w["f-accelerator"]
        old_acc = acc.value
        old_mode = self._mode(old_acc, old_strategy)
        old_devices = self.value_of("devices") if old_mode == "procs" else self._cuda_value(old_mode)
        changes = []
        new_acc, why = self._accelerator_for(strategy, strat, old_acc)
        if new_acc != old_acc:
            acc.value = new_acc
            changes.append(f"accelerator {old_acc} -> {new_acc} ({why})")
        if new_acc == "cpu":
            changes += self._cpu_devices_for(strategy, strat, old_mode, old_devices)
        else:
            changes += self._gpus_carried(strategy, new_acc, old_mode, old_devices)
        backend = self.value_of("backend")
        if backend != "auto" and strat.distributed and backend_problem(strategy, new_acc, backend):
            self._w["f-backend"].value = "auto"
            changes.append(f"backend {backend} -> auto ({backend_problem(strategy, new_acc, backend)})")
        if changes:
            self.notify(f"strategy {strategy}: " + "; ".join(changes), timeout=8)

    def _follow_kind(self, strategy, old_strategy) -> None:
        """To a script: its own name, not the loop preset's words; back to the loop: the preset's."""
        if kind_of(strategy).is_script:
            self._name_from_script()
            if self._loop_description and self.value_of("description") == self._loop_description:
                self._put("description", "")  # the loop preset's words, not this script's
        elif kind_of(old_strategy).is_script and self._loop_description is not None:  # back to the loop preset's
            if self.value_of("name") in self._given_names:
                self._put("name", self._loop_name)
            if self.value_of("description") == "":
                self._put("description", self._loop_description)

    def _accelerator_for(self, strategy, strat, old_acc) -> tuple[str, str]:
        """(the accelerator the strategy needs, why), else (the one it has, "")."""
        if strat.needs_cuda and old_acc != "cuda":
            return "cuda", f"{strategy} runs on GPUs"
        if strat.cpu_only and old_acc != "cpu":
            return "cpu", f"{strategy} trains on the CPU"
        if old_acc == "cuda" and not strat.needs_cuda and self.gpus_known and not self.gpus:
            return "cpu", "this host has no GPU"
        return old_acc, ""

    def _cpu_devices_for(self, strategy, strat, old_mode, old_devices) -> list[str]:
        """A CPU process count the strategy takes: the one the form has when it fits, else 1 or 2."""
        nodes = self.value_of("nodes.num_nodes")
        nodes = nodes if isinstance(nodes, int) and nodes >= 1 else 1
        have = old_devices if old_mode == "procs" and isinstance(old_devices, int) else None
        fits = [k for k in ([have] if have else []) + [1, 2]
                if devices_problem(strategy, "cpu", k, nodes) is None]
        if not fits or fits[0] == have:
            return []
        was = str(have) if have is not None else (format_value("devices", old_devices) or "none")
        unit = "process" if fits[0] == 1 else ("processes" if strat.distributed else "stages")
        why = f"{strategy} runs one process" if fits[0] == 1 else f"{strategy} needs {fits[0]} or more {unit}"
        self._w["f-devices-procs"].value = str(fits[0])
        return [f"devices {was} -> {fits[0]} ({why})"]

    def _gpus_carried(self, strategy, new_acc, old_mode, old_devices) -> list[str]:
        """The GPUs picked in one picker stay picked in the other, unless it holds them already."""
        if {old_mode, self._mode(new_acc, strategy)} != {"one", "many"} or not isinstance(old_devices, list):
            return []
        one = self._w["f-devices-gpu"]
        if old_mode == "many" and old_devices and one.value not in old_devices:
            one.value = old_devices[0]
        elif old_mode == "one" and not set(old_devices) <= set(self._cuda_value("many")):
            self._apply_cuda_devices(old_devices)
        if old_mode == "many" and len(old_devices) > 1:
            return [f"devices {format_value('devices', old_devices)} -> {one.value} (gpu uses one GPU)"]
        return []


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
