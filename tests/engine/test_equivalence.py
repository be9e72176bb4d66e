"""Equivalence: the strongest check of the loop. DDP 2 x B through the real supervisor equals one
process with 2B; accumulation of k x B equals one kB batch. No batch norm or dropout (mlp)."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from torchdeck.engine import config as cfgmod
from torchdeck.engine import events
from tests.engine.helpers import ROOT, assert_same_weights, assert_trained, final_model, run_in_process, run_supervised, small_cfg  # noqa: F401  (shared)


@pytest.mark.slow
def test_ddp_two_ranks_equal_one_process_double_batch(tmp_path):
    ddp = small_cfg(strategy="ddp", devices=2, **{"train.batch_size": 16, "nodes.master_port": 0})
    proc = run_supervised(tmp_path / "ddp", ddp)
    assert proc.returncode == 0, proc.stdout + proc.stderr + (tmp_path / "ddp" / "rank0.log").read_text()
    one = small_cfg(**{"train.batch_size": 32})
    run_in_process(tmp_path / "one", one)

    a, b = final_model(tmp_path / "ddp"), final_model(tmp_path / "one")
    assert a["step"] == b["step"] == 6
    assert_same_weights(a["model"], b["model"])
    assert_trained(a["model"], one, tmp_path / "init")
    # Momentum buffers too: the optimizer saw the same gradients.
    for sa, sb in zip(a["optimizer"]["state"].values(), b["optimizer"]["state"].values()):
        assert torch.allclose(sa["momentum_buffer"], sb["momentum_buffer"], atol=1e-5)


def test_grad_accumulation_equals_larger_batch(tmp_path):
    accum = small_cfg(**{"train.batch_size": 8, "train.grad_accum": 4, "train.max_steps": 5})
    big = small_cfg(**{"train.batch_size": 32, "train.max_steps": 5})
    ev = run_in_process(tmp_path / "accum", accum)
    run_in_process(tmp_path / "big", big)
    a, b = final_model(tmp_path / "accum"), final_model(tmp_path / "big")
    assert a["step"] == b["step"] == 5
    assert_same_weights(a["model"], b["model"])
    steps = [e for e in ev if e["kind"] == "step"]
    assert [e["step"] for e in steps] == [2, 4, 5]  # log_every 2 and the last step
    assert all(e["total_steps"] == 5 for e in steps)


def test_single_process_sampler_is_distributed_sampler_order():
    """cpu/gpu read perm[0:2B] in the order two DDP ranks read perm[r::2] -- the basis of equivalence."""
    from torch.utils.data import DistributedSampler

    from torchdeck.engine.data import default_sampler

    data = list(range(101))
    for epoch in (0, 3):
        one = default_sampler(data, seed=7)
        one.set_epoch(epoch)
        ranks = [DistributedSampler(data, num_replicas=2, rank=r, shuffle=True, seed=7, drop_last=True)
                 for r in (0, 1)]
        for r in ranks:
            r.set_epoch(epoch)
        order = list(one)
        r0, r1 = (list(r) for r in ranks)
        b = 5
        for i in range(len(r0) // b):
            assert sorted(order[2 * b * i: 2 * b * (i + 1)]) == sorted(r0[b * i: b * (i + 1)] + r1[b * i: b * (i + 1)])
    e0, e1 = default_sampler(data, 7), default_sampler(data, 7)
    e1.set_epoch(1)
    assert list(e0) != list(e1)  # set_epoch reshuffles


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.gpu
@pytest.mark.slow
@needs_cuda
@pytest.mark.parametrize("precision", ["16-mixed", "bf16-mixed"])
def test_gpu_run_mixed_precision_on_the_listed_gpu(tmp_path, precision):
    """On the LAST GPU (not cuda:0): fp16 with GradScaler and clipping (data kept on the GPU), or bf16;
    channels_last cnn."""
    idx = torch.cuda.device_count() - 1
    cfg = small_cfg(strategy="gpu", accelerator="cuda", devices=[idx], **{
        "model.name": "cnn", "data.image_size": 32, "train.precision": precision, "train.grad_clip": 1.0,
        "train.channels_last": True, "train.max_steps": 8, "train.eval_every_epoch": True,
        "data.on_device": precision == "16-mixed"})
    proc = run_supervised(tmp_path / "gpu", cfg)
    assert proc.returncode == 0, proc.stdout + proc.stderr + (tmp_path / "gpu" / "rank0.log").read_text()
    evs = events.read_all(tmp_path / "gpu" / "events.jsonl")
    ready = next(e for e in evs if e["kind"] == "rank_ready")
    assert ready["device"] == f"cuda:{idx}"
    steps = [e for e in evs if e["kind"] == "step"]
    assert steps[-1]["step"] == 8 and all(math.isfinite(e["loss"]) for e in steps)
    state = final_model(tmp_path / "gpu")
    assert (state["scaler"] is not None) == (precision == "16-mixed")
    assert all(torch.isfinite(v).all() for v in state["model"].values())


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_ddp_nccl_two_gpus_equal_one_gpu_double_batch(tmp_path):
    ddp = small_cfg(strategy="ddp", accelerator="cuda", devices=[0, 1],
                    **{"train.batch_size": 16, "nodes.master_port": 0})
    one = small_cfg(strategy="gpu", accelerator="cuda", devices=[0], **{"train.batch_size": 32})
    for name, cfg in (("ddp", ddp), ("one", one)):
        proc = run_supervised(tmp_path / name, cfg)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    assert_same_weights(final_model(tmp_path / "ddp")["model"], final_model(tmp_path / "one")["model"], atol=1e-4)


def _lrs(sched_cfg: dict, total=20, per_epoch=5, opt="sgd"):
    from torchdeck.engine.optim import build_scheduler

    cfg = cfgmod.from_dict(small_cfg(**{f"scheduler.{k}": v for k, v in sched_cfg.items()},
                                     **{"optimizer.lr": 0.1, "optimizer.name": opt}))
    p = torch.nn.Parameter(torch.zeros(1))
    o = torch.optim.SGD([p], lr=0.1, momentum=0.9) if opt == "sgd" else torch.optim.AdamW([p], lr=0.1)
    s = build_scheduler(cfg, o, total, per_epoch)
    out = []
    for _ in range(total):
        out.append(o.param_groups[0]["lr"])  # the LR this optimizer step uses
        o.step()
        s.step()
    return out


def test_lr_schedules_follow_their_definition():
    assert _lrs({"name": "none"}) == [0.1] * 20
    warm = _lrs({"name": "warmup", "warmup_steps": 4})
    assert warm[:5] == pytest.approx([0.025, 0.05, 0.075, 0.1, 0.1]) and warm[-1] == pytest.approx(0.1)
    step = _lrs({"name": "step", "step_size": 2, "gamma": 0.5})  # decay every 2 epochs of 5 steps
    assert step[9] == pytest.approx(0.1) and step[10] == pytest.approx(0.05) and step[19] == pytest.approx(0.05)
    cos = _lrs({"name": "cosine", "warmup_steps": 2, "min_lr": 0.01}, total=22)
    assert cos[:2] == pytest.approx([0.05, 0.1]) and cos[2] == pytest.approx(0.1)
    assert cos[12] == pytest.approx(0.055) and cos[-1] > 0.01 and all(a >= b for a, b in zip(cos[2:], cos[3:]))
    one = _lrs({"name": "onecycle", "warmup_steps": 5}, opt="adamw")
    assert max(one) == pytest.approx(0.1) and one.index(max(one)) in (4, 5) and one[0] < 0.01 and one[-1] < 1e-3


def recorded(run_dir: Path, cfg: dict) -> tuple[list[dict], list[dict]]:
    """Run in-process with the recording model; (events, what each forward saw)."""
    from tests.engine import probes

    probes.SEEN.clear()
    ev = run_in_process(run_dir, {**cfg, "model": {**cfg.get("model", {}), "name": "tests.engine.probes:recording"}})
    return ev, list(probes.SEEN)


def test_bf16_autocast_and_channels_last_train_on_cpu(tmp_path):
    """What the engine's own step does with them: every training and eval forward runs under bf16
    autocast (the convolution and the logits come out bf16) on channels-last batches and weights;
    the weights themselves stay fp32. The same run in 32-true is seen as fp32 and contiguous."""
    cfg = small_cfg(**{"model.name": "cnn", "data.image_size": 16, "train.precision": "bf16-mixed",
                       "train.channels_last": True, "train.max_steps": 3, "train.log_every_n_steps": 1,
                       "train.eval_every_epoch": True})
    ev, seen = recorded(tmp_path / "bf16", cfg)
    steps = [e for e in ev if e["kind"] == "step"]
    assert [e["step"] for e in steps] == [1, 2, 3] and all(math.isfinite(e["loss"]) for e in steps)
    end = next(e for e in ev if e["kind"] == "epoch_end")
    assert end.get("partial") is True and 0 <= end["val_acc"] <= 1  # max_steps ended it mid-epoch
    assert final_model(tmp_path / "bf16")["model"]["0.weight"].dtype == torch.float32  # weights stay fp32
    train = [s for s in seen if s["training"]]
    assert len(train) == 3 and len(seen) > 3, "three training forwards and the eval pass"
    for s in seen:
        assert s["autocast"] and s["first_layer_dtype"] == s["output_dtype"] == torch.bfloat16, s
        assert s["input_dtype"] == torch.float32 and s["input_channels_last"] and s["weights_channels_last"], s

    plain = {**cfg, "train": {**cfg["train"], "precision": "32-true", "channels_last": False}}
    _, seen = recorded(tmp_path / "fp32", plain)
    assert seen and all(not s["autocast"] and s["output_dtype"] == torch.float32 and not s["input_channels_last"]
                        and not s["weights_channels_last"] for s in seen)


def test_batch_fetch_gives_the_same_batches():
    """In-memory data sets are fetched a whole batch per gather (on the host, in loader workers, or
    with data.on_device on the device): the batches equal the item-by-item default loader's."""
    from torch.utils.data import DataLoader, TensorDataset

    from torchdeck.engine.data import BatchTensors, keep_batch

    ds = TensorDataset(torch.randn(50, 3, 4, 4), torch.arange(50))
    sampler = list(torch.randperm(50, generator=torch.Generator().manual_seed(0)))
    plain = list(DataLoader(ds, batch_size=8, sampler=sampler, drop_last=True))
    assert len(plain) == 6
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    for wrapped, workers in ((BatchTensors(ds), 0), (BatchTensors(ds), 2), (BatchTensors(ds, torch.device(dev)), 0)):
        fast = list(DataLoader(wrapped, batch_size=8, sampler=sampler, drop_last=True, collate_fn=keep_batch,
                               num_workers=workers))
        assert len(fast) == len(plain)
        for (x, y), (fx, fy) in zip(plain, fast):
            assert fx.device.type == wrapped.tensors[0].device.type
            assert torch.equal(x, fx.cpu()) and torch.equal(y, fy.cpu())
