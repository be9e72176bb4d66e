"""What the three integrations share: a framework's numbers as torchdeck.log's, and samples
counted per optimizer step where the framework's logging hook never sees a batch."""
from __future__ import annotations

import weakref

import torchdeck

# Timing summaries a framework logs about itself: torchdeck measures these from its own events.
_SKIPPED_SUFFIXES = ("_runtime", "_samples_per_second", "_steps_per_second", "total_flos")


def to_metrics(values, loss_keys=("loss",), rename=None) -> dict:
    """The framework's logged values as torchdeck.log's metrics: the first of `loss_keys` present
    becomes "loss" (the run's loss curve), names in `rename` are renamed, everything else keeps its
    name; non-numbers are left to torchdeck.log (it skips and counts them), timing summaries are
    dropped."""
    out = {}
    loss_key = next((k for k in loss_keys if k in values), None)
    for key, value in values.items():
        key = str(key)
        if key.endswith(_SKIPPED_SUFFIXES):
            continue
        if key == loss_key:
            out["loss"] = value
        elif key == "loss":  # another key was chosen as the loss: keep this one, under another name
            out["loss_logged"] = value
        else:
            out[(rename or {}).get(key, key)] = value
    return out


def check_samples(value, name="samples_per_step"):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}: expected a whole number >= 1 (this rank's batch size x gradient "
                         f"accumulation steps), got {value!r}")
    return value


class StepWatch:
    """The first optimizer that steps in this process (torch.optim's global post-step hook, as
    torchdeck's own step count), seen from a framework hook that never sees one: its learning
    rate, and `per_step` samples counted at each of its steps, so a framework that steps only
    every k micro-batches (gradient accumulation) counts real steps only. `on_step()` runs after
    each, for a rank whose framework never logs."""

    def __init__(self, per_step: int | None = None, on_step=None):
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self.per_step = per_step or 0
        self.pending = 0
        self.on_step = on_step
        self._optimizer = None
        self._handle = register_optimizer_step_post_hook(self._stepped)

    def _stepped(self, optimizer, args, kwargs) -> None:
        mine = self._optimizer() if self._optimizer is not None else None
        if mine is None:
            self._optimizer = weakref.ref(optimizer)
        elif mine is not optimizer:
            return
        self.pending += self.per_step
        if self.on_step is not None:
            self.on_step()

    def take(self):
        """The samples since the last take, None for none (a rate of 0 would be a lie)."""
        n, self.pending = self.pending, 0
        return n or None

    def add_lr(self, metrics: dict) -> dict:
        """metrics with the optimizer's learning rate (its first parameter group's) as "lr",
        unless the script logs one (lr, learning_rate, Lightning's LearningRateMonitor lr-*)."""
        opt = self._optimizer() if self._optimizer is not None else None
        if opt is None or any(k in ("lr", "learning_rate") or k.startswith(("lr-", "lr_")) for k in metrics):
            return metrics
        try:
            return {**metrics, "lr": opt.param_groups[0]["lr"]}
        except (AttributeError, IndexError, KeyError, TypeError):
            return metrics

    def remove(self) -> None:
        self._handle.remove()


def log(metrics: dict, step=None, samples=None, tokens=None) -> None:
    torchdeck.log(metrics, step=step if isinstance(step, int) and not isinstance(step, bool) else None,
                  samples=samples, tokens=tokens)
