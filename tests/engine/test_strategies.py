"""dp, model-parallel, fsdp and zero: equivalence with plain training, checkpoints, refusals.

Distributed cases are real: 2 gloo ranks spawned with torch.multiprocessing, as a user's run.
One spawn runs every DDP/ZeRO/FSDP scenario (spawning costs far more than the few steps).
"""
from __future__ import annotations

import copy
import socket
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from torchdeck.engine.config import ConfigError
from torchdeck.engine.hardware import Hardware
from torchdeck.engine.preflight import from_dict
from torchdeck.engine.data import DataInfo
from torchdeck.engine.models import ModelError, cnn, mlp
from torchdeck.engine.strategies import get_strategy
from torchdeck.engine.strategies._pipeline import Pipeline, balance
from torchdeck.engine.strategies.base import RankContext

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
    from torchdeck.engine.models import resnet18

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
    from torchdeck.engine.strategies.zero import _optimizer_recipe

    model = nn.Linear(3, 2)
    cls, kw = _optimizer_recipe(lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.1), model)
    assert cls is torch.optim.AdamW and kw["lr"] == 0.01 and kw["weight_decay"] == 0.1
    cls(model.parameters(), **kw)

    def fn(ps):
        return torch.optim.SGD(ps, lr=0.3)
    fn.optimizer_class, fn.optimizer_kwargs = torch.optim.SGD, {"lr": 0.3, "momentum": 0.5}
    assert _optimizer_recipe(fn, model) == (torch.optim.SGD, {"lr": 0.3, "momentum": 0.5})


# ----------------------------------------------------------------------------- 2 gloo ranks


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_ctx(strategy: str, rank: int):
    cfg = from_dict({"strategy": strategy, "devices": WORLD, "backend": "gloo",
                     "train": {"batch_size": B, "grad_accum": ACCUM}})
    return get_strategy(strategy), RankContext(rank, rank, WORLD, WORLD, 0, torch.device("cpu"), cfg)


def train_steps(strategy, model, opt, rank: int, data):
    """The loop's contract: no_sync on the first k-1 micro-steps, loss / k, one optimizer step.
    (That the engine's own loop keeps it is checked on its Trainer: engine_accumulation.)"""
    import contextlib

    for x, y in data:
        xs, ys = x.chunk(WORLD * ACCUM), y.chunk(WORLD * ACCUM)
        for j in range(ACCUM):
            mine = rank * ACCUM + j  # this rank's j-th micro-batch of the global batch
            sync = strategy.no_sync(model) if j < ACCUM - 1 else contextlib.nullcontext()
            with sync:
                (F.cross_entropy(model(xs[mine]), ys[mine]) / ACCUM).backward()
        opt.step()
        opt.zero_grad()


def build(name: str, rank: int, make_opt):
    strategy, ctx = rank_ctx(name, rank)
    torch.manual_seed(0)
    model = strategy.wrap(cnn(INFO), ctx)
    return strategy, ctx, model, strategy.make_optimizer(make_opt, model)


def scenario(name: str, opt_name: str, rank: int, out: Path, tag: str):
    """Train STEPS, checkpoint through the strategy, restore into a fresh wrapped model, train one
    more step on both: rank 0 records the weights after STEPS, and after STEPS+1 both ways."""
    import torch.distributed as dist

    make_opt = {"sgd": sgd, "adam": adam}[opt_name]
    data = batches(STEPS + 1, WORLD * ACCUM * B)
    strategy, ctx, model, opt = build(name, rank, make_opt)
    train_steps(strategy, model, opt, rank, data[:STEPS])
    model_state = strategy.model_state(model, ctx)
    optim_state = strategy.optim_state(opt, model, ctx)
    ckpt = out / f"{tag}{name}-{opt_name}.pt"
    if rank == 0:
        torch.save({"model": model_state, "optimizer": optim_state}, ckpt)
    dist.barrier()
    saved = torch.load(ckpt, weights_only=True)  # every rank loads the file, as a resume does

    _, _, model2, opt2 = build(name, rank, make_opt)
    strategy.load_model_state(model2, saved["model"], ctx)
    strategy.load_optim_state(opt2, model2, saved["optimizer"], ctx)
    train_steps(strategy, model, opt, rank, data[STEPS:])
    train_steps(strategy, model2, opt2, rank, data[STEPS:])
    cont, resumed = strategy.model_state(model, ctx), strategy.model_state(model2, ctx)
    local_optim = sum(t.numel() for s in opt.optim.state_dict()["state"].values()
                      for t in s.values() if torch.is_tensor(t) and t.dim() > 0) if name == "zero" else None
    if rank == 0:
        torch.save({"after": saved["model"], "continued": cont, "resumed": resumed,
                    "optimizer": saved["optimizer"], "local_optim": local_optim},
                   ckpt)


ENGINE_ACCUM = 3


def engine_accumulation(rank: int, out: Path, tag: str):
    """The engine's own Trainer.fit under DDP with grad_accum 3 (12 micro-batches a rank, 4 steps):
    the engine's comm hook counts the all-reduce rounds; the last bucket of each marks one."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    from torchdeck.engine.train import Trainer

    cfg = from_dict({"strategy": "ddp", "devices": WORLD, "backend": "gloo", "model": {"name": "mlp", "hidden": 32},
                     "data": {"train_size": 96, "val_size": 0, "image_size": 8},
                     "train": {"batch_size": 4, "grad_accum": ENGINE_ACCUM, "epochs": 1, "eval_every_epoch": False},
                     "checkpoint": {"every_epoch": False}})
    ctx = RankContext(rank, rank, WORLD, WORLD, 0, torch.device("cpu"), cfg)
    torch.manual_seed(0)
    trainer = Trainer(cfg, get_strategy("ddp"), ctx, out / f"{tag}engine-accum", lambda kind, **fields: None)
    rounds, buckets, forwards = [0], [0], [0]

    def counting(state, bucket):
        buckets[0] += 1
        rounds[0] += bucket.is_last()
        return allreduce_hook(state, bucket)
    # DDP takes one comm hook and the engine's CommClock (time in the all-reduce) is it: count
    # inside it, where it starts the all-reduce
    assert trainer.comm is not None, "CPU DDP times its all-reduce through a comm hook"
    trainer.comm._allreduce = counting
    trainer.model.module.register_forward_pre_hook(lambda mod, args: forwards.__setitem__(0, forwards[0] + 1))
    pos = trainer.fit()
    if rank == 0:
        torch.save({"steps": pos.step, "micro": forwards[0], "rounds": rounds[0], "buckets": buckets[0]},
                   out / f"{tag}engine-accum.pt")


def reshard_check(rank: int, out: Path, tag: str):
    """Between forward and backward, a block's parameters are sharded DTensors again only when
    fsdp.reshard_after_forward is on (off: they stay gathered, trading memory for a second all-gather)."""
    kinds = {}
    for reshard in (True, False):
        cfg = from_dict({"strategy": "fsdp", "devices": WORLD, "fsdp": {"reshard_after_forward": reshard}})
        ctx = RankContext(rank, rank, WORLD, WORLD, 0, torch.device("cpu"), cfg)
        torch.manual_seed(0)
        model = get_strategy("fsdp").wrap(cnn(INFO), ctx)
        out_ = model(torch.randn(2, 3, 16, 16))
        kinds[reshard] = [type(p).__name__ for p in model[7].parameters()]
        out_.sum().backward()
    if rank == 0:
        torch.save(kinds, out / f"{tag}reshard-check.pt")


SCENARIOS = [("ddp", "sgd"), ("zero", "sgd"), ("zero", "adam"), ("fsdp", "sgd"), ("fsdp", "adam")]


def rank_entry(rank: int, phases, out: str):
    """Each phase: a fresh process group over its init method, then its scenarios."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    for tag, init_method, scenarios in phases:
        dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=WORLD)
        try:
            for name, opt_name in scenarios:
                if name == "reshard":
                    reshard_check(rank, Path(out), tag)
                elif name == "engine":
                    engine_accumulation(rank, Path(out), tag)
                else:
                    scenario(name, opt_name, rank, Path(out), tag)
        finally:
            dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """Every scenario in one spawn of 2 gloo ranks (spawning costs far more than the steps):
    first meeting over tcp://, then again over file:// (no MASTER_ADDR/PORT at all)."""
    import torch.multiprocessing as mp

    out = tmp_path_factory.mktemp("ranks")
    phases = [("", f"tcp://127.0.0.1:{free_port()}", SCENARIOS + [("reshard", "check"), ("engine", "accum")]),
              ("file-", f"file://{out / 'rendezvous'}", [("ddp", "sgd")])]
    mp.spawn(rank_entry, args=(phases, str(out)), nprocs=WORLD, join=True)
    return {f"{tag}{n}-{o}": torch.load(out / f"{tag}{n}-{o}.pt", weights_only=True)
            for tag, _, scenarios in phases for n, o in scenarios}


@pytest.mark.slow
@pytest.mark.parametrize("name,opt_name", SCENARIOS)
def test_two_ranks_equal_one_process_with_the_whole_batch(two_ranks, name, opt_name):
    """DDP, ZeRO and FSDP (2 ranks x B, accumulating 2 micro-steps) end where one process with the
    4B batch does; so ZeRO and FSDP equal DDP. The checkpoint is a plain state_dict."""
    r = two_ranks[f"{name}-{opt_name}"]
    make_opt = {"sgd": sgd, "adam": adam}[opt_name]
    assert_same(r["after"], reference(make_opt, STEPS))
    assert_same(r["continued"], reference(make_opt, STEPS + 1))
    torch.manual_seed(0)
    init = cnn(INFO).state_dict()  # guard against vacuous equality: the weights really moved
    assert max((r["after"][k] - init[k]).abs().max() for k in init) > 1e-3
    plain = cnn(INFO)
    plain.load_state_dict(r["after"])  # loads without the strategy, same keys


@pytest.mark.slow
@pytest.mark.parametrize("name,opt_name", SCENARIOS)
def test_resume_from_strategy_checkpoint_equals_continuing(two_ranks, name, opt_name):
    r = two_ranks[f"{name}-{opt_name}"]
    assert_same(r["resumed"], r["continued"], atol=1e-6)


@pytest.mark.slow
def test_ddp_accumulation_micro_steps_do_not_communicate(two_ranks):
    """In the engine's own loop, 2 gloo ranks: one all-reduce round per optimizer step, none for the
    micro-steps before it (equal weights cannot show this: a round per micro-step averages the same)."""
    r = two_ranks["engine-accum"]
    assert r["steps"] == 4 and r["micro"] == 4 * ENGINE_ACCUM, r
    assert r["rounds"] == r["steps"], f"{r['rounds']} all-reduce rounds for {r['steps']} steps of {ENGINE_ACCUM} micro-steps"
    assert r["buckets"] >= r["rounds"]


@pytest.mark.slow
def test_zero_shards_optimizer_state_and_consolidates_it(two_ranks):
    """Rank 0 holds Adam state for only part of the parameters, yet saves all of it."""
    r = two_ranks["zero-adam"]
    total = sum(p.numel() for p in cnn(INFO).parameters())
    saved = r["optimizer"]["state"]
    assert len(saved) == len(list(cnn(INFO).parameters()))
    assert sum(s["exp_avg"].numel() for s in saved.values()) == total
    assert 0 < r["local_optim"] < 2 * total  # exp_avg + exp_avg_sq for a shard, not for all


@pytest.mark.slow
def test_fsdp_optimizer_state_is_full_and_named(two_ranks):
    saved = two_ranks["fsdp-adam"]["optimizer"]["state"]
    plain = dict(cnn(INFO).named_parameters())
    assert set(saved) == set(plain)
    for k, s in saved.items():
        assert s["exp_avg"].shape == plain[k].shape


@pytest.mark.slow
def test_fsdp_reshard_after_forward_is_honoured(two_ranks):
    kinds = two_ranks["reshard-check"]
    assert kinds[True] == ["DTensor", "DTensor"]
    assert kinds[False] == ["Parameter", "Parameter"]


@pytest.mark.slow
def test_file_init_method_trains_ddp(two_ranks):
    """init_method file:// brings the 2 gloo ranks together as tcp:// did, with the same result."""
    assert_same(two_ranks["file-ddp-sgd"]["after"], reference(sgd, STEPS))


@pytest.mark.skipif(not torch.distributed.is_mpi_available(), reason="this PyTorch build has no MPI backend")
def test_mpi_backend_is_available_when_torch_says_so():
    from torchdeck.engine.hardware import detect_hardware

    cfg = from_dict({"strategy": "ddp", "devices": 2, "backend": "mpi"}, hw=detect_hardware())
    assert cfg.backend == "mpi"


@pytest.mark.skipif(torch.distributed.is_mpi_available(), reason="this PyTorch build has MPI")
def test_mpi_backend_refused_where_torch_has_none():
    """Through the real detector, as `torchdeck validate` and the form see this host."""
    from torchdeck.engine.hardware import detect_hardware

    with pytest.raises(ConfigError) as e:
        from_dict({"strategy": "ddp", "devices": 2, "backend": "mpi"}, hw=detect_hardware())
    assert "MPI" in e.value.by_field()["backend"]


# ----------------------------------------------------------------------------- shipped presets, headless

ROOT = Path(__file__).resolve().parents[2]
# Small and identical work for each preset: 4 SGD steps of 32 samples in all (2 ranks x 16, or one
# process x 32), so the three runs must end on the same weights.
SMALL = ["data.train_size=256", "data.val_size=64", "train.epochs=1", "train.max_steps=4",
         "optimizer.name=sgd", "optimizer.lr=0.05", "optimizer.momentum=0.9", "optimizer.weight_decay=0.0",
         "train.log_every_n_steps=2", "train.threads_per_rank=1", "nodes.master_port=0"]


def cli_run(preset: str, runs: Path, extra: list[str], timeout=240):
    import subprocess
    import sys

    args = [sys.executable, "-m", "torchdeck.cli", "run", preset, "--runs-dir", str(runs)]
    for item in extra:
        args += ["--set", item]
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_shipped_presets_run_headless_and_agree(tmp_path):
    """model-parallel (2 CPU stages, 4 micro-batches), fsdp and zero (2 gloo ranks each) run to the
    end through `torchdeck run`, and their checkpoints load into the plain model with equal weights.
    All with train.channels_last (the GPU presets' setting), which fsdp's fully_shard refused
    ("non-contiguous parameters") until fsdp kept its weights in plain layout."""
    from torchdeck.engine import checkpoint as ckpt

    weights = {}
    for preset, batch in [("model-parallel", 32), ("fsdp", 16), ("zero", 16)]:
        runs = tmp_path / preset
        proc = cli_run(preset, runs, SMALL + [f"train.batch_size={batch}", "train.channels_last=true"])
        assert proc.returncode == 0, f"{preset}: exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        (run_dir,) = list(runs.iterdir())
        _, state = ckpt.latest(run_dir / "checkpoints")
        assert state["step"] == 4 and state["config"]["strategy"] == preset
        assert state["config"]["train"]["channels_last"] is True
        plain = cnn(DataInfo(3, 10, 32, "synthetic"))
        plain.load_state_dict(state["model"])  # full, plain keys: loads without the strategy
        weights[preset] = state["model"]
    assert_same(weights["fsdp"], weights["model-parallel"])
    assert_same(weights["zero"], weights["model-parallel"])


def test_dp_preset_refuses_here_naming_the_missing_gpu(tmp_path):
    """The dp preset lists GPUs 0 and 1: with none here accelerator cuda is refused, with one GPU 1 is."""
    from torchdeck.engine.hardware import detect_hardware

    gpus = detect_hardware().gpu_count
    if gpus >= 2:
        pytest.skip("this host has 2 GPUs: dp would run")
    proc = cli_run("dp", tmp_path / "runs", [], timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    if gpus == 0:
        assert "accelerator: cuda needs an NVIDIA GPU" in proc.stderr, proc.stderr
    else:
        assert "devices: GPU 1 does not exist: this host has GPUs 0-0" in proc.stderr, proc.stderr
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())  # nothing started
