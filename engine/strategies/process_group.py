"""ProcessGroupStrategy: what the strategies with one process per device and a process group
(ddp, zero, fsdp, deepspeed) share: how many processes, their config rule, data sharding."""
from ..config import combination
from .base import Strategy


class ProcessGroupStrategy(Strategy):
    distributed = True
    min_world = 2  # fewer ranks is plain training (deepspeed: 1, ZeRO-Offload on one GPU)

    def nprocs(self, cfg) -> int:
        if cfg.accelerator == "cpu":
            return cfg.devices if isinstance(cfg.devices, int) else 1
        from ..config import free_gpus_asked

        return len(cfg.devices) if isinstance(cfg.devices, list) else (free_gpus_asked(cfg.devices) or 1)

    def check(self, cfg, hw):
        p = super().check(cfg, hw)
        if cfg.devices != "all" and self.nprocs(cfg) * cfg.nodes.num_nodes < self.min_world:  # "all": count unknown yet
            p.append(combination(cfg, "devices", f"{self.name} with one process in all is plain training: pick 2 or "
                                 f"more devices (or nodes), or strategy {'gpu' if cfg.accelerator == 'cuda' else 'cpu'}",
                                 "strategy", "devices", "nodes.num_nodes"))
        return p

    def sampler(self, dataset, ctx, shuffle: bool, seed: int):
        """Rank r takes perm[r::world] of each epoch's permutation; drop_last keeps every rank's
        step count equal and matches one process with a world-times-larger batch."""
        from torch.utils.data import DistributedSampler

        return DistributedSampler(dataset, num_replicas=ctx.world_size, rank=ctx.rank,
                                  shuffle=shuffle, seed=seed, drop_last=True)
