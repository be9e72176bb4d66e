"""The loss and every metric of a task as named sums, read the same way everywhere.

A training log window, a training epoch, an evaluation and the reduction across ranks all keep
one float64 vector on the device: [samples, loss sum, (correct), extra metric sums...], each
metric weighted by the samples it covers, and read a figure as its sum over the samples. Ranks
sum their vectors with one all-reduce; nothing else differs between the paths. Accuracy is a
slot only where the loss rule is classification (engine/losses.py), the extras are a loss
callable's or the model's own `metrics`, and perplexity is the exp of the mean token loss.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist


class Sums:
    """[samples, loss, (correct if hits), *extras] in float64 on `device`."""

    def __init__(self, device, hits: bool = False, extras=()):
        self.hits, self.extras = hits, list(extras)
        self.values = torch.zeros(self.width, dtype=torch.float64, device=device)

    @property
    def width(self) -> int:
        return 2 + self.hits + len(self.extras)

    @classmethod
    def of(cls, rule, device) -> "Sums":
        """The layout a loss rule (engine/losses.py Rule, or None: not decided yet) reports."""
        return cls(device, bool(rule and rule.classification), rule.names if rule else ())

    def follow(self, rule) -> None:
        """Extra metrics first seen after the first batch (a loss callable's) get their slots."""
        if rule is not None and len(rule.names) > len(self.extras):
            grow = len(rule.names) - len(self.extras)
            self.extras = list(rule.names)
            self.values = torch.cat([self.values, self.values.new_zeros(grow)])

    def add(self, part: torch.Tensor) -> None:
        """part: one vector in this layout (samples first), on any device."""
        self.values.add_(part.to(self.values.device))

    def add_sums(self, other: "Sums") -> None:
        grow = other.width - self.width
        if grow > 0:
            self.extras = list(other.extras)
            self.values = torch.cat([self.values, self.values.new_zeros(grow)])
        self.values[:other.width].add_(other.values)

    def zero_(self) -> None:
        self.values.zero_()

    def all_reduce(self, *riders: float) -> list[float]:
        """Summed over the ranks in place (one collective); `riders` (host figures, e.g. seconds)
        are summed in the same one. Returns the riders' totals."""
        if not (dist.is_available() and dist.is_initialized()):
            return list(riders)
        both = torch.cat([self.values, torch.tensor(riders, dtype=torch.float64, device=self.values.device)])
        dist.all_reduce(both, op=dist.ReduceOp.SUM)
        self.values = both[:self.width]
        return both[self.width:].tolist()

    def figures(self, tokens: bool = False, perplexity: bool = True) -> dict:
        """{loss, accuracy, metrics, samples} as means over the samples (one read from the device):
        accuracy None without the hits slot, perplexity (of the mean loss) in metrics for token
        cross-entropy when asked; loss None over no samples."""
        return read(self.values.tolist(), self.hits, self.extras, tokens, perplexity)


def read(values: list[float], hits: bool, extras, tokens: bool = False, perplexity: bool = True) -> dict:
    n, loss_sum = values[0], values[1]
    if not n:
        return {"loss": None, "accuracy": None, "metrics": {}, "samples": 0}
    rest = values[2 + hits:]
    metrics = {name: v / n for name, v in zip(extras, rest)}
    if tokens and perplexity:
        metrics["perplexity"] = exp_of(loss_sum / n)
    return {"loss": loss_sum / n, "accuracy": values[2] / n if hits else None, "metrics": metrics,
            "samples": int(n)}


def exp_of(mean_loss: float) -> float:
    """Perplexity: exp of the mean token loss (of a sum it would grow with the set's size); inf
    past a float."""
    try:
        return math.exp(mean_loss)
    except OverflowError:
        return math.inf
