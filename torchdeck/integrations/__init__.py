"""Frameworks' own training loops reporting through `torchdeck.log`, one line each:

    from torchdeck.integrations import TorchdeckCallback   # Trainer(..., callbacks=[TorchdeckCallback()])
    from torchdeck.integrations import TorchdeckTracker    # Accelerator(log_with=TorchdeckTracker(...))
    from torchdeck.integrations import TorchdeckLogger     # lightning Trainer(logger=TorchdeckLogger(...))

Each class subclasses its framework's extension point, so the framework is imported when the
class is first asked for, never by `import torchdeck` or `import torchdeck.integrations`.
Outside `torchdeck launch` they do nothing (torchdeck.log does nothing there).
"""
from __future__ import annotations

import importlib

_WHERE = {
    "TorchdeckCallback": ".hf_trainer",
    "TorchdeckTracker": ".accelerate_tracker",
    "TorchdeckLogger": ".lightning_logger",
}

__all__ = list(_WHERE)


def __getattr__(name: str):
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(where, __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(list(globals()) + __all__)
