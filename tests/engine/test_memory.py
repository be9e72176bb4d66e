"""`torchdeck validate --memory`: per-rank memory from the real model, sharded as the strategy
shards it, with activations measured from one forward pass."""
from __future__ import annotations

import pytest

from torchdeck.cli import main as cli
from torchdeck.engine import config as cfgmod
from torchdeck.engine import memory, preflight
from torchdeck.engine.hardware import GPUInfo, Hardware

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
    return preflight.from_dict(d, hw=Hardware(gpu_count=1))


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
    assert zero["ddp buckets"] == pytest.approx(4 * n / MiB)  # zero's model is DDP's: its buckets too
    fsdp = memory.estimate(cfg(strategy="fsdp")).device_mb
    assert fsdp["parameters"] == pytest.approx(4 * n / MiB / 2) and fsdp["gradients"] == pytest.approx(4 * n / MiB / 2)
    off = memory.estimate(cfg(strategy="deepspeed", **{"deepspeed.offload_optimizer": "cpu"}))
    assert "optimizer state" not in off.device_mb and off.host_mb["optimizer state"] == pytest.approx(8 * n / MiB / 2)

    gpu = cfg(strategy="gpu", accelerator="cuda", devices=[0], backend="auto")
    hw = Hardware(gpu_count=1, gpus=[GPUInfo(0, "T4", 1, 1, False)])  # 0 MiB free
    assert "warning: GPU 0 has 0 MiB free, a rank needs about" in "\n".join(memory.lines(gpu, hw))

    assert cli.main(["validate", "quickstart", "--memory"]) == 0
    assert "memory per rank (MiB, estimated; 62,006 parameters" in capsys.readouterr().out


@pytest.mark.parametrize("name,extra", [("sgd", {"optimizer.momentum": 0.9}), ("sgd", {"optimizer.momentum": 0.0}),
                                        ("adam", {}), ("adamw", {})])
def test_optimizer_state_is_what_the_real_optimizer_keeps_after_a_step(name, extra):
    """Issue 27: AdamW's state counted once, or SGD's momentum dropped, passed every test. The
    estimate must equal the bytes of the state tensors a real torch.optim optimizer holds after
    one step (the per-parameter `step` counters, 0-dim, are left out of both)."""
    import torch

    from torchdeck.engine.models import build_model
    from torchdeck.engine.optim import build_optimizer
    from torchdeck.engine.strategies import get_strategy

    c = cfg(strategy="cpu", devices=1, backend="auto", **{"optimizer.name": name, **extra})
    torch.manual_seed(0)
    model = build_model(c, memory._data_info(c))
    opt = build_optimizer(c, get_strategy("cpu"), model)
    x = torch.randn(4, 3, 8, 8)
    torch.nn.functional.cross_entropy(model(x), torch.tensor([0, 1, 2, 3])).backward()
    opt.step()
    held = sum(t.untyped_storage().nbytes() for st in opt.state.values() for t in st.values()
               if isinstance(t, torch.Tensor) and t.dim() > 0)
    assert memory.estimate(c).device_mb["optimizer state"] * MiB == pytest.approx(held)


def test_validate_memory_counts_the_data_set_and_the_runtime_a_rank_holds(tmp_path):
    """Issue 27: `validate --memory` said `total 4.4 MiB` per rank where each quickstart rank
    measured 846-880 MiB: the synthetic set every rank generates (120 MiB) and torch's own
    footprint were not counted, nor said to be left out."""
    import subprocess
    import sys
    from pathlib import Path

    exe = Path(sys.executable).with_name("torchdeck")
    r = subprocess.run([str(exe), "validate", "quickstart", "--memory"], capture_output=True, text=True,
                       timeout=120, cwd=tmp_path, env={**__import__("os").environ, "TORCHDECK_RUNS": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    line = next(ln for ln in r.stdout.splitlines() if "memory per rank" in ln)
    assert "data set 120.0" in line  # (4096 + 1024) x 3 x 32 x 32 float32, generated by each rank
    runtime = float(line.split("runtime ")[1].split(";")[0].replace(",", ""))
    total = float(line.split("total ")[1].replace(",", ""))
    assert runtime > 100 and total > 120 + runtime  # torch alone is hundreds of MiB
    assert "not counted:" in r.stdout  # and it says what is still left out


def test_a_script_run_is_not_estimated_as_the_loops_default_model():
    """Issue 35 bug 9: a script preset's estimate was quickstart's CNN (the loop's defaults); the
    app's F8 prints these lines too."""
    c = cfgmod.from_dict({"name": "s", "strategy": "script", "script": {"path": "train.py"}})
    est = memory.estimate(c)
    assert est.params == 0 and est.note.startswith("not estimated for a script run: the model and batch")
    assert memory.lines(c) == [f"memory: {est.note}"]
