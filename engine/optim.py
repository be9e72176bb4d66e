"""Optimizer, LR schedule and precision: the parts of a step that depend only on the config.

Kept apart from the loop so the loop reads as "forward, backward, step" whatever the settings.
Schedules are stepped once per optimizer step, so resume and accumulation never shift them.
"""
from __future__ import annotations

import contextlib
import math

import torch


def build_optimizer(cfg, strategy, model):
    """The optimizer named in cfg.optimizer, built through the strategy (ZeRO shards it)."""
    o = cfg.optimizer

    def params_fn(params):
        if o.name == "sgd":
            return torch.optim.SGD(params, lr=o.lr, momentum=o.momentum, nesterov=o.nesterov,
                                   weight_decay=o.weight_decay)
        if o.name == "adam":
            return torch.optim.Adam(params, lr=o.lr, betas=tuple(o.betas), weight_decay=o.weight_decay)
        if o.name == "adamw":
            return torch.optim.AdamW(params, lr=o.lr, betas=tuple(o.betas), weight_decay=o.weight_decay)
        raise ValueError(f"optimizer.name: unknown optimizer {o.name!r}")

    params_fn.optimizer_class = optimizer_class(cfg)
    params_fn.optimizer_kwargs = _optimizer_kwargs(o)
    return strategy.make_optimizer(params_fn, model)


def optimizer_class(cfg):
    """torch's class for optimizer.name (None for a name the config refuses)."""
    return {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}.get(cfg.optimizer.name)


def _optimizer_kwargs(o) -> dict:
    """The same settings as keyword arguments, for wrappers that take a class (ZeroRedundancyOptimizer)."""
    if o.name == "sgd":
        return dict(lr=o.lr, momentum=o.momentum, nesterov=o.nesterov, weight_decay=o.weight_decay)
    return dict(lr=o.lr, betas=tuple(o.betas), weight_decay=o.weight_decay)


def lr_factor_fn(cfg, total_steps: int, steps_per_epoch: int):
    """LR multiplier as a function of optimizer steps done (onecycle is handled by torch)."""
    s = cfg.scheduler
    warm = s.warmup_steps
    base = cfg.optimizer.lr

    def warmup(step):
        return (step + 1) / warm if warm and step < warm else 1.0

    if s.name == "warmup":
        return warmup
    if s.name == "step":
        period = max(1, s.step_size * steps_per_epoch)
        return lambda step: warmup(step) * s.gamma ** (step // period)
    if s.name == "cosine":
        floor = s.min_lr / base
        span = max(1, total_steps - warm)

        def cosine(step):
            if warm and step < warm:
                return warmup(step)
            progress = min(1.0, (step - warm) / span)
            return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))
        return cosine
    raise ValueError(f"scheduler.name: unknown scheduler {s.name!r}")


class ConstantLR:
    """scheduler.name none. Not an LRScheduler: building one wraps optimizer.step in a counting
    wrapper that every step then pays for, to keep a constant."""

    def __init__(self, optimizer):
        self.optimizer = optimizer

    def step(self) -> None:
        pass

    def get_last_lr(self) -> list[float]:
        return [g["lr"] for g in self.optimizer.param_groups]

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state) -> None:
        pass


def build_scheduler(cfg, optimizer, total_steps: int, steps_per_epoch: int):
    s = cfg.scheduler
    if s.name == "none":
        return ConstantLR(optimizer)
    if s.name == "onecycle":
        pct = s.warmup_steps / total_steps if s.warmup_steps else 0.3
        return torch.optim.lr_scheduler.OneCycleLR(
            optimizer, max_lr=cfg.optimizer.lr, total_steps=max(2, total_steps),
            pct_start=min(max(pct, 0.01), 0.99))
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor_fn(cfg, total_steps, steps_per_epoch))


class Precision:
    """Autocast, loss scaling and clipping for 32-true, bf16-mixed and 16-mixed."""

    def __init__(self, cfg, device: torch.device):
        self.device_type = device.type
        p = cfg.train.precision
        self.dtype = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(p)
        self.scaler = torch.amp.GradScaler("cuda") if p == "16-mixed" else None
        self.clip = cfg.train.grad_clip

    def autocast(self):
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)

    def backward(self, loss) -> None:
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def step(self, optimizer, model) -> None:
        if self.scaler is not None:
            if self.clip:
                self.scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), self.clip)
            self.scaler.step(optimizer)
            self.scaler.update()
            return
        if self.clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), self.clip)
        optimizer.step()

    def state_dict(self):
        return self.scaler.state_dict() if self.scaler is not None else None

    def load_state_dict(self, state) -> None:
        if self.scaler is not None and state:
            self.scaler.load_state_dict(state)


def set_speed_flags(cfg, device: torch.device) -> None:
    """tf32 / cudnn.benchmark / determinism, process-wide."""
    t = cfg.train
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = t.tf32
        torch.backends.cudnn.allow_tf32 = t.tf32
        torch.backends.cudnn.benchmark = t.cudnn_benchmark and not t.deterministic
    if t.deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
