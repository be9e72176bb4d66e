"""One module per parallel strategy, all with the `Strategy` interface of `base.py`.

This package is the only list of strategies: every public module here that defines STRATEGY is
one, in the order its `order` says, so adding a strategy is adding its module. Everything else
(the form, compare, the memory estimate, validate, the Monitor) asks the strategy, never tests
its name. Strategy modules import torch only inside their runtime methods, so finding them keeps
`engine.config`'s users (the app's first frame) torch-free.
"""
from __future__ import annotations

import importlib
import pkgutil

from .base import Strategy

_found: dict[str, Strategy] | None = None


def _registry() -> dict[str, Strategy]:
    """name -> strategy, in their order; found once (private modules, `_name`, are helpers)."""
    global _found
    if _found is None:
        found = []
        for info in pkgutil.iter_modules(__path__):
            if info.name.startswith("_"):
                continue
            strategy = getattr(importlib.import_module(f"{__name__}.{info.name}"), "STRATEGY", None)
            if isinstance(strategy, Strategy):
                found.append(strategy)
        _found = {s.name: s for s in sorted(found, key=lambda s: (s.order, s.name))}
    return _found


def get_strategy(name: str) -> Strategy:
    return _registry()[name]


def names() -> list[str]:
    """Every strategy's config name, in order (the user's script last)."""
    return list(_registry())


def loop_names() -> list[str]:
    """The strategies torchdeck's own loop trains with (what `torchdeck compare` can run); which
    kind of run a strategy's is, is the run kinds' to say (engine.kinds)."""
    from ..kinds import kind_of

    return [n for n in _registry() if kind_of(n).loop_config]


def known(name) -> bool:
    return isinstance(name, str) and name in _registry()


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

