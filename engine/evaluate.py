"""Evaluation: `evaluate_model`, the validation a run does at each epoch's end, and `torchdeck eval
CHECKPOINT`, the same on a saved model and its run's validation set. The task's metrics: the loss
(the run's train.loss, engine/losses.py), accuracy where the task is classification, perplexity
for token cross-entropy and a loss callable's extra metrics, as named sums (engine/sums.py).

Everything `torchdeck eval` needs is in the checkpoint (the config it trained with and the full,
unwrapped weights), so it needs no strategy, process group or GPU.
"""
from __future__ import annotations

import math
from pathlib import Path

from .errors import TorchdeckError


class EvalError(TorchdeckError):
    """A checkpoint that cannot be evaluated, with what to do about it."""


def eval_shard(dataset, rank: int, world: int):
    """Rank's share of the val set padded to equal length (so every rank runs the same number of
    forwards, which FSDP needs), and how many of its samples are real."""
    from torch.utils.data import Subset

    n = len(dataset)
    idx = list(range(rank, n, world))
    per = math.ceil(n / world) if n else 0
    valid = len(idx)
    if idx and valid < per:
        idx += [idx[-1]] * (per - valid)
    elif not idx and per:
        idx = [0] * per
    return Subset(dataset, idx), valid


def _loader(dataset, shard, batch_size: int, num_workers: int, prep, device):
    """In-memory sets are read a batch at a time (decoded images normalized by `prep`, as in
    training); others through a plain loader over the rank's shard."""
    import torch
    from torch.utils.data import DataLoader

    from . import affinity
    from .data import BatchPrep, BatchTensors, keep_batch

    if isinstance(dataset, torch.utils.data.TensorDataset):
        prep = prep or BatchPrep(dataset, device=device)
        return DataLoader(BatchTensors(dataset), batch_size=batch_size, sampler=shard.indices,
                          collate_fn=keep_batch), prep
    return DataLoader(shard, batch_size=batch_size, shuffle=False, num_workers=num_workers,
                      **affinity.loader_kwargs()), prep


def evaluate_model(model, dataset, ctx, batch_size: int, precision=None, num_workers: int = 0,
                   channels_last: bool = False, prep=None, loss=None) -> dict:
    """Loss (and accuracy, for classification; extra metrics) over the whole set, sharded over ranks
    and summed so every rank gets the global value: `loss` is the run's (engine/losses.py; a fresh
    auto one decides on the first batch)."""
    import torch
    import torch.distributed as dist

    from .batch import samples_in
    from .losses import Loss
    from .sums import Sums

    loss = loss if loss is not None else Loss()
    distributed = dist.is_available() and dist.is_initialized()
    shard, valid = eval_shard(dataset, ctx.rank if distributed else 0, ctx.world_size if distributed else 1)
    loader, prep = _loader(dataset, shard, batch_size, num_workers, prep, ctx.device)
    sums = None
    was_training = model.training
    model.eval()
    seen = 0
    with torch.no_grad():
        for batch in loader:
            b = samples_in(batch)
            n = max(0, min(b, valid - seen))
            seen += b
            part = _batch_sums(model, batch, n, b, loss, ctx.device, precision, channels_last, prep)
            if part is not None:
                sums = sums or Sums.of(loss.rule, ctx.device)
                sums.follow(loss.rule)
                sums.add(torch.stack([torch.tensor(float(n), dtype=torch.float64, device=ctx.device),
                                      *(p.to(ctx.device) for p in part)]))
    model.train(was_training)
    sums = sums or Sums.of(loss.rule, ctx.device)  # no batch on this rank: its share still counts
    sums.all_reduce()
    return {**sums.figures(loss.tokens), "loss_rule": loss.said}


def _batch_sums(model, batch, n: int, b: int, loss, dev, precision, channels_last: bool, prep):
    """One batch's sums in the rule's layout (engine/losses.py Rule.eval_sums), or None when all of
    it pads the shard (its forward still runs: every rank runs as many, which FSDP needs)."""
    import contextlib

    import torch

    from .batch import forward, slice_batch, to_device

    # the model's own loss or a callable's sees only the real samples; the built-in losses slice
    # the output
    if 0 < n < b and loss.decided and loss.rule.real_only:
        batch = slice_batch(batch, n)
    batch = to_device(batch, dev)
    x, y = loss.split(batch)
    if isinstance(x, torch.Tensor):
        if prep is not None and prep.normalize:
            x = prep(x, train=False)
        if channels_last and x.dim() == 4:
            x = x.contiguous(memory_format=torch.channels_last)
    with (precision.autocast if precision is not None else contextlib.nullcontext)():
        out = forward(model, x)
    if n == 0:
        return None
    if isinstance(out, torch.Tensor) and out.device != dev:  # model-parallel: logits on the last stage
        out = out.to(dev)
    if not loss.decided:
        loss(out, y, batch)  # decides the rule on this first batch (torchdeck eval)
    return loss.rule.eval_sums(out, y, batch, n, b)


def evaluate(checkpoint_path, data_root: str | None = None, batch_size: int | None = None,
             device: str = "cpu") -> dict:
    import torch

    from . import checkpoint as ckpt
    from .config import ConfigError, from_dict
    from .data import build_datasets
    from .models import build_model
    from .strategies.base import RankContext

    path = Path(checkpoint_path).expanduser()
    if path.is_dir():
        state = _deepspeed_state(path)
    elif not path.is_file():
        raise EvalError(f"no checkpoint file at {path}")
    else:
        try:
            state = ckpt.load(path)
        except Exception as exc:
            raise EvalError(f"{path} is not a loadable torchdeck checkpoint: {exc}") from None
    data = dict(state.get("config") or {})
    if not data:
        raise EvalError(f"{path} holds no config; it was not written by torchdeck")
    # Evaluate on one CPU process whatever the run used.
    data.update(strategy="cpu", accelerator="cpu", devices=1, backend="auto")
    data["data"] = dict(data.get("data", {}), pin_memory=False, on_device=False)
    data["train"] = dict(data.get("train", {}), precision="32-true")
    data["checkpoint"] = dict(data.get("checkpoint", {}), resume="")
    if data_root:
        data["data"]["root"] = data_root
    try:
        cfg = from_dict(data, source=str(path))
    except ConfigError as exc:
        raise EvalError(f"the config stored in {path} no longer validates: {exc}") from None
    _user_folders(path)
    _, val_ds, info = build_datasets(cfg)
    if val_ds is None or len(val_ds) == 0:
        raise EvalError(f"{info.name} has no validation split to evaluate on")
    model = build_model(cfg, info)
    model.load_state_dict(state["model"])
    dev = torch.device(device)
    model.to(dev)
    ctx = RankContext(rank=0, local_rank=0, world_size=1, local_world_size=1, node_rank=0, device=dev, cfg=cfg)
    from .losses import Loss

    loss = Loss(cfg.train.loss)  # decided on the first batch, as the run did
    out = evaluate_model(model, val_ds, ctx, batch_size or max(cfg.train.batch_size, 256), loss=loss)
    out.update(dataset=info.name, step=int(state["step"]), epoch=int(state["epoch"]),
               batches_done=int(state.get("batches_done") or 0))
    return out


def _user_folders(path: Path) -> None:
    """The user's module (model.name or data.dataset `mod:fn`) is looked up where its run was
    started from, as the run did, wherever `torchdeck eval` runs (engine.usercode)."""
    from . import usercode

    for run in list(path.resolve().parents)[:3]:  # RUN/checkpoints/ckpt-N.pt, or RUN/checkpoints/ckpt-N/
        if (run / "config.yaml").is_file():
            usercode.add_folders(*usercode.run_folders(run))
            return


def _deepspeed_state(path: Path) -> dict:
    """A deepspeed run's checkpoint directory as one state: its meta and the full fp32 weights
    gathered from every rank's ZeRO partitions."""
    import contextlib
    import io

    from . import checkpoint as ckpt

    if not (path / ckpt.META_NAME).is_file():
        raise EvalError(f"{path} is a folder but not a complete torchdeck checkpoint (no {ckpt.META_NAME}: "
                        "a deepspeed run's checkpoints/ckpt-* folder, or a ckpt-*.pt file)")
    from .strategies.deepspeed import INSTALL_HINT, installed

    if not installed():
        raise EvalError(f"{path} is a DeepSpeed checkpoint; reading it needs deepspeed ({INSTALL_HINT})")
    from .strategies._deepspeed import full_state_dict

    try:
        state = ckpt.load_meta(path)
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            state["model"] = full_state_dict(path, state.get("world_size"))  # DeepSpeed prints its progress
    except Exception as exc:
        raise EvalError(f"{path} is not a loadable DeepSpeed checkpoint: {exc}") from None
    return state
