"""One process on the CPU: the quick-start baseline every other strategy is compared with."""
from ..config import combination
from .base import Strategy


class CPUStrategy(Strategy):
    name = "cpu"
    summary = "one process on the CPU"

    def check(self, cfg, hw):
        p = super().check(cfg, hw)
        if cfg.accelerator != "cpu":
            p.append(combination(cfg, "accelerator", "strategy cpu trains on the CPU; pick gpu, dp or ddp for GPUs",
                                  "strategy", "accelerator"))
        elif cfg.devices != 1:
            p.append(combination(cfg, "devices", f"strategy cpu runs one process; for {cfg.devices} processes pick ddp",
                                  "strategy", "devices"))
        return p


STRATEGY = CPUStrategy()
