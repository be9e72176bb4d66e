"""One process on the CPU: the quick-start baseline every other strategy is compared with."""
from ..config import combination
from .base import CPU_PLACEMENT, Strategy


class CPUStrategy(Strategy):
    name = "cpu"
    summary = "one process on the CPU"
    order = 10
    cpu_only = True
    compared_by_default = True

    def check(self, cfg, hw):
        p = super().check(cfg, hw)
        if cfg.accelerator != "cpu":
            p.append(combination(cfg, "accelerator", "strategy cpu trains on the CPU; pick gpu, dp or ddp for GPUs",
                                  "strategy", "accelerator"))
        elif cfg.devices != 1:
            p.append(combination(cfg, "devices", f"strategy cpu runs one process; for {cfg.devices} processes pick ddp",
                                  "strategy", "devices"))
        return p

    def placement(self, base):
        return CPU_PLACEMENT + ["devices=1"]


STRATEGY = CPUStrategy()
