"""torchdeck for a training script: one call, `torchdeck.log`, and nothing else to learn.

    import torchdeck
    torchdeck.log({"loss": loss}, samples=len(batch))

Under `torchdeck launch` it reports to the run; anywhere else it does nothing (importing this
module imports nothing else unless the script runs under torchdeck).
"""
import os as _os

# One import namespace: the repository keeps its folders engine/, app/, cli/ and presets/ at the
# top, and they are torchdeck.engine, torchdeck.app, ... at runtime (a user's engine.py or app.py
# in the working directory shadows nothing). The wheel installs them inside this package; in a
# checkout they are found beside it.
if not _os.path.isdir(_os.path.join(__path__[0], "engine")):
    _root = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
    if _os.path.isfile(_os.path.join(_root, "engine", "__init__.py")) and _root not in __path__:
        __path__.append(_root)

__all__ = ["log"]


def log(metrics, step=None, samples=None, tokens=None) -> None:
    """Report this rank's numbers for the step just done (every rank may call it).

    metrics: {"loss": ..., "lr": ..., any name: number}; "loss" is the run's loss curve, the
        other numbers are its metrics. Numbers are ints, floats, numpy scalars or 0-d tensors
        (read with .item(): for a CUDA tensor that waits for the GPU, as loss.item() does);
        anything else is skipped and counted, never an error.
    step: the step these numbers belong to (an int, numpy or 0-d tensor integer). Once given, it
        is this rank's step for every later event, as wandb.log(step=) has it; the optimizer
        steps counted are the step only until then (and on ranks that never pass one).
    samples / tokens: how many this rank processed since its previous call (a batch's size,
        its tokens): samples/s and tokens/s are these over the time between the two calls.

    Calls closer together than 50 ms (TORCHDECK_LOG_EVERY_S) go out as one event: the newest
    numbers, samples/s and tokens/s over all of them.
    Outside torchdeck it returns at once. Under torchdeck it never raises and never blocks: when
    the supervisor cannot keep up the event is dropped (and counted).
    """
    return None


if _os.environ.get("TORCHDECK_EVENTS_FD"):
    try:
        from .engine.launch.report import log  # noqa: F811
    except Exception:  # noqa: BLE001 - importing torchdeck must never break the script
        pass
