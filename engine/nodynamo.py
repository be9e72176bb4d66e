"""Keep torch._dynamo out of a rank of our loop that compiles nothing.

Importing torch._dynamo (sympy, fx, part of inductor) costs a rank about as much CPU as importing
torch itself, and eager torch pulls it in at the first optimizer construction, step, zero_grad and
state_dict, and at DDP's construction and forward, only to wrap those calls in "dynamo, skip this"
or to mark graph breaks. With nothing compiled in the process those wrappers change nothing, so
the rank calls the plain functions instead. Only for our loop's ranks with train.compile off (never
in a user's script), and only while torch._dynamo is not loaded: once anything imports it (a
user's model compiling a part of itself), every call goes torch's own way again. A torch without
these internals is left as it is.
"""
from __future__ import annotations

import contextlib
import sys

DYNAMO = "torch._dynamo"


def goes_without(cfg) -> bool:
    """Whether a rank of our loop for this config can go without torch._dynamo: nothing compiles,
    and its strategy's own code does not import dynamo anyway (Strategy.imports_dynamo: those ranks
    import it ahead, while waiting for the others)."""
    from .strategies import get_strategy

    return not cfg.train.compile and not get_strategy(cfg.strategy).imports_dynamo


def loaded() -> bool:
    return DYNAMO in sys.modules


def _wrapper_codes():
    """The code of torch's two dynamo-importing wrappers (every function they wrap shares it), or
    None where this torch has other internals."""
    try:
        from torch._compile import _disable_dynamo
        from torch.optim.optimizer import _use_grad_for_differentiable

        return _disable_dynamo(lambda: None).__code__, _use_grad_for_differentiable(lambda self: None).__code__
    except (ImportError, AttributeError, TypeError):
        return None


def _unwrapped(fn):
    """fn and what it wraps, down the __wrapped__ chain (a contextmanager around a wrapper...)."""
    for _ in range(8):
        if fn is None:
            return
        yield fn
        fn = getattr(fn, "__wrapped__", None)


def _skip_disable(inner) -> None:
    """A `_disable_dynamo` wrapper caches torch._dynamo.disable(fn) on fn at its first call,
    importing dynamo to make it; cache fn itself, handing over to torch once dynamo is loaded."""
    raw = getattr(inner, "__wrapped__", None)
    if raw is None or hasattr(raw, "__dynamo_disable"):
        return

    def plain(*args, **kwargs):
        if loaded():  # from now on torch's own disable, made as its first call makes it
            del raw.__dynamo_disable
            return inner(*args, **kwargs)
        return raw(*args, **kwargs)

    raw.__dynamo_disable = plain


def _lean_step(cls, use_grad) -> None:
    """torch.optim's step wrapper imports torch._dynamo at every call to mark graph breaks around
    the (no_grad) step: the same step without them while dynamo is not loaded. Done before the
    class's first instance, which wraps `step` once more for its hooks and profiler."""
    import torch

    raw = use_grad.__wrapped__

    def step(*args, **kwargs):
        if loaded():
            return use_grad(*args, **kwargs)
        prev = torch.is_grad_enabled()
        try:
            torch.set_grad_enabled(args[0].defaults["differentiable"])
            return raw(*args, **kwargs)
        finally:
            torch.set_grad_enabled(prev)

    for name in ("__module__", "__name__", "__qualname__", "__doc__", "__wrapped__"):
        setattr(step, name, getattr(use_grad, name, None))
    cls.step = step


def prepare(optimizer_classes=()) -> None:
    """No dynamo import on the calls of the optimizer classes the loop builds, their base, and DDP."""
    codes = None if loaded() else _wrapper_codes()
    if codes is None:
        return
    import torch
    from torch.nn.parallel import DistributedDataParallel

    disable, use_grad = codes
    for owner in {torch.optim.Optimizer, DistributedDataParallel, *optimizer_classes}:
        for attr in list(vars(owner).values()):
            for fn in _unwrapped(attr):
                if getattr(fn, "__code__", None) is disable:
                    _skip_disable(fn)
                elif getattr(fn, "__code__", None) is use_grad and owner in optimizer_classes \
                        and vars(owner).get("step") is fn:
                    _lean_step(owner, fn)


def _real(name: str = ""):
    import importlib

    return importlib.import_module(DYNAMO + (f".{name}" if name else ""))


class _Utils:
    def get_optimize_ddp_mode(self):
        return _real("utils").get_optimize_ddp_mode() if loaded() else "ddp_optimizer"

    def __getattr__(self, name):
        return getattr(_real("utils"), name)


class _Stand:
    """What DDP's constructor reads of torch._dynamo: its optimize_ddp mode, at the default
    while dynamo is not loaded (its config can only be changed by importing it). Anything else,
    or anything once dynamo is loaded, is the real one's (which then takes its place on torch)."""

    utils = _Utils()

    def __getattr__(self, name):
        return getattr(_real(), name)


@contextlib.contextmanager
def ddp_without_dynamo():
    """DDP's constructor looks up torch._dynamo.utils (torch imports the attribute on first use):
    answered with the default while the strategy wraps the model, if dynamo is not loaded."""
    import torch

    stand = _Stand() if not loaded() and "_dynamo" not in vars(torch) else None
    if stand is not None:
        torch._dynamo = stand
    try:
        yield
    finally:
        if stand is not None and vars(torch).get("_dynamo") is stand:
            del torch._dynamo
