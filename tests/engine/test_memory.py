"""`torchdeck validate --memory`: per-rank memory from the real model, sharded as the strategy
shards it, with activations measured from one forward pass."""
from __future__ import annotations

import pytest

from cli import main as cli
from engine import config as cfgmod
from engine import memory
from engine.hardware import GPUInfo

MiB = 2 ** 20


def cfg(**over):
    d = {"strategy": "ddp", "devices": 2, "model": {"name": "mlp", "hidden": 64}, "optimizer": {"name": "adam"},
         "data": {"image_size": 8, "num_classes": 10}, "train": {"batch_size": 32}}
    for k, v in over.items():
        head, _, tail = k.partition(".")
        if tail:
            d.setdefault(head, {})[tail] = v
        else:
            d[head] = v
    return cfgmod.from_dict(d, hw=cfgmod.Hardware(gpu_count=1))


def test_estimate_counts_what_each_strategy_keeps_and_measures_activations(capsys):
    flat, h, k = 3 * 8 * 8, 64, 10
    n = flat * h + h + h * h + h + h * k + k
    est = memory.estimate(cfg())
    assert est.params == n
    assert est.device_mb["parameters"] == pytest.approx(4 * n / MiB)
    assert est.device_mb["optimizer state"] == pytest.approx(8 * n / MiB)  # adam: two moments
    assert est.device_mb["ddp buckets"] == pytest.approx(4 * n / MiB)
    # what autograd keeps of an mlp, per sample: the input, two ReLU outputs (which the next
    # Linear saves too, held once) and the logits
    assert est.device_mb["activations"] == pytest.approx(32 * 4 * (flat + h + h + k) / MiB)
    assert memory.estimate(cfg(**{"train.batch_size": 64})).device_mb["activations"] == pytest.approx(
        2 * est.device_mb["activations"])
    zero = memory.estimate(cfg(strategy="zero")).device_mb
    assert zero["optimizer state"] == pytest.approx(8 * n / MiB / 2) and zero["parameters"] == pytest.approx(4 * n / MiB)
    fsdp = memory.estimate(cfg(strategy="fsdp")).device_mb
    assert fsdp["parameters"] == pytest.approx(4 * n / MiB / 2) and fsdp["gradients"] == pytest.approx(4 * n / MiB / 2)
    off = memory.estimate(cfg(strategy="deepspeed", **{"deepspeed.offload_optimizer": "cpu"}))
    assert "optimizer state" not in off.device_mb and off.host_mb["optimizer state"] == pytest.approx(8 * n / MiB / 2)

    gpu = cfg(strategy="gpu", accelerator="cuda", devices=[0], backend="auto")
    hw = cfgmod.Hardware(gpu_count=1, gpus=[GPUInfo(0, "T4", 1, 1, False)])  # 0 MiB free
    assert "warning: GPU 0 has 0 MiB free, a rank needs about" in "\n".join(memory.lines(gpu, hw))

    assert cli.main(["validate", "quickstart", "--memory"]) == 0
    assert "memory per rank (MiB, estimated; 62,006 parameters" in capsys.readouterr().out
