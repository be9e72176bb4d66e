"""The small interface every strategy shares.

Config side (no torch): how many processes per node, what the strategy requires of the config.
Runtime side (torch imported inside methods): wrap the model, shard the data, unwrap for saving,
skip gradient sync on accumulation micro-steps.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any


@dataclass
class RankContext:
    """What a rank knows about itself once the process group is up."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int
    device: Any  # torch.device
    cfg: Any  # RunConfig


class Strategy:
    name = "base"
    summary = ""
    distributed = False  # True: one process group across nprocs x num_nodes ranks
    needs_cuda = False

    # ------------------------------------------------------------ config side (no torch)
    def nprocs(self, cfg) -> int:
        return 1

    def check(self, cfg, hw) -> list[tuple[str, str]]:
        """Problems with `cfg` for this strategy, as (field, reason)."""
        problems = []
        if self.needs_cuda and cfg.accelerator != "cuda":
            problems.append(("accelerator", f"strategy {self.name} needs accelerator cuda (GPUs)"))
        if not self.distributed and cfg.nodes.num_nodes > 1:
            problems.append(("nodes.num_nodes", f"strategy {self.name} runs in one process; use ddp, fsdp or zero for several nodes"))
        return problems

    def cpu_devices_hint(self) -> str:
        """What `devices` counts with accelerator cpu (the form's hint under the field)."""
        return "number of CPU processes (ranks)" if self.distributed else "one process on the CPU"

    def local_devices(self, cfg, local_rank: int) -> list[str]:
        """Devices a local rank uses (for the summary line and the GPU pane)."""
        return [cfg.device_for(local_rank)]

    # ------------------------------------------------------------ runtime side (torch)
    def wrap(self, model, ctx: RankContext):
        """Move the model to its device(s) and wrap it. Returns the module to train."""
        return model.to(ctx.device)

    def unwrap(self, model):
        """The plain module whose state_dict loads without this strategy."""
        return model

    def sampler(self, dataset, ctx: RankContext, shuffle: bool, seed: int):
        """A sampler that shards `dataset` across ranks, or None for a plain loader."""
        return None

    def no_sync(self, model):
        """Context for accumulation micro-steps that must not communicate."""
        return contextlib.nullcontext()

    def make_optimizer(self, params_fn, model):
        """Build the optimizer; ZeRO overrides this to shard its state."""
        return params_fn(model.parameters())

    # ------------------------------------------------------------ checkpoint state
    # Called on EVERY rank (sharded strategies need a collective to gather); only rank 0 writes.
    def model_state(self, model, ctx: RankContext) -> dict:
        """A full state_dict that loads into the plain, unwrapped model."""
        return self.unwrap(model).state_dict()

    def optim_state(self, optimizer, model, ctx: RankContext) -> dict:
        return optimizer.state_dict()

    def load_model_state(self, model, state: dict, ctx: RankContext) -> None:
        self.unwrap(model).load_state_dict(state)

    def load_optim_state(self, optimizer, model, state: dict, ctx: RankContext) -> None:
        optimizer.load_state_dict(state)
