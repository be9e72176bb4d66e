"""The runtime half of strategy deepspeed: the engine, one training step, checkpoints.

Imports torch and deepspeed, so only the strategy's runtime methods import it. The training loop
stays torchdeck's: its data loader (DistributedSampler, batch fetching; DeepSpeed's own
`training_data` loader was measured about 15x slower), its stop agreement, events and eval. Only
the step differs: `engine.backward` and `engine.step` instead of loss.backward / optimizer.step.
"""
from __future__ import annotations

import contextlib
import copy
import logging
import os
import shutil
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist

from .. import checkpoint as ckpt

# Classes DeepSpeed pickles into its checkpoints besides tensors and containers: allowed by name,
# so every file is still read with weights_only=True (nothing else can run code on load).
_SAFE = ("deepspeed.runtime.fp16.loss_scaler.LossScaler",
         "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler",
         "deepspeed.runtime.zero.config.ZeroStageEnum",
         "deepspeed.utils.tensor_fragment.fragment_address")


def _quiet() -> None:
    """DeepSpeed logs every setting at INFO into the rank logs; keep its warnings only."""
    from deepspeed.utils import logger

    logger.setLevel(logging.WARNING)


def setup(model, ctx, resolved, total_steps: int, steps_per_epoch: int):
    """deepspeed.initialize on the process group the worker already joined (the supervisor's
    rendezvous); returns what the loop drives: (engine, optimizer view, scheduler view, step)."""
    import deepspeed

    from ..optim import build_scheduler

    _quiet()
    cfg = ctx.cfg
    deepspeed.init_distributed(dist_backend=cfg.resolved_backend, timeout=timedelta(seconds=cfg.nodes.timeout_s))
    model = model.to(ctx.device)  # its weights in plain layout (Trainer: channels_last_weights)
    ds_config = copy.deepcopy(resolved.ds_config)
    # torchdeck's LR schedule (the same curve as every strategy) unless the user's file brings one
    schedule = None if "scheduler" in ds_config else (
        lambda optimizer: build_scheduler(cfg, optimizer, total_steps, steps_per_epoch))
    # device_rank: the GPU this rank was given ("6,7" trains on cuda:6), not its local rank
    args = SimpleNamespace(local_rank=ctx.local_rank,
                           device_rank=ctx.device.index if ctx.device.type == "cuda" else ctx.local_rank)
    engine, _, _, _ = deepspeed.initialize(
        args=args, model=model, model_parameters=[p for p in model.parameters() if p.requires_grad],
        config=ds_config, lr_scheduler=schedule, dist_init_required=False)
    engine.set_gradient_accumulation_boundary(True)  # micro_step() clears it on the others
    dtype = (torch.bfloat16 if (ds_config.get("bf16") or {}).get("enabled")
             else torch.float16 if (ds_config.get("fp16") or {}).get("enabled") else None)
    if dtype is not None:
        # DeepSpeed's forward switches an outer CUDA autocast off (unless its own torch_autocast
        # section is on), so the fp32 batches would meet bf16/fp16 weights bare: cast them on the way in.
        engine.module.register_forward_pre_hook(_cast_inputs(dtype), with_kwargs=True)
    return engine, _OptimizerView(engine), _SchedulerView(engine), Step(engine, dtype, ctx.device.type)


def _cast_inputs(dtype):
    """Floating tensors passed positionally or by name (a dict batch is model(**batch)); token ids
    and masks keep their integer types."""
    def cast(a):
        return a.to(dtype) if torch.is_tensor(a) and a.is_floating_point() else a

    def hook(module, args, kwargs):
        return tuple(cast(a) for a in args), {k: cast(v) for k, v in kwargs.items()}
    return hook


class Step:
    """What Precision is for other strategies: DeepSpeed scales, clips and steps itself.

    Under bf16/fp16 DeepSpeed keeps the weights in that type (fp32 masters in its optimizer); the
    batches are cast to it on entering the model (_cast_inputs) and the autocast runs the loss in fp32."""

    def __init__(self, engine, dtype, device_type: str):
        self.engine, self.dtype, self.device_type = engine, dtype, device_type

    def autocast(self):
        return torch.autocast(self.device_type, dtype=self.dtype) if self.dtype else contextlib.nullcontext()

    def backward(self, loss) -> None:
        # the loop already divided by grad_accum; DeepSpeed would divide again
        self.engine.backward(loss, scale_wrt_gas=False)

    def step(self, optimizer, model) -> None:
        self.engine.step()  # clip, optimizer step, zero the gradients, LR schedule

    def state_dict(self):
        return None  # in DeepSpeed's own checkpoint

    def load_state_dict(self, state) -> None:
        pass


class _OptimizerView:
    """engine.step() already zeroed the gradients; the loop's zero_grad has nothing left to do."""

    def __init__(self, engine):
        self.engine = engine

    @property
    def param_groups(self):
        return self.engine.optimizer.param_groups

    def zero_grad(self, set_to_none: bool = True) -> None:
        pass


class _SchedulerView:
    """engine.step() steps the schedule; the loop reads the LR from here."""

    def __init__(self, engine):
        self.engine = engine

    def step(self) -> None:
        pass

    def get_last_lr(self) -> list[float]:
        return list(self.engine.get_lr())

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state) -> None:
        pass


@contextlib.contextmanager
def micro_step(engine):
    """An accumulation micro-step: DeepSpeed holds back its end-of-step reduction until the last one."""
    engine.set_gradient_accumulation_boundary(False)
    try:
        yield
    finally:
        engine.set_gradient_accumulation_boundary(True)


# ----------------------------------------------------------------------------- checkpoints


def _finalizer(cfg, ctx) -> bool:
    """Who makes a checkpoint directory complete: each node's local rank 0 in its own run directory;
    rank 0 alone when checkpoint.dir is set (DeepSpeed's assumption: one directory all nodes share)."""
    return ctx.rank == 0 if cfg.checkpoint.dir else ctx.local_rank == 0


def _fsync_tree(path: Path) -> None:
    for p in sorted(path.rglob("*")):
        if p.is_file():
            fd = os.open(p, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    ckpt._fsync_dir(path)


def save(engine, directory, meta: dict, cfg, ctx) -> Path | None:
    """Every rank writes its part with engine.save_checkpoint into a temporary directory; once all
    have, the finalizer adds META_NAME and renames it to ckpt-<step>: a kill at any point leaves the
    earlier checkpoints as they were, and `latest` never sees a partial one. Then keep_last."""
    directory = Path(directory)
    name = ckpt.dir_name(meta["step"])
    final = directory / name
    tmp_root = directory / f".{name}.tmp"
    finalizer = _finalizer(cfg, ctx)
    try:
        if finalizer:
            directory.mkdir(parents=True, exist_ok=True)
            for stale in directory.glob(".ckpt-*.tmp"):  # left by a run killed mid-save
                shutil.rmtree(stale, ignore_errors=True)
        dist.barrier()
        engine.save_checkpoint(str(tmp_root), tag=name, client_state={}, save_latest=False)
        dist.barrier()  # every rank's files are written
        if finalizer:
            with open(tmp_root / name / ckpt.META_NAME, "wb") as fh:
                torch.save(meta, fh)
            _fsync_tree(tmp_root / name)
            if final.exists():  # the same step saved again (a stop right after a save)
                shutil.rmtree(final)
            os.replace(tmp_root / name, final)
            shutil.rmtree(tmp_root, ignore_errors=True)
            ckpt._fsync_dir(directory)
            ckpt.prune(directory, cfg.checkpoint.keep_last, dirs=True)
    except BaseException as exc:
        raise ckpt.write_error(exc, final) from exc
    return final if finalizer else None


def _safe_classes() -> list[type]:
    import importlib

    allowed = []
    for dotted in _SAFE:
        module, _, attr = dotted.rpartition(".")
        try:
            obj = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError):
            continue
        if isinstance(obj, type):
            allowed.append(obj)
    return allowed


def check_weights_only(path: Path) -> None:
    """Every file of a DeepSpeed checkpoint loads with weights_only=True (and DeepSpeed's few plain
    data classes allowed), before DeepSpeed itself reads them with a full unpickler."""
    allowed = _safe_classes()
    with torch.serialization.safe_globals(allowed):
        for f in sorted(Path(path).glob("*.pt")):
            try:
                torch.load(f, map_location="cpu", weights_only=True, mmap=True)
            except Exception as exc:
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                raise ValueError(f"{f} does not load as plain tensors and settings (weights_only): "
                                 f"refused, it could run code. ({first})") from None


def load(engine, path, meta: dict, ctx) -> None:
    """Model, optimizer partitions (this rank's) and LR schedule from DeepSpeed's checkpoint."""
    path = Path(path)
    saved = meta.get("world_size")
    if saved not in (None, ctx.world_size):
        raise ValueError(f"checkpoint.resume: {path} was saved by {saved} ranks and this run has {ctx.world_size}: "
                         "DeepSpeed's ZeRO checkpoints resume on the same number of ranks")
    check_weights_only(path)
    loaded, _ = engine.load_checkpoint(str(path.parent), tag=path.name, load_optimizer_states=True,
                                       load_lr_scheduler_states=True)
    if loaded is None:
        raise ValueError(f"checkpoint.resume: DeepSpeed could not load {path} (see this rank's log)")


def full_state_dict(path, world_size: int | None = None) -> dict:
    """The whole model in fp32 from a DeepSpeed checkpoint directory, for `torchdeck eval` and for
    loading without DeepSpeed: gathered from every rank's fp32 ZeRO partitions (stages 1-3), or
    the module states stages 0-2 also save whole (stage 0; or a node's own folder of a multi-node
    run, which holds only its ranks' partitions: there the module's weights, in the training
    precision)."""
    path = Path(path)
    check_weights_only(path)
    partitions = list(path.glob("zero_pp_rank_*_optim_states.pt"))
    whole = path / "mp_rank_00_model_states.pt"  # stages 0-2: the module, unpartitioned
    if partitions and (world_size is None or len(partitions) >= world_size):
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        _quiet()
        return dict(get_fp32_state_dict_from_zero_checkpoint(str(path.parent), tag=path.name))
    if not whole.is_file():
        raise ValueError(f"{path} holds {len(partitions)} of the {world_size} ranks' ZeRO-3 partitions (a node's "
                         "share of a multi-node run): copy every node's files of this folder into one to read "
                         "the whole model")
    state = torch.load(whole, map_location="cpu", weights_only=False)["module"]  # checked above
    return {k: v.float() if v.is_floating_point() else v for k, v in state.items()}
