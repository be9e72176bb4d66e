"""What one GPU (a single H100, say) can prove, run for real on it; skipped cleanly without CUDA.

One GPU cannot show DataParallel's replicate and gather, model-parallel moving activations between
GPUs, DDP over NCCL between two GPUs, or `dp` through the supervisor: those need two GPUs and skip
below that (here and in test_equivalence / test_strategies_gpu). What one GPU can show:
- the engine's own step on cuda: fp16 autocast with GradScaler steps, bf16 autocast, channels-last
  batches and weights, and data.on_device batches coming out of the loader on the GPU;
- NVML readings tied to this run: the rank's pid on its GPU while it trains, gone once it ends;
- DDP and ZeRO with 2 ranks sharing cuda:0 over gloo (NCCL refuses two ranks on one GPU),
  through the engine's Trainer, ending where one process with the doubled batch ends (not FSDP:
  gloo crashes gathering its CUDA shards, so validation refuses fsdp over gloo on GPUs);
- a one-rank NCCL group through the engine's worker, DDP and FSDP: init, the wrap over NCCL,
  reports, the checkpoint, teardown.

Run on a CUDA machine: `python -m pytest -m gpu tests/engine/test_gpu_one_host.py`.
Everything is imported at module level, so a refactor that moves a name breaks collection on
CPU hosts too, not only here.
"""
from __future__ import annotations

import math
import os
import socket
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from torchdeck.app.sources.nvml import GPUSource, pid_namespace_warning
from torchdeck.engine import config as cfgmod
from torchdeck.engine import events
from torchdeck.engine.runs import control as launch
from torchdeck.engine.strategies import get_strategy, world_size
from torchdeck.engine.strategies.base import RankContext
from torchdeck.engine.train import Trainer
from torchdeck.engine.worker import FileReporter, RankJob, seed_everything, train_rank
from tests.engine import probes
from tests.engine.helpers import assert_same_weights, final_model, run_in_process, run_supervised, small_cfg

pytestmark = [pytest.mark.gpu, pytest.mark.slow,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

RECORDING_MLP = {"name": "tests.engine.probes:recording", "kwargs": {"base": "mlp", "hidden": 32}}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ----------------------------------------------------------------------------- the step on cuda


@pytest.mark.parametrize("precision,on_device", [("16-mixed", True), ("bf16-mixed", False)])
def test_cuda_step_autocasts_scales_and_keeps_data_on_device(tmp_path, precision, on_device):
    """The engine's Trainer on cuda:0, one epoch of 8 steps and its eval, as a rank runs it."""
    cfg = cfgmod.from_dict(small_cfg(strategy="gpu", accelerator="cuda", devices=[0], **{
        "model.name": "tests.engine.probes:recording", "data.image_size": 32, "train.precision": precision,
        "train.grad_clip": 1.0, "train.channels_last": True, "train.max_steps": 8, "train.log_every_n_steps": 1,
        "train.eval_every_epoch": True, "data.on_device": on_device}))
    dev = torch.device("cuda:0")
    torch.cuda.set_device(dev)
    seed_everything(cfg.train.seed)
    probes.SEEN.clear()
    trainer = Trainer(cfg, get_strategy("gpu"), RankContext(0, 0, 1, 1, 0, dev, cfg), tmp_path,
                      lambda kind, **fields: None)
    x, y = next(iter(trainer.loader))
    assert x.device.type == y.device.type == ("cuda" if on_device else "cpu"), "data.on_device: where batches are"
    before = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
    assert trainer.fit().step == 8

    want = {"16-mixed": torch.float16, "bf16-mixed": torch.bfloat16}[precision]
    assert sum(s["training"] for s in probes.SEEN) == 8 and len(probes.SEEN) > 8, "8 steps and the eval"
    for s in probes.SEEN:
        assert s["device"] == "cuda" and s["autocast"] and s["input_dtype"] == torch.float32, s
        assert s["first_layer_dtype"] == s["output_dtype"] == want, s
        assert s["input_channels_last"] and s["weights_channels_last"], s
    after = trainer.model.state_dict()
    assert all(v.dtype == before[k].dtype and torch.isfinite(v).all() for k, v in after.items())
    assert any(not torch.equal(before[k], after[k]) for k in before), "the weights moved"
    if precision == "bf16-mixed":
        assert trainer.precision.scaler is None
        return
    # GradScaler: every step went through scale -> unscale_ (clipping) -> step -> update. update()
    # counts finite steps since the last overflow; an overflow halves the scale from 2**16.
    state = trainer.precision.state_dict()
    backoffs = math.log2(65536.0 / state["scale"])
    assert backoffs == int(backoffs) and 0 <= backoffs <= 4, state
    assert state["_growth_tracker"] >= 4 and state["_growth_tracker"] + backoffs <= 8, state


# ----------------------------------------------------------------------------- NVML and this run


def test_nvml_lists_this_runs_rank_on_its_gpu_while_it_trains(tmp_path):
    """The Monitor ties GPU processes to ranks by pid: NVML must list the rank's pid on GPU 0 (and
    only there) while it trains, with memory in use, and drop it once the run has stopped."""
    if os.environ.get("CUDA_VISIBLE_DEVICES") not in (None, "", "0"):
        pytest.skip("CUDA_VISIBLE_DEVICES renumbers cuda:0 away from NVML's GPU 0")
    cfg = cfgmod.from_dict(small_cfg(strategy="gpu", accelerator="cuda", devices=[0], **{
        "model.name": "cnn", "data.image_size": 32, "train.max_steps": 0, "train.epochs": 1000}))
    run = launch.start(cfg, root=tmp_path / "runs")
    src = GPUSource()
    try:
        deadline = time.monotonic() + 120
        while not any(e["kind"] == "step" for e in events.read_all(run.events_path)):
            assert time.monotonic() < deadline and run.final_status() is None, events.read_all(run.events_path)[-3:]
            time.sleep(0.2)
        pid = next(e["pid"] for e in events.read_all(run.events_path) if e["kind"] == "rank_ready")
        assert src.status() == (True, "")
        deadline = time.monotonic() + 20  # NVML may list a new context a moment late
        while True:
            samples = src.sample()
            on = [s.index for s in samples if pid in s.pids]
            if on or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        warn = pid_namespace_warning(samples)
        if not on and warn:
            pytest.skip(warn)
        assert on == [0], f"rank pid {pid} on GPUs {on}; NVML lists {[(s.index, s.pids) for s in samples]}"
        gpu0 = next(s for s in samples if s.index == 0)
        assert gpu0.mem_used_mb and gpu0.mem_used_mb > 0 and gpu0.util is not None
    finally:
        launch.request_stop(run)
        final = launch.wait(run, timeout=120)
    assert final is not None and final["status"] == "stopped", final
    deadline = time.monotonic() + 20
    while any(pid in s.pids for s in src.sample()):
        assert time.monotonic() < deadline, "the ended rank is still listed on its GPU"
        time.sleep(0.5)
    src.close()


# ----------------------------------------------------------------------------- 2 ranks on cuda:0


SHARED = ("ddp", "zero")  # not fsdp: over gloo it crashes on CUDA (validation refuses it; test_config)


def shared_cfg(strategy: str, out: str) -> cfgmod.RunConfig:
    """Two GPUs' config (valid), whose ranks the test places both on cuda:0."""
    return cfgmod.from_dict(small_cfg(strategy=strategy, accelerator="cuda", devices=[0, 1], backend="gloo", **{
        "model": RECORDING_MLP, "train.batch_size": 8, "train.grad_accum": 2, "train.max_steps": 4,
        "train.tf32": False, "checkpoint.dir": f"{out}/{strategy}/checkpoints"}))


def shared_gpu_rank(rank: int, port: int, out: str) -> None:
    """One of 2 ranks on cuda:0 over gloo: the engine's Trainer for each strategy in turn."""
    torch.cuda.set_device(0)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        for name in SHARED:
            cfg = shared_cfg(name, out)
            seed_everything(cfg.train.seed)
            probes.SEEN.clear()
            ctx = RankContext(rank, rank, 2, 2, 0, torch.device("cuda:0"), cfg)
            Trainer(cfg, get_strategy(name), ctx, Path(out), lambda kind, **fields: None).fit()
            if rank == 0:
                torch.save(probes.SEEN, Path(out) / f"{name}-seen.pt")
    finally:
        dist.destroy_process_group()


def test_ddp_and_zero_with_two_ranks_sharing_one_gpu_equal_one_process(tmp_path):
    """2 ranks x batch 8 x accumulation 2 on cuda:0 end where one process with batch 16 does."""
    out = tmp_path / "shared"
    mp.spawn(shared_gpu_rank, args=(free_port(), str(out)), nprocs=2, join=True)
    one = small_cfg(strategy="gpu", accelerator="cuda", devices=[0], **{
        "model.name": "mlp", "model.hidden": 32, "train.batch_size": 16, "train.grad_accum": 2,
        "train.max_steps": 4, "train.tf32": False})
    run_in_process(tmp_path / "one", one)
    ref = final_model(tmp_path / "one")
    assert ref["step"] == 4
    for name in SHARED:
        got = final_model(out / name)
        assert got["step"] == 4 and got["world_size"] == 2, name
        assert_same_weights(got["model"], ref["model"], atol=1e-4)
        seen = torch.load(out / f"{name}-seen.pt", weights_only=False)
        assert len(seen) == 4 * 2 and all(s["device"] == "cuda" and s["backend"] == "gloo" for s in seen), name
    assert_trained_from(ref["model"], tmp_path)


def assert_trained_from(state: dict, tmp_path: Path) -> None:
    """Guard against vacuous equality: 4 steps moved the weights."""
    init = small_cfg(strategy="gpu", accelerator="cuda", devices=[0], **{
        "model.name": "mlp", "model.hidden": 32, "train.max_steps": 1, "optimizer.lr": 1e-12})
    run_in_process(tmp_path / "init", init)
    start = final_model(tmp_path / "init")["model"]
    assert max((state[k].float() - start[k].float()).abs().max().item() for k in state) > 1e-3


# ----------------------------------------------------------------------------- a one-rank NCCL group


def nccl_rank(_, cfg: cfgmod.RunConfig, run_dir: str, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    probes.SEEN.clear()
    train_rank(RankJob(cfg, Path(run_dir), 0, 0, 1), FileReporter(Path(run_dir) / "events.jsonl", 0))
    torch.save(probes.SEEN, Path(run_dir) / "seen.pt")


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_one_rank_nccl_group_trains_like_plain_gpu_training(tmp_path, strategy):
    """Validation refuses DDP/FSDP with one process (it is plain training), so the config is changed
    to one GPU after it: the mechanics are the engine's own (init_process_group over NCCL, DDP with
    device_ids or fully_shard on a cuda mesh, the rank reports and stop agreement as NCCL collectives,
    the checkpoint (FSDP's gathered from DTensor shards) and its barrier, destroy_process_group), and
    the weights equal the gpu strategy's."""
    cfg = cfgmod.from_dict(small_cfg(strategy=strategy, accelerator="cuda", devices=[0, 1], **{
        "model": RECORDING_MLP, "train.batch_size": 32, "train.max_steps": 4, "train.log_every_n_steps": 1,
        "train.tf32": False}))
    cfg.devices = [0]
    assert (world_size(cfg), cfg.resolved_backend) == (1, "nccl")
    run_dir = tmp_path / strategy
    run_dir.mkdir()
    mp.spawn(nccl_rank, args=(cfg, str(run_dir), free_port()), nprocs=1, join=True)
    evs = events.read_all(run_dir / "events.jsonl")
    assert next(e for e in evs if e["kind"] == "rank_ready")["device"] == "cuda:0"
    assert [e["step"] for e in evs if e["kind"] == "step"] == [1, 2, 3, 4]
    assert any(e["kind"] == "rank_report" for e in evs), "the all-gathered report ran over NCCL"
    seen = torch.load(run_dir / "seen.pt", weights_only=False)
    assert len(seen) == 4 and all(s["backend"] == "nccl" and s["device"] == "cuda" for s in seen)
    plain = small_cfg(strategy="gpu", accelerator="cuda", devices=[0], **{
        "model.name": "mlp", "model.hidden": 32, "train.batch_size": 32, "train.max_steps": 4, "train.tf32": False})
    run_in_process(tmp_path / "plain", plain)
    assert_same_weights(final_model(run_dir)["model"], final_model(tmp_path / "plain")["model"], atol=1e-5)


# ----------------------------------------------------------------------------- two GPUs only


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="dp needs 2 GPUs (validation refuses one)")
def test_dp_through_the_supervisor_equals_one_gpu(tmp_path):
    """DataParallel splits each batch over GPUs 0 and 1 and sums the gradients back on GPU 0."""
    over = {"model.name": "mlp", "model.hidden": 32, "train.batch_size": 32, "train.max_steps": 4, "train.tf32": False}
    for name, strategy, devices in (("dp", "dp", [0, 1]), ("one", "gpu", [0])):
        proc = run_supervised(tmp_path / name, small_cfg(strategy=strategy, accelerator="cuda", devices=devices, **over))
        assert proc.returncode == 0, proc.stdout + proc.stderr
    dp = final_model(tmp_path / "dp")
    assert dp["config"]["strategy"] == "dp" and dp["step"] == 4
    assert_same_weights(dp["model"], final_model(tmp_path / "one")["model"], atol=1e-4)
