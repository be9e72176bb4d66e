"""One module per parallel strategy, all with the `Strategy` interface of `base.py`.

The registry maps config names to modules lazily so `engine.config` stays importable without
torch; strategy modules import torch only inside their runtime methods.
"""
from __future__ import annotations

import importlib

from .base import Strategy

_MODULES = {
    "cpu": "torchdeck.engine.strategies.cpu",
    "gpu": "torchdeck.engine.strategies.gpu",
    "dp": "torchdeck.engine.strategies.dp",
    "ddp": "torchdeck.engine.strategies.ddp",
    "model-parallel": "torchdeck.engine.strategies.model_parallel",
    "fsdp": "torchdeck.engine.strategies.fsdp",
    "zero": "torchdeck.engine.strategies.zero",
    "deepspeed": "torchdeck.engine.strategies.deepspeed",
    "script": "torchdeck.engine.strategies.script",  # the user's own script (torchdeck launch)
}
_cache: dict[str, Strategy] = {}


def get_strategy(name: str) -> Strategy:
    if name not in _cache:
        _cache[name] = importlib.import_module(_MODULES[name]).STRATEGY
    return _cache[name]


def names() -> list[str]:
    return list(_MODULES)


def nproc_per_node(cfg) -> int:
    """Processes (ranks) on each node: the strategy's to say (dp drives all its GPUs from one)."""
    return get_strategy(cfg.strategy).nprocs(cfg)


def world_size(cfg) -> int:
    return nproc_per_node(cfg) * cfg.nodes.num_nodes


def global_batch(cfg) -> int:
    """Samples per optimizer step over every rank (a script run's batch is the script's: None)."""
    from ..kinds import kind_of

    if not kind_of(cfg).loop_config:  # train.batch_size does not apply
        return None
    return cfg.train.batch_size * world_size(cfg) * cfg.train.grad_accum

