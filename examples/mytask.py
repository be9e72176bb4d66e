"""Your own task in torchdeck's loop: a data set and a model of yours, named by a preset
(examples/mytask.yaml: `torchdeck run examples/mytask.yaml`). torchdeck brings the rest: the
strategy, the loop, checkpoints, the views."""
import torch
from torch.utils.data import TensorDataset


def data(cfg):
    """data.dataset: mytask:data -> (train, val, info); info's keys reach the model as attributes."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1024, 8, generator=g)
    y = x @ torch.randn(8, generator=g)  # a linear target: regression, no classes
    return TensorDataset(x[:896], y[:896]), TensorDataset(x[896:], y[896:]), {"features": 8}


def model(info):
    """model.name: mytask:model, called with the data's info."""
    return torch.nn.Sequential(torch.nn.Linear(info.features, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
