"""A run's validation metrics by name: which one is its main metric, how a value is written, and a
target a comparison times each strategy to (`val_acc>=0.9`, `val_loss<=1.6`, `perplexity<=5`).

The main metric rule, the one place it lives: accuracy where the task is classification (any
epoch_end carries a validation accuracy: higher is better), else the validation loss (lower is
better). Every front end (the Monitor's header, `torchdeck run`'s lines, the Runs list,
`torchdeck runs`, compare) asks `main_of` through RunView rather than deciding again.
No torch, no textual.
"""
from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

from ..errors import UsageError
from .. import fmt

ACC, LOSS = "val_acc", "val_loss"
FIELDS = ("val_acc", "val_loss", "train_acc", "train_loss")  # an epoch's own fields; other names: its val_metrics


def _base(name: str) -> str:
    return name.split("_", 1)[1] if name.startswith(("val_", "train_")) else name


def is_share(name: str) -> bool:
    """A 0..1 share written as a percentage (accuracy); anything else is a plain number."""
    base = _base(name)
    return base in ("acc", "accuracy") or base.endswith("_acc")


def label(name: str) -> str:
    """How people read a metric's name: val_acc -> 'val acc', perplexity -> 'perplexity'."""
    return name.replace("_", " ")


def show(name: str, value: float | None, missing: str = "-") -> str:
    """A metric's value as every front end writes it: 93.4% for an accuracy, 1.6021 for a loss."""
    if value is None or value != value:
        return missing
    if is_share(name):
        return fmt.pct(value)
    return fmt.num(value, ".4f" if abs(value) < 1000 else ",.1f")


def point_value(point, name: str) -> float | None:
    """One epoch's value of a metric (an EpochPoint): its own fields, else its val_metrics by name
    (`perplexity` or `val_perplexity`), else its train_metrics (`train_mae`)."""
    if name in FIELDS:
        return getattr(point, name, None)
    val = getattr(point, "val_metrics", None) or {}
    if name in val:
        return val[name]
    if name.startswith("val_") and name[4:] in val:
        return val[name[4:]]
    train = getattr(point, "train_metrics", None) or {}
    if name.startswith("train_") and name[6:] in train:
        return train[name[6:]]
    return None


def main_of(points) -> str | None:
    """The run's main validation metric given its epoch points: val_acc where any has one, else
    val_loss where any has one, else None (no evaluation yet)."""
    points = list(points)
    if any(p.val_acc is not None for p in points):
        return ACC
    if any(p.val_loss is not None for p in points):
        return LOSS
    return None


def column_label(mains, acc: str = "VAL ACC", loss: str = "VAL LOSS", both: str = "VAL ACC/LOSS") -> str:
    """A table's main-metric column over runs whose main metrics are `mains` (None: not evaluated
    yet): VAL ACC while every run that evaluated is classification (as it always read), VAL LOSS
    where none is, and both names where they mix."""
    kinds = {m for m in mains if m is not None}
    if LOSS not in kinds:
        return acc
    return loss if ACC not in kinds else both


# ----------------------------------------------------------------------------- targets

_TARGET = re.compile(r"^\s*([A-Za-z_][\w.]*)\s*(>=|<=|>|<)\s*([-+]?[0-9.]+(?:[eE][-+]?[0-9]+)?)\s*(%?)\s*$")


@dataclass(frozen=True)
class Target:
    """A value a metric must reach: `val_acc>=0.9` (higher is better) or `val_loss<=1.6`."""

    name: str
    op: str  # >=, <=, >, <
    value: float

    def met(self, v: float | None) -> bool:
        if v is None or v != v:
            return False
        return {">=": v >= self.value, "<=": v <= self.value, ">": v > self.value, "<": v < self.value}[self.op]

    @property
    def text(self) -> str:
        """As a user writes it (and compare.json keeps it)."""
        return f"{self.name}{self.op}{self.value:g}"

    @property
    def short(self) -> str:
        """The table's column: 'TO 90%' for the accuracy target of old, else 'TO val_loss<=1.6'."""
        if self.name == ACC and self.op == ">=":
            return fmt.pct(self.value, 0)
        return self.text


def parse_target(text) -> Target:
    """`val_acc>=0.9`, `val_loss<=1.6`, `perplexity<=5`, `val_acc>=90%`; a bare number is a
    validation accuracy (the `--target-acc` of old). UsageError, one line, for anything else."""
    if isinstance(text, Target):
        return text
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return _acc(float(text), str(text))
    s = str(text).strip()
    bare = re.fullmatch(r"([0-9.]+(?:[eE][-+]?[0-9]+)?)\s*(%?)", s)
    if bare:
        try:
            v = float(bare.group(1))
        except ValueError:
            raise UsageError(f"{s!r}: not a number") from None
        return _acc(v / 100 if bare.group(2) else v, s)
    m = _TARGET.match(s)
    if not m:
        raise UsageError(f"{s!r}: write METRIC>=VALUE or METRIC<=VALUE, e.g. val_acc>=0.9, val_loss<=1.6, "
                         "perplexity<=5")
    name, op, num, percent = m.groups()
    try:
        v = float(num)
    except ValueError:
        raise UsageError(f"{s!r}: {num!r} is not a number") from None
    if percent:
        if not is_share(name):
            raise UsageError(f"{s!r}: a percentage is for an accuracy; {name} is a plain number")
        v /= 100
    if name in (ACC, "train_acc") and not 0 < v <= 1:
        raise UsageError(f"{s!r}: an accuracy between 0 and 1 (0.9, or 90%)")
    return Target(name, op, v)


def _acc(v: float, s: str) -> Target:
    if not 0 < v <= 1:
        raise UsageError(f"{s!r}: a validation accuracy between 0 and 1 (0.9, or 90%)")
    return Target(ACC, ">=", v)


KNOWN = FIELDS + ("perplexity", "val_perplexity", "train_perplexity")  # what any run can report


def may_report_own(cfg) -> bool:
    """Whether a run of `cfg` can report metrics of its own (names fixed by its first batch): a
    loss callable's, or a user model's `metrics` under its own loss."""
    loss, model = str(cfg.train.loss), str(cfg.model.name)
    return ":" in loss or (":" in model and loss == "auto")


def check_target_metric(target: Target, own: bool = False) -> None:
    """UsageError (one line: the known names, the closest) when a target names a metric no run
    of this kind reports: a misspelt `val_los<=5` would run to its end and say `not reached`.
    `own` (may_report_own): any name not a near miss of a known one may be the run's own."""
    name = target.name
    if name in KNOWN:
        return
    close = difflib.get_close_matches(name, KNOWN, n=1, cutoff=0.8)
    if own and not close:
        return
    hint = f" (did you mean {close[0]}?)" if close else ""
    own_said = "; a loss callable's or model's own metrics by their name" if own else ""
    raise UsageError(f"{target.text!r}: unknown metric {name!r}{hint}; known: {', '.join(KNOWN)}{own_said}")
