"""One process on one CUDA device."""
from ..config import combination
from .base import Strategy


class GPUStrategy(Strategy):
    name = "gpu"
    summary = "one process on one GPU"
    order = 20
    needs_cuda = True
    one_device = True

    def check(self, cfg, hw):
        p = super().check(cfg, hw)
        if cfg.accelerator == "cuda" and isinstance(cfg.devices, list) and len(cfg.devices) != 1:
            p.append(combination(cfg, "devices", f"strategy gpu uses exactly one GPU, got {cfg.devices}; pick dp or ddp "
                                  "for several", "strategy", "devices"))
        return p

    def placement(self, base):
        gpus = base.devices if base.accelerator == "cuda" and isinstance(base.devices, list) else []
        return ["accelerator=cuda", f"devices=[{gpus[0] if gpus else 0}]"]


STRATEGY = GPUStrategy()
