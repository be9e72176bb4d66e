"""The loss a run trains on (`train.loss`), decided once per run, and the metrics that fit its task.

    auto            the model's own loss: its output's `.loss` (a HuggingFace ModelOutput), its
                    ["loss"], the output itself when it is a scalar tensor, or a tuple's scalar
                    first element ((loss, logits, ...): return_dict=False); else cross-entropy
                    on integer targets. Decided on the first batch and kept for the run.
    cross_entropy   logits [B, C] against integer targets [B] (classification: accuracy is
                    counted), or [B, T, V] against [B, T] (token cross-entropy, the sequence dims
                    flattened, -100 ignored: perplexity is reported)
    mse, bce        mean squared error / binary cross-entropy on logits, against float targets
                    (an output [B, 1] meets targets [B])
    package.module:callable
                    callable(model_output, batch) -> loss, or -> (loss, {name: value}): the values
                    are extra metrics, averaged over the samples and the ranks like the loss

How a batch meets the model: a tuple or list (x, y, ...) is passed as model(x), the rest are the
targets (y alone when there is one); a dict (any Mapping: a tokenizer's BatchEncoding is a
UserDict) is passed whole as model(**batch), except under cross_entropy, mse and bce, which take
their targets from its "labels" key (or label, targets, target, y) and pass the other keys; one
tensor is passed as model(x), with no targets.

A loss that is not a scalar (nn.DataParallel gathers each replica's scalar into a vector) is
averaged. Extra metrics may also come from the model: an output whose `metrics` (attribute or
key) is a {name: value} dict, under the model's own loss. Their names are fixed by the first batch.

Each rule is one class (`Rule`): chosen once, from the setting or, under auto, from the first
batch; it computes the loss, says which metrics the task has (`sum_names`: accuracy only for
classification) and gives an evaluation batch's sums (engine/sums.py reduces them). Batch
plumbing (device moves, sample and token counts) is engine/batch.py.

No torch at import: the supervisor and `torchdeck validate` describe the setting without it.
"""
from __future__ import annotations

from collections.abc import Mapping

from .config import LOSSES as BUILTIN  # train.loss, besides package.module:callable
from .errors import TorchdeckError

TARGET_KEYS = ("labels", "label", "targets", "target", "y")
_IMAGE_MODELS = ("cnn", "mlp", "resnet18")


class LossError(TorchdeckError):
    """A loss that cannot be computed on this model's output and batch, with what to set instead."""


def said(setting: str) -> str:
    """The configured loss as run_started says it, before the data exists."""
    return "auto (decided on the first batch)" if setting == "auto" else setting


def describe(cfg) -> str:
    """`torchdeck validate`'s line: the rule where the config tells it, else when it is decided."""
    setting, model = cfg.train.loss, cfg.model.name
    if setting == "auto":
        if model in _IMAGE_MODELS and cfg.data.dataset != "text":
            return "loss: cross_entropy (integer targets), auto for the built-in image model " + model
        if model == "gpt":
            return "loss: the model's own (output.loss), auto for the built-in gpt: token cross-entropy"
        return ("loss: auto, decided on the first batch (the output's .loss or [\"loss\"], a scalar output or "
                "a (loss, ...) tuple, else cross-entropy on integer targets); the run's log says which")
    if setting == "cross_entropy":
        return "loss: cross_entropy (integer targets)"
    if setting in BUILTIN:
        return f"loss: {setting} (float targets)"
    return f"loss: {setting} (your callable(model_output, batch))"


def targets_key(batch: Mapping):
    for k in TARGET_KEYS:
        if k in batch:
            return k
    return None


def _get(out, key):
    """out.key or out[key]; None when it has neither."""
    if isinstance(out, Mapping):
        return out.get(key)
    v = getattr(out, key, None)
    return None if callable(v) and not hasattr(v, "dim") else v


def logits_of(out):
    """The prediction tensor of a model output: itself, its logits, or a tuple's first tensor that
    is not a scalar ((logits, aux) or, with the loss first, (loss, logits, ...))."""
    import torch

    if isinstance(out, torch.Tensor):
        return out
    got = _get(out, "logits")
    if isinstance(got, torch.Tensor):
        return got
    if isinstance(out, (tuple, list)):
        return next((v for v in out if isinstance(v, torch.Tensor) and v.dim()), None)
    return None


def own_loss(out):
    """The model's own loss in its output, with where it was: its `.loss` or ["loss"], the output
    itself when it is a scalar, or a tuple's scalar first element (a HuggingFace model called
    with return_dict=False and labels returns (loss, logits, ...)). (None, "") when it has none."""
    import torch

    got = _get(out, "loss")
    if isinstance(got, torch.Tensor):
        return got, "output.loss"
    if isinstance(out, torch.Tensor) and out.numel() == 1 and out.dim() == 0:
        return out, "its scalar output"
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor) and out[0].dim() == 0:
        return out[0], "the first element of its output tuple"
    return None, ""


def _shape(v) -> str:
    import torch

    if isinstance(v, torch.Tensor):
        return f"{str(v.dtype).replace('torch.', '')} {list(v.shape)}"
    return type(v).__name__


# ---------------------------------------------------------------------------- the rules
class Rule:
    """One loss rule. `__call__(output, targets, batch)` -> (loss, extras: the extra metrics as
    detached scalars in the order of `names`, or None). `sum_names` is what the run sums per
    sample and reports: the loss, `correct` (accuracy) for classification, then the extras."""

    said = ""  # the line for the run's log
    classification = False  # accuracy counted: argmax hits over the samples
    tokens = False  # token cross-entropy: perplexity reported
    real_only = False  # evaluation cuts a rank's padded last batch before the forward, not after

    def __init__(self, setting: str):
        self.setting = setting
        self.names: list[str] = []  # the extra metrics, fixed by the first batch that has them

    def sum_names(self) -> list[str]:
        return ["loss"] + (["correct"] if self.classification else []) + self.names

    def eval_sums(self, out, targets, batch, n: int, b: int) -> list:
        """One evaluation batch's sums, in the order of `sum_names`, over its first n samples of b
        (the rest pads the rank's shard). The mean loss of the real samples, weighted by them."""
        if not self.real_only:
            out = logits_of(out).float()
            out, targets = (out[:n], targets[:n]) if n < b else (out, targets)
        value, extras = self(out, targets, batch)
        return [value.double() * n] + [e.double() * n for e in (extras or [])]

    def _mean(self, loss, extras):
        if loss.dim():
            loss = loss.mean()  # nn.DataParallel gathers each replica's scalar into a vector
        return loss, (self._extras(extras, loss) if self.names else None)

    def _extras(self, extras, loss):
        """The extra metrics of one batch, in the order of `names`, as detached float scalars."""
        import torch

        if not isinstance(extras, Mapping) or [str(k) for k in extras] != self.names:
            got = list(extras) if isinstance(extras, Mapping) else type(extras).__name__
            raise LossError(f"train.loss {self.setting}: the extra metrics must have the same names every batch "
                            f"(the first had {self.names}, this one {got})")
        out = []
        for v in extras.values():
            t = v.detach() if isinstance(v, torch.Tensor) else torch.tensor(float(v))
            out.append(t.float().mean().to(loss.device))
        return out


class OwnLoss(Rule):
    """auto: the loss the model returns (its output's .loss or ["loss"], a scalar output, a tuple's
    scalar first element), with its `metrics` dict as extras."""

    real_only = True

    def __init__(self, setting: str, out, where: str):
        import torch

        super().__init__(setting)
        self.said = f"loss: the model's own ({where})"
        logits = logits_of(out) if not isinstance(out, torch.Tensor) else None
        self.tokens = logits is not None and logits.dim() >= 3
        extra = _get(out, "metrics")
        self.names = list(extra) if isinstance(extra, Mapping) else []

    def __call__(self, out, targets, batch):
        import torch

        loss, _ = own_loss(out)
        if loss is None and isinstance(out, torch.Tensor):
            loss = out  # DataParallel: each replica's scalar, gathered into a vector
        if not isinstance(loss, torch.Tensor):
            raise LossError(f"train.loss auto: the first batch's output had the model's own loss, this "
                            f"one ({_shape(out)}) has none: return it on every batch")
        return self._mean(loss, _get(out, "metrics") if self.names else None)


class CallableLoss(Rule):
    """package.module:callable(model_output, batch) -> loss, or (loss, {name: value})."""

    real_only = True

    def __init__(self, setting: str, fn):
        super().__init__(setting)
        self.fn, self.said = fn, f"loss: {setting}"

    def __call__(self, out, targets, batch):
        import torch

        got = self.fn(out, batch)
        extras = None
        if isinstance(got, tuple) and len(got) == 2 and isinstance(got[1], Mapping):
            loss, extras = got
            if not self.names and extras:
                self.names = [str(k) for k in extras]
        else:
            loss = got
        if not isinstance(loss, torch.Tensor):
            raise LossError(f"train.loss {self.setting}: must return a loss tensor or (loss, {{name: value}}), "
                            f"got {type(got).__name__}")
        return self._mean(loss, extras)


class ClassCrossEntropy(Rule):
    """cross_entropy on logits [B, C] and integer targets [B]: accuracy counted."""

    said = "loss: cross_entropy (integer targets)"
    classification = True

    def __init__(self, setting: str):
        import torch.nn.functional as F

        super().__init__(setting)
        self._cross_entropy = F.cross_entropy  # bound once: this is every step's loss

    def __call__(self, out, targets, batch):
        return self._cross_entropy(logits_of(out), targets), None

    def eval_sums(self, out, targets, batch, n: int, b: int) -> list:
        """The summed cross-entropy and the argmax hits of the real samples."""
        import torch.nn.functional as F

        logits = logits_of(out).float()
        logits, targets = (logits[:n], targets[:n]) if n < b else (logits, targets)
        return [F.cross_entropy(logits, targets, reduction="sum").double(), (logits.argmax(1) == targets).sum().double()]


class TokenCrossEntropy(Rule):
    """cross_entropy on logits [B, T, V] against [B, T], the sequence dims flattened, -100
    ignored: perplexity reported."""

    said = "loss: cross_entropy (integer targets)"
    tokens = True

    def __call__(self, out, targets, batch):
        import torch.nn.functional as F

        logits = logits_of(out)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100)
        return self._mean(loss, None)


class FloatTargets(Rule):
    """mse or bce (with logits) against float targets; an output [B, 1] meets targets [B]."""

    def __init__(self, setting: str):
        import torch.nn.functional as F

        super().__init__(setting)
        self.said = f"loss: {setting}"
        self.fn = F.mse_loss if setting == "mse" else F.binary_cross_entropy_with_logits

    def __call__(self, out, targets, batch):
        logits = logits_of(out)
        if logits.shape != targets.shape and logits.numel() == targets.numel():
            logits = logits.reshape(targets.shape)  # [B, 1] against [B]
        return self._mean(self.fn(logits.float(), targets.to(logits.device).float()), None)


def _cross_entropy(setting: str, out, targets) -> Rule:
    import torch

    logits = logits_of(out)
    if logits is None or not isinstance(targets, torch.Tensor) or targets.is_floating_point():
        why = ("the model's output has no loss (.loss or [\"loss\"]) and is not a scalar, so "
               if setting == "auto" else "")
        raise LossError(
            f"train.loss {setting}: {why}cross-entropy needs logits and integer targets; the output is "
            f"{_shape(logits if logits is not None else out)}, the targets {_shape(targets)}. Set train.loss "
            "mse or bce for float targets, return the loss from the model (output.loss), or name "
            "your own: train.loss: package.module:callable")
    if logits.dim() == 2 and targets.dim() == 1:
        return ClassCrossEntropy(setting)
    rule = TokenCrossEntropy(setting)
    rule.tokens = logits.dim() >= 3
    return rule


def choose(setting: str, fn, out, targets) -> Rule:
    """The rule of a run, from its setting and its first batch's output and targets."""
    import torch

    if fn is not None:
        return CallableLoss(setting, fn)
    if setting == "auto":
        own, where = own_loss(out)
        return OwnLoss(setting, out, where) if own is not None else _cross_entropy(setting, out, targets)
    if setting == "cross_entropy":
        return _cross_entropy(setting, out, targets)
    if not isinstance(targets, torch.Tensor):
        raise LossError(f"train.loss {setting}: needs a target tensor in the batch ((x, y) or a dict with "
                        f"'labels'), got {_shape(targets)}")
    return FloatTargets(setting)


class Loss:
    """The run's loss: `split` a batch into the model's inputs and the targets, then `__call__`
    (output, targets, batch) -> (loss, extras or None). The first call chooses the `rule` (a Rule),
    which is kept for the run; what the task reports follows from it."""

    def __init__(self, setting: str = "auto"):
        self.setting = setting
        self.rule: Rule | None = None
        self.fn = None
        self._targets_apart = setting in ("cross_entropy", "mse", "bce")  # a dict batch's labels not passed in
        if setting not in BUILTIN:
            from .usercode import load_callable

            self.fn = load_callable(setting, "train.loss", LossError)

    @property
    def decided(self) -> bool:
        return self.rule is not None

    @property
    def said(self) -> str:
        return self.rule.said if self.rule is not None else ""

    @property
    def classification(self) -> bool:
        return self.rule is not None and self.rule.classification

    @property
    def tokens(self) -> bool:
        return self.rule is not None and self.rule.tokens

    @property
    def names(self) -> list[str]:
        return self.rule.names if self.rule is not None else []

    def split(self, batch):
        """(model inputs, targets): a tensor is passed as model(x), a dict as model(**inputs)."""
        if isinstance(batch, (list, tuple)):
            if not batch:
                raise LossError("an empty batch: a sample must be (x, y, ...), a dict of tensors or one tensor")
            rest = batch[1:]
            return batch[0], (rest[0] if len(rest) == 1 else tuple(rest) if rest else None)
        if isinstance(batch, Mapping):
            key = targets_key(batch)
            if self._targets_apart and key is not None:
                return {k: v for k, v in batch.items() if k != key}, batch[key]
            return batch, (batch[key] if key is not None else None)
        return batch, None

    def __call__(self, out, targets, batch):
        if self.rule is None:
            self.rule = choose(self.setting, self.fn, out, targets)
        return self.rule(out, targets, batch)
