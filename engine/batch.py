"""A collated batch as the loop handles it, whatever the task: how many samples and tokens it
holds, its move to the device, its first n samples, and how it meets the model. Tuples, lists and
dicts (any Mapping: a tokenizer's BatchEncoding is a UserDict), nested. Per micro-batch on the
hot path (samples_in, token_count, to_device): torch imported once here, not per call.
"""
from __future__ import annotations

from collections.abc import Mapping

import torch


def batch_size(batch) -> int:
    """Samples in a collated batch: the first dim of its first tensor."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else 1
    items = batch.values() if isinstance(batch, Mapping) else batch if isinstance(batch, (list, tuple)) else ()
    for v in items:
        n = batch_size(v)
        if n:
            return n
    return 0


def samples_in(batch) -> int:
    """Samples in a batch as the loop counts them: an (x, y) pair by its targets, else batch_size."""
    if isinstance(batch, (list, tuple)) and len(batch) == 2 and isinstance(batch[1], torch.Tensor):
        return batch[1].shape[0]
    return batch_size(batch)


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


def to_device(obj, device):
    """A collated batch on `device`, whole: tensors in tuples, lists and dicts, nested."""
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
    if isinstance(obj, torch.Tensor):
        return obj[:n] if obj.dim() else obj
    if isinstance(obj, Mapping):
        return {k: slice_batch(v, n) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(slice_batch(v, n) for v in obj) if type(obj) in (list, tuple) else \
            [slice_batch(v, n) for v in obj]
    return obj
