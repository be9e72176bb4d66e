"""Models a run can train: the CIFAR-tutorial CNN, ResNet-18, an MLP, or a user callable.

Built after the worker seeds torch, so the weights are the same on every rank and every run.
No batch norm or dropout in cnn and mlp: the equivalence tests (DDP vs one process) rely on it.
cnn and mlp are nn.Sequential so a model-parallel split can cut them between layers.
"""
from __future__ import annotations

import torch
from torch import nn

from .data import DataInfo, _load_callable
from .errors import TorchdeckError


class ModelError(TorchdeckError):
    """A model that cannot be built for this data, with what to change."""


def cnn(info: DataInfo) -> nn.Sequential:
    """The PyTorch CIFAR-10 tutorial network, sized for any channel count and image size."""
    side = ((info.image_size - 4) // 2 - 4) // 2
    if side < 1:
        raise ModelError(f"model cnn needs images of at least 14 px, got {info.image_size}; "
                         "use model mlp or resnet18")
    return nn.Sequential(
        nn.Conv2d(info.in_channels, 6, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(16 * side * side, 120), nn.ReLU(),
        nn.Linear(120, 84), nn.ReLU(),
        nn.Linear(84, info.num_classes),
    )


def mlp(info: DataInfo, hidden: int = 256) -> nn.Sequential:
    flat = info.in_channels * info.image_size * info.image_size
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(flat, hidden), nn.ReLU(),
        nn.Linear(hidden, hidden), nn.ReLU(),
        nn.Linear(hidden, info.num_classes),
    )


def resnet18(info: DataInfo, small_stem: bool = True) -> nn.Module:
    """torchvision's ResNet-18; the small stem keeps 32x32 images from shrinking to 1x1 too early."""
    from torchvision.models import resnet18 as tv_resnet18

    model = tv_resnet18(weights=None, num_classes=info.num_classes)
    if small_stem:
        model.conv1 = nn.Conv2d(info.in_channels, 64, kernel_size=3, stride=1, padding=1, bias=False)
        model.maxpool = nn.Identity()
    elif info.in_channels != 3:
        model.conv1 = nn.Conv2d(info.in_channels, 64, kernel_size=7, stride=2, padding=3, bias=False)
    return model


def build_model(cfg, info: DataInfo) -> torch.nn.Module:
    """The model named by cfg.model.name; a user callable is called as callable(info, **cfg.model.kwargs)."""
    m = cfg.model
    if m.name == "cnn":
        return cnn(info)
    if m.name == "mlp":
        return mlp(info, m.hidden)
    if m.name == "resnet18":
        return resnet18(info, m.small_stem)
    if ":" in m.name:
        fn = _load_callable(m.name, "model.name", ModelError)
        try:
            model = fn(info, **(m.kwargs or {}))
        except Exception as exc:
            raise ModelError(f"model.name {m.name!r} raised {type(exc).__name__}: {exc}") from exc
        if not isinstance(model, nn.Module):
            raise ModelError(f"model.name {m.name!r} must return a torch.nn.Module, got {type(model).__name__}")
        return model
    raise ModelError(f"model.name: unknown model {m.name!r}; use cnn, resnet18, mlp or package.module:callable")
