"""The small interface every strategy shares.

Config side (no torch): how many processes per node, what the strategy requires of the config.
Runtime side (torch imported inside methods): wrap the model, shard the data, unwrap for saving,
skip gradient sync on accumulation micro-steps.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from ..config import combination

CPU_PLACEMENT = ["accelerator=cpu", "data.pin_memory=false", "data.on_device=false"]

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
    """Everything the house asks of a strategy, answered here rather than in a list of names kept
    by each asker (the form, compare, the memory estimate, validate, the Monitor). A module of this
    package that defines STRATEGY is a strategy: engine.strategies finds it (torch-free at import)."""

    name = "base"
    summary = ""
    order = 100  # where it stands in every list of strategies (the form, validate, compare)
    section = ""  # its own RunConfig section (cfg.ddp ...), shown in the form only for it; "": none
    distributed = False  # True: one process group across nprocs x num_nodes ranks (backend, init_method)
    needs_cuda = False
    cpu_only = False  # True: it trains on the CPU; picking it in the form switches the accelerator to cpu
    one_device = False  # True: exactly one GPU (the form offers a one-GPU picker, not a list)
    repeats_devices = False  # True: a GPU may be listed twice (model-parallel: two stages on one GPU)
    batch_hint = "per process"  # what train.batch_size means, under the form's field
    comm_measured = False  # True: its ranks time their gradient all-reduce on the CPU (the Monitor's a-red)
    can_shard = False  # True: some setting of it splits parameters, gradients or optimizer state (shards)
    compared_by_default = False  # ticked in the app's Compare dialog
    own_launcher = False  # True: exported for its own launcher too (deepspeed's hostfile and commands)
    checkpoint_dirs = False  # True: its checkpoints are directories (every rank writes a part)
    imports_dynamo = False  # True: its own code imports torch._dynamo even with nothing compiled (nodynamo.py)
    channels_last_weights = True  # False: it flattens or byte-views the weights, which need plain layout

    # ------------------------------------------------------------ config side (no torch)
    def nprocs(self, cfg) -> int:
        return 1

    def check(self, cfg, hw) -> list[tuple[str, str]]:
        """Problems with `cfg` for this strategy, as (field, reason)."""
        problems = []
        d = cfg.devices
        if (not self.repeats_devices and cfg.accelerator == "cuda" and isinstance(d, list)
                and len(set(d)) != len(d)):
            problems.append(("devices", f"each GPU may be listed once, got {d}"))
        if self.needs_cuda and cfg.accelerator != "cuda":
            problems.append(combination(cfg, "accelerator", f"strategy {self.name} needs accelerator cuda (GPUs)",
                                        "strategy", "accelerator"))
        if not self.distributed and cfg.nodes.num_nodes > 1:
            problems.append(combination(cfg, "nodes.num_nodes", f"strategy {self.name} runs in one process; use ddp, "
                                        "fsdp or zero for several nodes", "strategy", "nodes.num_nodes"))
        return problems

    def cpu_devices_hint(self) -> str:
        """What `devices` counts with accelerator cpu (the form's hint under the field)."""
        return "number of CPU processes (ranks)" if self.distributed else "one process on the CPU"

    def local_devices(self, cfg, local_rank: int) -> list[str]:
        """Devices a local rank uses (for the summary line and the GPU pane)."""
        return [cfg.device_for(local_rank)]

    def placement(self, base) -> list[str]:
        """`--set` items that place it where the preset `base` runs, for `torchdeck compare`: the
        preset's GPUs (all of them when it names fewer than two), else its CPU process count (at
        least 2)."""
        gpus = list(base.devices) if base.accelerator == "cuda" and isinstance(base.devices, list) else []
        if base.accelerator == "cuda":
            return ["accelerator=cuda", "devices=" + (f"[{','.join(map(str, gpus))}]" if len(gpus) >= 2 else "all")]
        procs = base.devices if isinstance(base.devices, int) and base.devices >= 2 else 2
        return CPU_PLACEMENT + [f"devices={procs}"]

    def shards(self, cfg) -> tuple[int, int, int]:
        """How many ways parameters, gradients and optimizer state are split (the memory estimate
        divides each by its count)."""
        return 1, 1, 1

    def memory_parts(self, cfg, n: int, device: dict) -> dict:
        """What it adds to or moves off a rank's device memory (bytes, `device` changed in place)
        for a model of n parameters; returns the parts it holds in host RAM instead."""
        return {}

    def preflight(self, cfg) -> list[tuple[str, str]]:
        """Problems only the file system shows (a file the config names), as (field, reason)."""
        return []

    def resolve(self, cfg, run_dir=None) -> list[tuple[str, str]]:
        """Settings taken from elsewhere (deepspeed: a user's ds_config.json) applied to cfg in place,
        before the ranks start; with run_dir, what was generated is written there. Returns
        (level, line) notes for the run log and `torchdeck validate`."""
        return []

    # ------------------------------------------------------------ runtime side (torch)
    def setup(self, model, ctx: RankContext, total_steps: int, steps_per_epoch: int):
        """(model to train, optimizer, LR scheduler, precision): the parts of a training step.
        DeepSpeed builds all four at once; every other strategy wraps, then builds the rest."""
        from ..optim import Precision, build_optimizer, build_scheduler

        model = self.wrap(model, ctx)
        optimizer = build_optimizer(ctx.cfg, self, model)
        scheduler = build_scheduler(ctx.cfg, optimizer, total_steps, steps_per_epoch)
        return model, optimizer, scheduler, Precision(ctx.cfg, ctx.device)

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

    def targets_device(self, ctx: RankContext):
        """Where the model's output lands when that is not the batch's device (the loss needs the
        targets there); None: with the batch."""
        return None

    def make_optimizer(self, params_fn, model):
        """Build the optimizer; ZeRO overrides this to shard its state."""
        return params_fn(model.parameters())

    # ------------------------------------------------------------ checkpoints
    def save_checkpoint(self, trainer, meta: dict):
        """Called on every rank (sharded strategies gather first); rank 0 writes one file with meta
        (epoch, step, RNG, config...) and the full states. Returns its path on rank 0, else None."""
        from .. import checkpoint as ckpt

        c = trainer.ctx
        model_state = self.model_state(trainer.model, c)
        optim_state = self.optim_state(trainer.optimizer, trainer.model, c)
        if c.rank != 0:
            return None
        state = {**meta, "model": model_state, "optimizer": optim_state,
                 "scheduler": trainer.scheduler.state_dict(), "scaler": trainer.precision.state_dict()}
        return ckpt.save(state, trainer.ckpt_dir, meta["step"], trainer.cfg.checkpoint.keep_last)

    def load_checkpoint(self, trainer, path, state: dict) -> None:
        """Model, optimizer, schedule and scaler from a checkpoint `resolve_resume` found."""
        c = trainer.ctx
        self.load_model_state(trainer.model, state["model"], c)
        self.load_optim_state(trainer.optimizer, trainer.model, state["optimizer"], c)
        trainer.scheduler.load_state_dict(state["scheduler"])
        trainer.precision.load_state_dict(state.get("scaler"))

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
