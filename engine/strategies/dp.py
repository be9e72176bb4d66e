"""nn.DataParallel: one process scatters each batch over its GPUs; GPU 0 gathers (and is heavier)."""
from ..config import combination
from .base import Strategy


class DPStrategy(Strategy):
    name = "dp"
    summary = "nn.DataParallel, one process, batch split over GPUs"
    order = 30
    needs_cuda = True
    batch_hint = "batch size is the total across GPUs (dp splits each batch)"

    def check(self, cfg, hw):
        p = super().check(cfg, hw)
        if cfg.accelerator == "cuda" and isinstance(cfg.devices, list):
            if len(cfg.devices) < 2:
                p.append(combination(cfg, "devices", "dp splits each batch over 2 or more GPUs; with one GPU pick gpu",
                                      "strategy", "devices"))
            elif cfg.train.batch_size < len(cfg.devices):
                p.append(("train.batch_size", f"dp's batch size is the total across devices: at least {len(cfg.devices)} for {len(cfg.devices)} GPUs"))
        return p

    def placement(self, base):
        gpus = base.devices if base.accelerator == "cuda" and isinstance(base.devices, list) else []
        return ["accelerator=cuda", "devices=" + (f"[{','.join(map(str, gpus))}]" if len(gpus) >= 2 else "all")]

    def local_devices(self, cfg, local_rank):
        return [f"cuda:{i}" for i in cfg.devices] if isinstance(cfg.devices, list) else ["cuda"]

    # ------------------------------------------------------------ runtime
    def wrap(self, model, ctx):
        """Parameters live on the first GPU; each forward replicates them onto the others."""
        import torch

        ids = list(ctx.cfg.devices)
        first = torch.device(f"cuda:{ids[0]}")
        return torch.nn.DataParallel(model.to(first), device_ids=ids, output_device=ids[0])

    def unwrap(self, model):
        import torch

        return model.module if isinstance(model, torch.nn.DataParallel) else model


STRATEGY = DPStrategy()
