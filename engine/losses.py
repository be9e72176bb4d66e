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

No torch at import: the supervisor and `torchdeck validate` describe the setting without it.
"""
from __future__ import annotations

import math
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


def batch_size(batch) -> int:
    """Samples in a collated batch: the first dim of its first tensor."""
    import torch

    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else 1
    items = batch.values() if isinstance(batch, Mapping) else batch if isinstance(batch, (list, tuple)) else ()
    for v in items:
        n = batch_size(v)
        if n:
            return n
    return 0


def token_count(batch) -> int | None:
    """Tokens in a batch that carries token ids (`input_ids`): the real ones where an
    `attention_mask` says which; None for other batches. Read on the host before the copy to the
    device (the loader's tensors are CPU tensors), so it costs no device sync."""
    if not isinstance(batch, Mapping):
        return None
    ids = batch.get("input_ids")
    if ids is None or not hasattr(ids, "numel"):
        return None
    mask = batch.get("attention_mask")
    if mask is not None and hasattr(mask, "sum"):
        return int(mask.sum())
    return int(ids.numel())


def forward(model, x):
    """The model on a batch's inputs: model(**x) for a dict (any Mapping: a HuggingFace
    BatchEncoding too, as `Loss.split` and `to_device` see it), else model(x). The one rule for
    the training step, evaluation and `validate --memory`."""
    return model(**x) if isinstance(x, Mapping) else model(x)


def perplexity(mean_loss: float) -> float:
    """exp of the mean token loss (of a sum it would grow with the set's size); inf past a float."""
    try:
        return math.exp(mean_loss)
    except OverflowError:
        return math.inf


def to_device(obj, device):
    """A collated batch on `device`, whole: tensors in tuples, lists and dicts, nested."""
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.to(device, non_blocking=True)
    if isinstance(obj, Mapping):
        return type(obj)((k, to_device(v, device)) for k, v in obj.items()) if type(obj) is not dict \
            else {k: to_device(v, device) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        moved = [to_device(v, device) for v in obj]
        return type(obj)(moved) if type(obj) in (list, tuple) else moved
    return obj


def slice_batch(obj, n: int):
    """The first n samples of a collated batch (every tensor with a batch dim)."""
    import torch

    if isinstance(obj, torch.Tensor):
        return obj[:n] if obj.dim() else obj
    if isinstance(obj, Mapping):
        return {k: slice_batch(v, n) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(slice_batch(v, n) for v in obj) if type(obj) in (list, tuple) else \
            [slice_batch(v, n) for v in obj]
    return obj


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


class Loss:
    """The run's loss: `split` a batch into the model's inputs and the targets, then `__call__`
    (output, targets, batch) -> (loss, extras: list of scalar tensors, or None). The first call
    decides the rule (`said`: the line for the run's log); `classification` (accuracy counted) and
    `tokens` (token cross-entropy: perplexity) follow from it."""

    def __init__(self, setting: str = "auto"):
        self.setting = setting
        self.rule: str | None = None  # output | cross_entropy | mse | bce | callable
        self.said = ""
        self.classification = False
        self.tokens = False
        self.names: list[str] = []  # extra metrics, fixed by the first batch
        self.fn = None
        if setting not in BUILTIN:
            from .usercode import load_callable

            self.fn = load_callable(setting, "train.loss", LossError)

    @property
    def decided(self) -> bool:
        return self.rule is not None

    def split(self, batch):
        """(model inputs, targets): a tensor is passed as model(x), a dict as model(**inputs)."""
        if isinstance(batch, (list, tuple)):
            if not batch:
                raise LossError("an empty batch: a sample must be (x, y, ...), a dict of tensors or one tensor")
            rest = batch[1:]
            return batch[0], (rest[0] if len(rest) == 1 else tuple(rest) if rest else None)
        if isinstance(batch, Mapping):
            key = targets_key(batch)
            if self.setting in ("cross_entropy", "mse", "bce") and key is not None:
                return {k: v for k, v in batch.items() if k != key}, batch[key]
            return batch, (batch[key] if key is not None else None)
        return batch, None

    # ------------------------------------------------------------------ the decision
    def _decide(self, out, targets) -> None:
        import torch

        s = self.setting
        if self.fn is not None:
            self.rule, self.said = "callable", f"loss: {s}"
            return
        if s == "auto":
            own, where = own_loss(out)
            if own is not None:
                self.rule = "output"
                self.said = f"loss: the model's own ({where})"
            else:
                s = "cross_entropy"
            if self.rule == "output":
                logits = logits_of(out) if not isinstance(out, torch.Tensor) else None
                self.tokens = logits is not None and logits.dim() >= 3
                extra = _get(out, "metrics")
                self.names = list(extra) if isinstance(extra, Mapping) else []
                return
        self.rule = s
        if s == "cross_entropy":
            logits = logits_of(out)
            if logits is None or not isinstance(targets, torch.Tensor) or targets.is_floating_point():
                why = ("the model's output has no loss (.loss or [\"loss\"]) and is not a scalar, so "
                       if self.setting == "auto" else "")
                raise LossError(
                    f"train.loss {self.setting}: {why}cross-entropy needs logits and integer targets; the output is "
                    f"{_shape(logits if logits is not None else out)}, the targets {_shape(targets)}. Set train.loss "
                    "mse or bce for float targets, return the loss from the model (output.loss), or name "
                    "your own: train.loss: package.module:callable")
            self.classification = logits.dim() == 2 and targets.dim() == 1
            self.tokens = logits.dim() >= 3
            self.said = "loss: cross_entropy (integer targets)"
        else:
            if not isinstance(targets, torch.Tensor):
                raise LossError(f"train.loss {s}: needs a target tensor in the batch ((x, y) or a dict with "
                                f"'labels'), got {_shape(targets)}")
            self.said = f"loss: {s}"

    # ------------------------------------------------------------------ per batch
    def __call__(self, out, targets, batch):
        if self.rule is None:
            self._decide(out, targets)
        rule = self.rule
        if rule == "cross_entropy" and self.classification:
            import torch.nn.functional as F

            return F.cross_entropy(logits_of(out), targets), None
        return self._general(out, targets, batch)

    def _general(self, out, targets, batch):
        import torch
        import torch.nn.functional as F

        rule, extras = self.rule, None
        if rule == "output":
            loss, _ = own_loss(out)
            if loss is None and isinstance(out, torch.Tensor):
                loss = out  # DataParallel: each replica's scalar, gathered into a vector
            if not isinstance(loss, torch.Tensor):
                raise LossError(f"train.loss auto: the first batch's output had the model's own loss, this "
                                f"one ({_shape(out)}) has none: return it on every batch")
            if self.names:
                extras = _get(out, "metrics")
        elif rule == "callable":
            got = self.fn(out, batch)
            if isinstance(got, tuple) and len(got) == 2 and isinstance(got[1], Mapping):
                loss, extras = got
                if not self.names and extras:
                    self.names = [str(k) for k in extras]
            else:
                loss = got
            if not isinstance(loss, torch.Tensor):
                raise LossError(f"train.loss {self.setting}: must return a loss tensor or (loss, {{name: value}}), "
                                f"got {type(got).__name__}")
        else:
            logits = logits_of(out)
            if rule == "cross_entropy":
                loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100)
            else:
                if logits.shape != targets.shape and logits.numel() == targets.numel():
                    logits = logits.reshape(targets.shape)  # [B, 1] against [B]
                fn = F.mse_loss if rule == "mse" else F.binary_cross_entropy_with_logits
                loss = fn(logits.float(), targets.to(logits.device).float())
        if loss.dim():
            loss = loss.mean()
        return loss, (self._extras(extras, loss) if self.names else None)

    def _extras(self, extras, loss):
        """The extra metrics of one batch, in the order of `names`, as detached float64 scalars."""
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

    def metric_names(self) -> list[str]:
        return list(self.names)

    def metrics(self, loss_sum: float, extra_sums, count: float) -> dict:
        """The task's metrics over `count` samples from their sums (the loss and the extra metrics
        weighted by samples, as training windows and evaluation add them): the extra metrics'
        means and, for token cross-entropy, the perplexity of the mean loss. Training's epoch end
        and evaluation both say them this way."""
        count = count or 1
        out = {name: v / count for name, v in zip(self.names, extra_sums)}
        if self.tokens:
            out["perplexity"] = perplexity(loss_sum / count)
        return out
