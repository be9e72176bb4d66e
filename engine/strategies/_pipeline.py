"""The runtime half of model-parallel: split a sequential model into stages on devices and
run micro-batches through them GPipe-style.

Kept apart from `model_parallel.py` because it needs torch at import, and the strategy modules
must stay importable without it (config validation runs in the app).
"""
from __future__ import annotations

import torch
from torch import nn

from ..models import ModelError


def layers_of(model: nn.Module) -> list[nn.Module]:
    """The model's top-level layers, in the order its forward runs them.

    Only an nn.Sequential promises that order (a general forward may reshape between layers,
    as torchvision's ResNet does before its classifier), so only that is split.
    """
    if not isinstance(model, nn.Sequential):
        raise ModelError(
            f"model-parallel splits a model between its layers, so it needs an nn.Sequential "
            f"(the built-in cnn and mlp are); this model is {type(model).__name__}, whose forward "
            "may do work between its children. Wrap your layers in nn.Sequential, or use ddp or fsdp.")
    layers = list(model.children())
    if not layers:
        raise ModelError("model-parallel: the model has no layers to split")
    return layers


def balance(weights: list[int], stages: int) -> list[int]:
    """Layers per stage for contiguous stages that minimise the heaviest stage's parameter count.

    Every stage gets at least one layer. Small exact dynamic programme (models have few top-level
    layers). Ties put each cut as late as possible, so an activation stays with the layer before it.
    """
    n = len(weights)
    if stages > n:
        raise ModelError(f"model-parallel: {stages} devices but the model has only {n} layers to split; "
                         "use fewer devices")
    prefix = [0]
    for w in weights:
        prefix.append(prefix[-1] + w)
    inf = float("inf")
    # best[s][i]: (heaviest stage, -layers in last stage) splitting the first i layers into s stages
    best = [[(inf, 0)] * (n + 1) for _ in range(stages + 1)]
    cut = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = (0, 0)
    for s in range(1, stages + 1):
        for i in range(s, n - (stages - s) + 1):
            for j in range(s - 1, i):
                prev = best[s - 1][j][0]
                if prev == inf:
                    continue
                cand = (max(prev, prefix[i] - prefix[j]), -j)
                if cand < best[s][i]:
                    best[s][i], cut[s][i] = cand, j
    sizes, i = [], n
    for s in range(stages, 0, -1):
        j = cut[s][i]
        sizes.append(i - j)
        i = j
    return sizes[::-1]


class Pipeline(nn.Module):
    """Runs `module`'s layers as stages on `devices`; `module` itself keeps its keys unchanged.

    Stage i holds a contiguous run of layers on devices[i]. With micro_batches m > 1 the batch is
    cut in m chunks and fed as a wavefront: at tick t stage i works on chunk t - i, so on CUDA
    (asynchronous kernels, one stream per device) stage i computes chunk j while stage i+1
    computes chunk j-1. On the CPU the same schedule runs, one chunk after another. The output is
    returned on the input's device, so the loss and labels meet where the loop put them.
    """

    def __init__(self, module: nn.Module, devices: list[str], split: list[int] | None = None,
                 micro_batches: int = 1):
        super().__init__()
        layers = layers_of(module)
        if split:
            if len(split) != len(devices):
                raise ModelError(f"model_parallel.split has {len(split)} entries for {len(devices)} devices")
            if sum(split) != len(layers):
                raise ModelError(f"model_parallel.split {split} covers {sum(split)} layers, but the model "
                                 f"has {len(layers)} top-level layers: the counts must add up to {len(layers)}")
        else:
            split = balance([sum(p.numel() for p in layer.parameters()) for layer in layers], len(devices))
        self.module = module  # registered: parameters(), train()/eval() and state_dict go through it
        self.devices = [torch.device(d) for d in devices]
        self.split = list(split)
        self.micro_batches = max(1, int(micro_batches))
        stages, start = [], 0
        for size, dev in zip(self.split, self.devices):
            group = layers[start:start + size]
            for layer in group:
                layer.to(dev)
            stages.append(group)
            start += size
        self._stages = stages  # a plain list: the same layers must not be registered twice

    def _run_stage(self, i: int, x):
        x = x.to(self.devices[i], non_blocking=True)
        for layer in self._stages[i]:
            x = layer(x)
        return x

    def forward(self, x=None, **kwargs):
        if kwargs or not isinstance(x, torch.Tensor):
            raise ModelError(
                "model-parallel runs an nn.Sequential whose first layer takes the batch's first tensor "
                "(model(x) for (x, y) samples); this batch is "
                + (f"a dict ({', '.join(kwargs)}), passed as model(**batch)" if kwargs else type(x).__name__)
                + ", which a split between layers cannot carry: use ddp, fsdp, zero or deepspeed")
        home = x.device
        n = len(self._stages)
        if self.micro_batches == 1 or x.shape[0] < 2:
            for i in range(n):
                x = self._run_stage(i, x)
            return x.to(home)
        chunks = list(torch.chunk(x, self.micro_batches))
        m = len(chunks)
        acts: list = [None] * m
        outs: list = [None] * m
        for tick in range(m + n - 1):
            # Last stage first, so a chunk is handed on only after the stage ahead took the previous one.
            for i in range(min(n - 1, tick), -1, -1):
                j = tick - i
                if j >= m:
                    continue
                y = self._run_stage(i, chunks[j] if i == 0 else acts[j])
                if i == n - 1:
                    outs[j] = y
                else:
                    acts[j] = y
        return torch.cat([o.to(home) for o in outs])
