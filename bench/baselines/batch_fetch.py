"""What a careful user writes for an in-memory data set: hand the DataLoader whole batches (one
gather per tensor) instead of one sample at a time and a stack. The baselines' --batched runs
use it, so torchdeck (which does the same for in-memory sets) is also compared like for like."""
from __future__ import annotations

import torch


class BatchFetch(torch.utils.data.Dataset):
    def __init__(self, x: torch.Tensor, y: torch.Tensor):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.y)

    def __getitems__(self, idx):
        idx = torch.as_tensor(idx)
        return self.x[idx], self.y[idx]


def as_is(batch):
    """collate_fn: the batch is already stacked."""
    return batch


def loader(dataset, batch_size: int, **kw) -> torch.utils.data.DataLoader:
    """A DataLoader over a TensorDataset's (x, y), fetched a batch at a time."""
    return torch.utils.data.DataLoader(BatchFetch(*dataset.tensors), batch_size=batch_size, drop_last=True,
                                       collate_fn=as_is, **kw)
