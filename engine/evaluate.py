"""`torchdeck eval CHECKPOINT`: the task's metrics of a saved model on its run's validation set:
the loss (the run's train.loss, engine/losses.py), accuracy where the task is classification,
perplexity for token cross-entropy and a loss callable's extra metrics.

Everything needed is in the checkpoint (the config it trained with and the full, unwrapped
weights), so evaluation needs no strategy, process group or GPU.
"""
from __future__ import annotations

from pathlib import Path

from .errors import TorchdeckError


class EvalError(TorchdeckError):
    """A checkpoint that cannot be evaluated, with what to do about it."""


def evaluate(checkpoint_path, data_root: str | None = None, batch_size: int | None = None,
             device: str = "cpu") -> dict:
    import torch

    from . import checkpoint as ckpt
    from .config import ConfigError, from_dict
    from .data import build_datasets
    from .models import build_model
    from .strategies.base import RankContext
    from .train import evaluate_model

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
