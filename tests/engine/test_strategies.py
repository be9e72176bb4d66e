"""dp, model-parallel, fsdp and zero: equivalence with plain training, checkpoints, refusals.

Distributed cases are real: 2 gloo ranks spawned with torch.multiprocessing, as a user's run.
One spawn runs every DDP/ZeRO/FSDP scenario (spawning costs far more than the few steps).
"""
from __future__ import annotations

import copy
import os
import socket
import tempfile
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from engine.config import ConfigError, Hardware, from_dict
from engine.data import DataInfo
from engine.models import ModelError, cnn, mlp
from engine.strategies import get_strategy
from engine.strategies._pipeline import Pipeline, balance
from engine.strategies.base import RankContext

INFO = DataInfo(in_channels=3, num_classes=10, image_size=16, name="test")
STEPS, ACCUM, B = 3, 2, 4  # optimizer steps, micro-steps per step, per-rank micro-batch
WORLD = 2


def batches(n_steps: int, size: int, seed: int = 7):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(size, 3, 16, 16, generator=g), torch.randint(0, 10, (size,), generator=g))
            for _ in range(n_steps)]


def reference(make_opt, n_steps: int, model_fn=cnn):
    """One process, one plain model, the whole global batch per step: what every strategy must match."""
    torch.manual_seed(0)
    model = model_fn(INFO)
    opt = make_opt(model.parameters())
    for x, y in batches(n_steps, WORLD * ACCUM * B):
        F.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    return model.state_dict()


def sgd(params):
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def adam(params):
    return torch.optim.Adam(params, lr=1e-3)


def assert_same(a: dict, b: dict, atol=1e-5):
    assert list(a) == list(b)
    for k in a:
        torch.testing.assert_close(a[k].cpu().float(), b[k].cpu().float(), atol=atol, rtol=0, msg=k)


# ----------------------------------------------------------------------------- model-parallel


def cpu_ctx(cfg) -> RankContext:
    return RankContext(0, 0, 1, 1, 0, torch.device("cpu"), cfg)


def mp_cfg(devices=2, split=(), micro=1, batch=16):
    return from_dict({"strategy": "model-parallel", "devices": devices,
                      "model_parallel": {"split": list(split), "micro_batches": micro},
                      "train": {"batch_size": batch}})


def test_balance_minimises_the_heaviest_stage():
    assert balance([10, 0, 10, 0], 2) == [2, 2]  # the activation stays with the layer before it
    assert balance([1, 1, 100, 1], 2) == [2, 2]
    assert balance([100, 1, 1, 1], 2) == [1, 3]
    assert balance([0, 1, 0, 1, 0, 1], 3) == [3, 2, 1]
    with pytest.raises(ModelError, match="only 2 layers"):
        balance([1, 1], 3)


@pytest.mark.parametrize("devices,split,micro", [
    (2, (), 1), (2, (), 4), (3, (), 3), (2, (4, 8), 2), (3, (1, 1, 10), 5),
])
def test_model_parallel_trains_like_the_unsplit_model(devices, split, micro):
    """Same init, same batches, SGD with momentum: the split (and pipelined) model ends where the plain one does."""
    want = reference(sgd, 4)
    torch.manual_seed(0)
    strategy = get_strategy("model-parallel")
    cfg = mp_cfg(devices, split, micro)
    model = strategy.wrap(cnn(INFO), cpu_ctx(cfg))
    assert len(model._stages) == devices and sum(model.split) == 12
    if split:
        assert model.split == list(split)
    opt = strategy.make_optimizer(sgd, model)
    for x, y in batches(4, WORLD * ACCUM * B):
        F.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    got = strategy.model_state(model, cpu_ctx(cfg))
    assert_same(got, want)
    plain = cnn(INFO)
    plain.load_state_dict(got)  # same keys as the unsplit model: a checkpoint loads without the strategy


def test_model_parallel_micro_batches_really_split_the_batch():
    """Each stage runs once per micro-batch, in wavefront order, and the output keeps the batch order."""
    torch.manual_seed(0)
    seen = []
    model = nn.Sequential(nn.Linear(5, 5), nn.Linear(5, 5), nn.Linear(5, 3))
    plain = copy.deepcopy(model)
    for i, layer in enumerate(model):
        layer.register_forward_hook(lambda m, inp, out, i=i: seen.append((i, inp[0].shape[0])))
    pipe = Pipeline(model, ["cpu", "cpu", "cpu"], micro_batches=4)
    x = torch.randn(8, 5)
    torch.testing.assert_close(pipe(x), plain(x))
    assert seen == [(0, 2), (1, 2), (0, 2), (2, 2), (1, 2), (0, 2),
                                 (2, 2), (1, 2), (0, 2), (2, 2), (1, 2), (2, 2)]


def test_model_parallel_explains_models_it_cannot_split():
    strategy = get_strategy("model-parallel")
    from engine.models import resnet18

    with pytest.raises(ModelError, match="nn.Sequential.*ResNet"):
        strategy.wrap(resnet18(INFO), cpu_ctx(mp_cfg()))
    with pytest.raises(ModelError, match="split .* covers 3 layers.*has 12"):
        strategy.wrap(cnn(INFO), cpu_ctx(mp_cfg(2, (1, 2))))
    with pytest.raises(ModelError, match="3 devices but the model has only 2"):
        strategy.wrap(nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2)), cpu_ctx(mp_cfg(3)))


def test_model_parallel_config_rules_name_their_field():
    with pytest.raises(ConfigError) as e:
        mp_cfg(devices=1)
    assert "devices" in e.value.by_field()
    with pytest.raises(ConfigError) as e:
        mp_cfg(devices=2, split=(3,))
    assert "model_parallel.split" in e.value.by_field()
    with pytest.raises(ConfigError) as e:
        mp_cfg(micro=32, batch=16)
    assert "model_parallel.micro_batches" in e.value.by_field()


# ----------------------------------------------------------------------------- dp / fsdp config


def test_dp_refuses_without_a_gpu_and_says_so():
    preset = Path(__file__).resolve().parents[2] / "presets" / "dp.yaml"
    import yaml

    data = yaml.safe_load(preset.read_text())
    with pytest.raises(ConfigError) as e:
        from_dict(data, hw=Hardware(gpu_count=0))
    msg = str(e.value)
    assert "accelerator" in e.value.by_field() and "GPU" in msg
    with pytest.raises(ConfigError) as e:
        from_dict(data, hw=Hardware(gpu_count=1))
    assert "GPU 1 does not exist" in e.value.by_field()["devices"]
    cfg = from_dict(data, hw=Hardware(gpu_count=2))
    assert get_strategy("dp").local_devices(cfg, 0) == ["cuda:0", "cuda:1"]


def test_fsdp_sharded_state_dict_is_refused_before_anything_starts():
    with pytest.raises(ConfigError) as e:
        from_dict({"strategy": "fsdp", "devices": 2, "fsdp": {"state_dict": "sharded"}})
    assert "fsdp.state_dict" in e.value.by_field()


def test_zero_rebuilds_the_loops_optimizer_from_a_plain_factory():
    """Without class/kwargs attached, ZeRO probes the factory; AdamW's defaults carry a key its
    constructor refuses, which must be dropped."""
    from engine.strategies.zero import _optimizer_recipe

    model = nn.Linear(3, 2)
    cls, kw = _optimizer_recipe(lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.1), model)
    assert cls is torch.optim.AdamW and kw["lr"] == 0.01 and kw["weight_decay"] == 0.1
    cls(model.parameters(), **kw)

    def fn(ps):
        return torch.optim.SGD(ps, lr=0.3)
    fn.optimizer_class, fn.optimizer_kwargs = torch.optim.SGD, {"lr": 0.3, "momentum": 0.5}
    assert _optimizer_recipe(fn, model) == (torch.optim.SGD, {"lr": 0.3, "momentum": 0.5})
