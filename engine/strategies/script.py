"""strategy script: the user's own training script, each rank started as torchrun starts it
(`torchdeck launch`, or a preset with a `script:` section). torchdeck does not wrap a model here:
the script does its own distributed setup from the environment torchrun sets."""
from __future__ import annotations

from ..config import combination
from .base import Strategy


class ScriptStrategy(Strategy):
    name = "script"
    summary = "your own script, one process per device, as torchrun starts it"
    order = 90
    section = "script"
    distributed = True  # the ranks meet through MASTER_ADDR/MASTER_PORT, if the script uses them

    def nprocs(self, cfg) -> int:
        """Processes per node: the number of devices (on cpu an int, or "auto": one per usable core)."""
        d = cfg.devices
        if cfg.accelerator == "cpu":
            if d == "auto":
                from ..affinity import usable_cpus

                return usable_cpus()
            return d if isinstance(d, int) and not isinstance(d, bool) else 1
        from ..config import free_gpus_asked

        return len(d) if isinstance(d, list) else (free_gpus_asked(d) or 1)

    def check(self, cfg, hw):
        p = []  # several nodes are fine; cuda on a GPU-less host is the schema's device rule
        s, d = cfg.script, cfg.devices
        if cfg.accelerator == "cuda" and isinstance(d, list) and len(set(d)) != len(d):
            p.append(("devices", f"each GPU may be listed once, got {d}"))
        if not s.path and not s.module:
            p.append(combination(cfg, "script.path", "a script run needs script.path (a script or, with no_python, "
                                 "an executable) or script.module (python -m MODULE)", "script.path", "script.module"))
        return p

    def cpu_devices_hint(self) -> str:
        return "number of processes (ranks) per node"

    def local_devices(self, cfg, local_rank: int) -> list[str]:
        if cfg.accelerator == "cpu":
            return ["cpu"]
        if isinstance(cfg.devices, list) and cfg.devices:
            return [f"cuda:{cfg.devices[local_rank % len(cfg.devices)]}"]
        return ["cuda (picked at launch)"]

    # torchdeck's loop never runs a script run's ranks: each part of it says so if ever asked
    def _not_ours(self, *args, **kwargs):
        raise NotImplementedError("strategy script runs the user's own script: torchdeck wraps no model, "
                                  "builds no optimizer and shards no data for it (the script does its own)")

    setup = wrap = unwrap = sampler = no_sync = make_optimizer = _not_ours
    save_checkpoint = load_checkpoint = model_state = optim_state = _not_ours
    load_model_state = load_optim_state = _not_ours


STRATEGY = ScriptStrategy()
