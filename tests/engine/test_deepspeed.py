"""strategy deepspeed: the ds_config it generates and merges, and real 2-rank DeepSpeed runs over gloo.

The config half needs no deepspeed. The runs need the extra (`pip install 'torchdeck[deepspeed]'`,
which `make test` installs): they skip, saying so, only where it is missing. As for the other
strategies, one spawn of 2 ranks runs every in-process scenario through the engine's own Trainer
(spawning and DeepSpeed's first initialize cost far more than the steps); whole runs go through
the supervisor and the CLI as a user's do.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from torchdeck.engine import checkpoint as ckpt
from torchdeck.engine import config as cfgmod
from torchdeck.engine import preflight
from torchdeck.engine import events
from torchdeck.engine.strategies import deepspeed as ds

ROOT = Path(__file__).resolve().parents[2]
needs_deepspeed = pytest.mark.skipif(not ds.installed(), reason=f"deepspeed {ds.INSTALL_HINT}")


def cfg_dict(strategy="deepspeed", **over) -> dict:
    """Tiny: an mlp on 8x8 synthetic images, 2 CPU ranks x batch 8 x accumulation 2, 4 SGD steps."""
    d = {"name": "ds", "strategy": strategy, "accelerator": "cpu", "devices": 2, "backend": "gloo",
         "model": {"name": "mlp", "hidden": 32},
         "data": {"train_size": 256, "val_size": 64, "image_size": 8},
         "optimizer": {"name": "sgd", "lr": 0.1, "momentum": 0.9},
         "train": {"batch_size": 8, "grad_accum": 2, "epochs": 1, "max_steps": 4, "eval_every_epoch": False,
                   "log_every_n_steps": 1, "threads_per_rank": 1},
         "checkpoint": {"every_epoch": False, "keep_last": 20},
         "nodes": {"master_port": 0}}
    for key, value in over.items():
        node = d
        parts = key.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    return d


# ----------------------------------------------------------------------------- the generated ds_config


def test_generated_config_maps_the_run_config():
    cfg = cfgmod.from_dict(cfg_dict(**{"train.precision": "bf16-mixed", "train.grad_clip": 1.5,
                                       "optimizer.name": "adam", "optimizer.weight_decay": 0.01,
                                       "deepspeed.stage": 3, "deepspeed.offload_optimizer": "cpu",
                                       "deepspeed.offload_param": "cpu", "deepspeed.overlap_comm": False}))
    g = ds.generate(cfg)
    assert (g["train_micro_batch_size_per_gpu"], g["gradient_accumulation_steps"], g["train_batch_size"]) == (8, 2, 32)
    assert g["gradient_clipping"] == 1.5 and g["bf16"] == {"enabled": True} and g["fp16"] == {"enabled": False}
    assert g["data_types"] == {"buffer_dtype": "bf16"}  # BatchNorm's statistics with its bf16 weights
    assert g["optimizer"] == {"type": "Adam", "params": {"lr": 0.1, "weight_decay": 0.01, "betas": [0.9, 0.999],
                                                         "torch_adam": True, "adam_w_mode": False}}
    z = g["zero_optimization"]
    assert z["stage"] == 3 and z["overlap_comm"] is False and z["contiguous_gradients"] is True
    assert z["offload_optimizer"]["device"] == z["offload_param"]["device"] == "cpu"
    assert "scheduler" not in g  # torchdeck's own schedule goes in as a client scheduler
    plain = ds.generate(cfgmod.from_dict(cfg_dict()))
    assert not plain["bf16"]["enabled"] and plain["gradient_clipping"] == 0 and "data_types" not in plain
    assert "offload_optimizer" not in plain["zero_optimization"]
    assert plain["optimizer"] == {"type": "SGD", "params": {"lr": 0.1, "weight_decay": 0.0, "momentum": 0.9,
                                                            "nesterov": False}}


def write_json(path: Path, data) -> str:
    path.write_text(json.dumps(data) if not isinstance(data, str) else data)
    return str(path)


def test_user_config_wins_and_every_conflict_is_named(tmp_path):
    user = write_json(tmp_path / "mine.json", {
        "train_micro_batch_size_per_gpu": 4, "gradient_clipping": 2.0, "bf16": {"enabled": True},
        "optimizer": {"params": {"lr": 0.01}}, "zero_optimization": {"stage": 1, "reduce_bucket_size": 1000},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 2}}})
    cfg = cfgmod.from_dict(cfg_dict(**{"deepspeed.config": user, "scheduler.name": "cosine"}))
    r = ds.resolve(cfg)
    m = r.ds_config
    assert (m["train_micro_batch_size_per_gpu"], m["gradient_accumulation_steps"], m["train_batch_size"]) == (4, 2, 16)
    assert m["zero_optimization"] == {"stage": 1, "overlap_comm": True, "contiguous_gradients": True,
                                      "reduce_bucket_size": 1000}
    assert m["optimizer"]["params"]["lr"] == 0.01 and m["optimizer"]["params"]["momentum"] == 0.9
    assert m["data_types"] == {"buffer_dtype": "bf16"}  # follows the file's bf16, not the form's fp32
    notes = "\n".join(line for _, line in r.notes())
    for said in ("train_micro_batch_size_per_gpu = 4 replaces 8 (train.batch_size)",
                 "gradient_clipping = 2.0 replaces 0.0 (train.grad_clip)",
                 "bf16.enabled = true replaces false (train.precision)", "optimizer.params.lr = 0.01 replaces 0.1 (optimizer.lr)",
                 "zero_optimization.stage = 1 replaces 2 (deepspeed.stage)",
                 "its scheduler (WarmupLR) replaces torchdeck's scheduler cosine"):
        assert said in notes, notes
    assert "reduce_bucket_size" not in notes  # an addition, not a conflict
    ds.apply(cfg, r)  # the run then says what DeepSpeed does: the loader's batch follows the file
    assert (cfg.train.batch_size, cfg.train.grad_accum, cfg.train.precision, cfg.train.grad_clip,
            cfg.optimizer.lr) == (4, 2, "bf16-mixed", 2.0, 0.01)
    again = ds.resolve(cfg)  # what the ranks compute from the applied config: the same ds_config
    assert again.ds_config == m


def test_another_optimizer_type_replaces_ours_whole(tmp_path):
    user = write_json(tmp_path / "lamb.json", {"optimizer": {"type": "AdamW", "params": {"lr": 0.001}}})
    r = ds.resolve(cfgmod.from_dict(cfg_dict(**{"deepspeed.config": user})))
    assert r.ds_config["optimizer"] == {"type": "AdamW", "params": {"lr": 0.001}}  # no SGD momentum left in it
    assert ("optimizer.type", "AdamW", "SGD") in r.conflicts


@pytest.mark.parametrize("user,words", [
    ({"train_batch_size": 30}, "train_batch_size 30 must equal"),
    ({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 2},
     "(8 x 2 x 2 = 32)"),
    ({"train_micro_batch_size_per_gpu": 0}, "train_micro_batch_size_per_gpu must be a positive integer"),
    ({"bf16": {"enabled": True}, "fp16": {"enabled": True}}, "bf16 and fp16 are both enabled"),
    ({"fp16": {"enabled": True}}, "fp16 needs CUDA"),
    ({"zero_optimization": {"stage": 4}}, "zero_optimization.stage must be 0, 1, 2 or 3"),
    ({"gradient_clipping": -1}, "gradient_clipping must be 0 or a positive number"),
])
def test_user_values_that_cannot_work_are_refused_naming_the_file(tmp_path, user, words):
    path = write_json(tmp_path / "bad.json", user)
    with pytest.raises(ds.DeepSpeedConfigError) as e:
        ds.resolve(cfgmod.from_dict(cfg_dict(**{"deepspeed.config": path})))
    assert words in str(e.value) and str(tmp_path / "bad.json") in str(e.value)


def test_batch_sizes_from_the_user_file_derive_the_missing_one(tmp_path):
    cfg = cfgmod.from_dict(cfg_dict(**{"deepspeed.config": write_json(tmp_path / "a.json", {"train_batch_size": 64})}))
    m = ds.resolve(cfg).ds_config  # accumulation stays the form's 2: micro 64 / (2 x 2)
    assert (m["train_micro_batch_size_per_gpu"], m["gradient_accumulation_steps"]) == (16, 2)
    cfg = cfgmod.from_dict(cfg_dict(**{"deepspeed.config": write_json(
        tmp_path / "b.json", {"train_batch_size": 48, "train_micro_batch_size_per_gpu": 8})}))
    m = ds.resolve(cfg).ds_config
    assert (m["train_micro_batch_size_per_gpu"], m["gradient_accumulation_steps"]) == (8, 3)


def test_stage_offload_and_compile_rules_name_their_field():
    def problems(**over):
        try:
            preflight.from_dict(cfg_dict(**over))
        except cfgmod.ConfigError as exc:
            return exc.by_field()
        return {}

    assert "offloading parameters needs ZeRO stage 3" in problems(**{"deepspeed.offload_param": "cpu"})["deepspeed.offload_param"]
    assert "stage 1, 2 or 3" in problems(**{"deepspeed.stage": 0, "deepspeed.offload_optimizer": "cpu"})["deepspeed.offload_optimizer"]
    assert "0, 1, 2 or 3" in problems(**{"deepspeed.stage": 5})["deepspeed.stage"]
    assert "must be one of none, cpu" in problems(**{"deepspeed.offload_optimizer": "nvme"})["deepspeed.offload_optimizer"]
    assert "train.compile" in problems(**{"train.compile": True})
    assert problems(devices=1) == {}  # one rank is a use of its own (ZeRO-Offload on one GPU)
    assert problems(**{"deepspeed.stage": 3, "deepspeed.offload_param": "cpu", "deepspeed.offload_optimizer": "cpu"}) == {}


def test_the_checkpoint_marker_name_is_one_name():
    assert ds.CHECKPOINT_META == ckpt.META_NAME


# ----------------------------------------------------------------------------- the command line


def _cli(args, capsys) -> tuple[int, str]:
    from torchdeck.cli.main import main

    code = main(args)
    out = capsys.readouterr()
    return code, out.out + out.err


@pytest.mark.parametrize("command", ["run", "validate"])
@pytest.mark.parametrize("content,words", [
    (None, "no such file"),
    ("{\"zero_optimization\": {\"stage\": 2,}}", "not valid JSON at line 1, column 35"),
    ("[1, 2]", "must be a JSON object of settings, got list"),
    ("{\"train_batch_size\": 30}", "train_batch_size 30 must equal"),
], ids=["missing", "broken-json", "not-an-object", "batch-mismatch"])
def test_bad_deepspeed_config_exits_2_naming_it_and_starts_nothing(tmp_path, capsys, monkeypatch, command, content, words):
    monkeypatch.setenv("TORCHDECK_RUNS", str(tmp_path / "runs"))
    path = tmp_path / "ds_config.json"
    if content is not None:
        path.write_text(content)
    preset = tmp_path / "p.yaml"
    preset.write_text(cfgmod.dumps(cfgmod.from_dict(cfg_dict())))
    code, out = _cli([command, str(preset), "--set", f"deepspeed.config={path}"], capsys)
    assert code == 2, out
    assert f"deepspeed.config: {str(path)!r}" in out and words in out, out
    assert len([ln for ln in out.splitlines() if ln.strip()]) == 1, out
    assert not (tmp_path / "runs").exists()


def test_not_installed_is_one_line_naming_the_extra(tmp_path, capsys, monkeypatch):
    """Where deepspeed is missing (sys.modules holding None is how Python marks a module that cannot
    be imported): the config names the strategy field and `torchdeck run` exits 2 with the pip line."""
    monkeypatch.setitem(sys.modules, "deepspeed", None)
    assert not ds.installed()
    with pytest.raises(cfgmod.ConfigError) as e:
        preflight.from_dict(cfg_dict())
    assert e.value.by_field()["strategy"] == "deepspeed: not installed: pip install 'torchdeck[deepspeed]'"
    monkeypatch.setenv("TORCHDECK_RUNS", str(tmp_path / "runs"))
    preset = tmp_path / "p.yaml"
    preset.write_text("strategy: deepspeed\ndevices: 2\n")
    code, out = _cli(["run", str(preset)], capsys)
    assert code == 2 and "strategy: deepspeed: not installed: pip install 'torchdeck[deepspeed]'" in out, out
    assert not (tmp_path / "runs").exists()


@needs_deepspeed
def test_validate_shows_the_ds_config_and_what_the_users_file_replaces(tmp_path, capsys):
    user = write_json(tmp_path / "mine.json", {"train_micro_batch_size_per_gpu": 4})
    preset = tmp_path / "p.yaml"
    preset.write_text(cfgmod.dumps(cfgmod.from_dict(cfg_dict(**{"deepspeed.config": user}))))
    code, out = _cli(["validate", str(preset)], capsys)
    assert code == 0, out
    assert "deepspeed: ZeRO stage 2; ds_config generated with" in out
    assert "train_micro_batch_size_per_gpu = 4 replaces 8 (train.batch_size)" in out


# ----------------------------------------------------------------------------- 2 ranks, one spawn

WORLD = 2
# stage 2 also checkpoints every step keeping 2 (checkpoint files and keep_last; saving changes no weight)
KEEP = {"checkpoint.every_n_steps": 1, "checkpoint.keep_last": 2}
SGD_SCENARIOS = {"ddp": cfg_dict("ddp")} | {f"zero{s}": cfg_dict(**{"deepspeed.stage": s, **(KEEP if s == 2 else {})})
                                            for s in (0, 1, 2, 3)}
ADAM = {"optimizer.name": "adam", "optimizer.lr": 0.01, "scheduler.name": "cosine", "train.grad_clip": 0.05,
        "train.max_steps": 6}
WARM3 = {**ADAM, "scheduler.name": "warmup", "scheduler.warmup_steps": 5, "deepspeed.stage": 3}
CHANNELS_LAST = {"model.name": "tests.engine.probes:pointwise", "train.channels_last": True}
SCENARIOS = {
    **SGD_SCENARIOS,
    "ddp-adam": cfg_dict("ddp", **ADAM),
    "zero2-adam": cfg_dict(**ADAM),
    # stage 3, Adam, a 5-step warmup (it depends on the step only, so the first half may stop at 3):
    # straight to step 6, and to step 3 then resumed (latest) to step 6
    "zero3-straight": cfg_dict(**WARM3),
    "zero3-first": cfg_dict(**{**WARM3, "train.max_steps": 3}),
    "zero3-resumed": cfg_dict(**{**WARM3, "checkpoint.resume": "latest"}),
    "zero2-bf16": cfg_dict(**{"train.precision": "bf16-mixed"}),
    # 3x3 and 1x1 convs with train.channels_last (the GPU presets' setting)
    "ddp-channels-last": cfg_dict("ddp", **CHANNELS_LAST),
    "zero2-channels-last": cfg_dict(**CHANNELS_LAST),
    "zero2-bf16-channels-last": cfg_dict(**CHANNELS_LAST, **{"train.precision": "bf16-mixed"}),  # deepspeed-gpu's
}
RUN_DIR = {"zero3-resumed": "zero3-first"}  # a resume continues in the first half's run directory


def _scenario(name: str, rank: int, out: Path) -> None:
    from torchdeck.engine.strategies import get_strategy
    from torchdeck.engine.strategies.base import RankContext
    from torchdeck.engine.train import Trainer
    from torchdeck.engine.worker import seed_everything

    cfg = cfgmod.from_dict(SCENARIOS[name])
    strategy = get_strategy(cfg.strategy)
    strategy.resolve(cfg)
    run_dir = out / RUN_DIR.get(name, name)
    seed_everything(cfg.train.seed)
    ctx = RankContext(rank, rank, WORLD, WORLD, 0, torch.device("cpu"), cfg)
    seen = []
    trainer = Trainer(cfg, strategy, ctx, run_dir, lambda kind, **f: seen.append((kind, f)))
    trainer.resume()
    pos = trainer.fit()
    if rank == 0:
        report = {"step": pos.step, "events": [k for k, _ in seen], "threads": torch.get_num_threads(),
                  "resumed": [f["message"] for k, f in seen if k == "log" and "resumed" in f.get("message", "")]}
        if cfg.strategy == "deepspeed":
            report["param_dtypes"] = sorted({str(p.dtype) for p in trainer.model.module.parameters()})
            report["ninja"] = shutil.which("ninja")  # the one torch's JIT builds ran in this rank
            report["loaded"] = {m: getattr(sys.modules.get(m), "__doc__", None) == ds._STAND_IN if m in sys.modules
                                else None for m in (*ds._MUON, "torch._inductor.compile_fx")}
            report["lr"] = trainer.scheduler.get_last_lr()
            # DeepSpeed's forward turns an outer CUDA autocast off: the model must take an fp32 batch bare
            info = trainer.info
            x = torch.randn(2, info.in_channels, info.image_size, info.image_size)
            try:
                with torch.no_grad():
                    report["bare_forward"] = str(trainer.model(x).dtype)
            except RuntimeError as exc:
                report["bare_forward"] = str(exc)[:300]
        (out / f"{name}.json").write_text(json.dumps(report))


def _rank_entry(rank: int, port: int, out: str) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(WORLD), LOCAL_WORLD_SIZE=str(WORLD))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        for name in SCENARIOS:
            _scenario(name, rank, Path(out))
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    import torch.multiprocessing as mp

    out = tmp_path_factory.mktemp("ds-ranks")
    (out / "torch_extensions").mkdir()
    with pytest.MonkeyPatch.context() as env:  # what the spawned ranks inherit: test_two_ranks_build_no_op
        env.setenv("TORCH_EXTENSIONS_DIR", str(out / "torch_extensions"))
        env.setenv("CXX", "/bin/false")
        mp.spawn(_rank_entry, args=(_free_port(), str(out)), nprocs=WORLD, join=True)
    return out


def weights(out: Path, name: str) -> dict:
    """The final full weights: DDP's checkpoint file, or a DeepSpeed directory read the way eval reads it."""
    from torchdeck.engine.evaluate import _deepspeed_state

    directory = out / RUN_DIR.get(name, name) / "checkpoints"
    if name.startswith("ddp"):
        return ckpt.latest(directory)[1]["model"]
    path, _ = ckpt.latest(directory, dirs=True)
    return _deepspeed_state(path)["model"]


def assert_same(a: dict, b: dict, atol=1e-6):
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k].float(), b[k].float(), atol=atol, rtol=0, msg=k)


@needs_deepspeed
@pytest.mark.slow
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_zero_stages_equal_ddp(ranks, stage):
    """Same seed, data order (DistributedSampler) and global batch (2 ranks x 8 x accumulation 2),
    SGD with momentum: every ZeRO stage ends on DDP's weights (here to the last bit: the same sums
    in the same order), and the weights did move."""
    ref = weights(ranks, "ddp")
    got = weights(ranks, f"zero{stage}")
    report = json.loads((ranks / f"zero{stage}.json").read_text())
    assert report["step"] == 4
    assert report["threads"] == 1  # the rank's threads (cores / local ranks) survive deepspeed.initialize
    assert Path(report["ninja"]).resolve() == _wheel_ninja()  # whatever PATH pytest was started with
    assert_same(got, ref)
    init = cfgmod.from_dict(cfg_dict("ddp"))
    from torchdeck.engine.data import build_datasets
    from torchdeck.engine.models import build_model

    torch.manual_seed(init.train.seed)
    start = build_model(init, build_datasets(init)[2]).state_dict()
    assert max((ref[k] - start[k]).abs().max().item() for k in ref) > 1e-2


@needs_deepspeed
@pytest.mark.slow
def test_a_rank_training_without_muon_loads_no_muon_kernels(ranks):
    """DeepSpeed imports its Muon modules at initialize and at each ZeRO step only to ask whether the
    optimizer is one; importing them compiles kernels (torch._inductor, 1.5 CPU-s a rank). A rank whose
    optimizer is SGD or Adam gets stand-ins, and still trains like DDP (the tests above and below)."""
    for name in ("zero2", "zero3", "zero2-adam"):
        loaded = json.loads((ranks / f"{name}.json").read_text())["loaded"]
        assert loaded == {**{m: True for m in ds._MUON}, "torch._inductor.compile_fx": None}, (name, loaded)


def test_a_muon_run_gets_deepspeeds_real_muon_modules():
    """The stand-ins go in once, only where the optimizer is not Muon, and go for a Muon run."""
    before = {m: sys.modules.get(m) for m in ds._MUON}
    try:
        for m in ds._MUON:
            sys.modules.pop(m, None)
        assert ds.skip_muon({"optimizer": {"type": "SGD"}}) and not ds.skip_muon({"optimizer": {"type": "Adam"}})
        assert isinstance(sys.modules[ds._MUON[0]].MuonWithAuxAdam, type)
        assert not ds.skip_muon({"optimizer": {"type": "Muon"}}) and not any(m in sys.modules for m in ds._MUON)
    finally:
        for m, mod in before.items():
            sys.modules.pop(m, None)
            if mod is not None:
                sys.modules[m] = mod


@needs_deepspeed
@pytest.mark.slow
def test_adam_cosine_schedule_and_clipping_equal_ddp(ranks):
    """DeepSpeed's Adam (torch's, from the generated config), torchdeck's cosine schedule as its
    client scheduler and its gradient clipping (0.05: every step clips) end where DDP does."""
    assert_same(weights(ranks, "zero2-adam"), weights(ranks, "ddp-adam"), atol=1e-5)
    report = json.loads((ranks / "zero2-adam.json").read_text())
    assert report["step"] == 6 and report["lr"][0] == pytest.approx(0.0)  # the cosine ran down from 0.01


@needs_deepspeed
@pytest.mark.slow
def test_resume_latest_equals_uninterrupted_stage_3(ranks):
    """ZeRO-3 (parameters partitioned too) with Adam: 3 steps, checkpoint, resume `latest` in the
    same run directory, 3 more: the weights of a straight 6-step run. Adam's moments and the warmup's
    position come back with it (a warmup restarted at step 4 would train on other LRs)."""
    first = json.loads((ranks / "zero3-first.json").read_text())
    resumed = json.loads((ranks / "zero3-resumed.json").read_text())
    assert first["step"] == 3 and resumed["step"] == 6
    assert resumed["resumed"] and "ckpt-00000003" in resumed["resumed"][0] and "step 3" in resumed["resumed"][0]
    assert_same(weights(ranks, "zero3-resumed"), weights(ranks, "zero3-straight"), atol=1e-6)
    straight = json.loads((ranks / "zero3-straight.json").read_text())
    assert resumed["lr"] == pytest.approx(straight["lr"])


@needs_deepspeed
@pytest.mark.slow
def test_checkpoints_are_complete_directories_and_keep_last(ranks):
    """Every rank wrote its part; only the last checkpoint.keep_last (2) directories are kept, each
    with torchdeck's meta; nothing temporary is left; the optimizer state really is partitioned."""
    directory = ranks / "zero2" / "checkpoints"
    assert sorted(p.name for p in directory.iterdir()) == ["ckpt-00000003", "ckpt-00000004"]
    last = directory / "ckpt-00000004"
    names = sorted(p.name for p in last.iterdir())
    assert names == ["mp_rank_00_model_states.pt", ckpt.META_NAME, "zero_pp_rank_0_mp_rank_00_optim_states.pt",
                     "zero_pp_rank_1_mp_rank_00_optim_states.pt"]
    meta = ckpt.load_meta(last)
    assert meta["step"] == 4 and meta["config"]["strategy"] == "deepspeed" and meta["world_size"] == 2
    total = sum(v.numel() for v in weights(ranks, "zero2").values())
    from torchdeck.engine.strategies._deepspeed import _safe_classes

    with torch.serialization.safe_globals(_safe_classes()):
        shards = [torch.load(last / f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt", weights_only=True)
                  ["optimizer_state_dict"]["single_partition_of_fp32_groups"] for r in (0, 1)]
    sizes = [sum(t.numel() for t in s) for s in shards]
    assert sum(sizes) >= total and max(sizes) <= total // 2 + 16, (sizes, total)  # half each (plus padding)


@needs_deepspeed
@pytest.mark.slow
def test_bf16_trains_with_bf16_weights_and_fp32_masters(ranks):
    """bf16-mixed is DeepSpeed's bf16 mode: the module's weights are bf16 while its optimizer keeps
    fp32 masters (what eval reads back), and the loss stays finite."""
    report = json.loads((ranks / "zero2-bf16.json").read_text())
    assert report["step"] == 4 and report["param_dtypes"] == ["torch.bfloat16"]
    # on an H100 the first step died "Input type (torch.cuda.FloatTensor) and weight type
    # (CUDABFloat16Type) should be the same": DeepSpeed had switched the loop's CUDA autocast off
    assert report["bare_forward"] == "torch.bfloat16", report["bare_forward"]
    w = weights(ranks, "zero2-bf16")
    assert all(v.dtype == torch.float32 and torch.isfinite(v).all() for v in w.values())
    assert_same(w, weights(ranks, "zero2"), atol=0.05)  # the same training, at bf16's precision


@needs_deepspeed
@pytest.mark.slow
def test_channels_last_conv_weights_train_like_ddp(ranks):
    """train.channels_last on a conv net (the shipped GPU presets set it): DeepSpeed broadcasts each
    weight as a byte view, which a channels_last 4-D weight refused, so the run died in
    deepspeed.initialize (seen on an H100 with deepspeed-gpu: first the 3x3 stem, then a 1x1
    shortcut, whose weight is_contiguous() though its last stride is not 1). It trains, ending on
    DDP's weights."""
    report = json.loads((ranks / "zero2-channels-last.json").read_text())
    assert report["step"] == 4
    ref = weights(ranks, "ddp-channels-last")
    assert_same(weights(ranks, "zero2-channels-last"), ref, atol=1e-5)
    assert {tuple(v.shape[2:]) for v in ref.values() if v.dim() == 4} == {(3, 3), (1, 1)}


@needs_deepspeed
@pytest.mark.slow
def test_bf16_with_batchnorm_and_channels_last_trains(ranks):
    """The deepspeed-gpu preset's combination (bf16, channels_last, BatchNorm): DeepSpeed 0.19 casts
    parameters only, so BatchNorm met bf16 weights with fp32 running statistics and the first step
    died ("expected scalar type BFloat16 but found Float"). The generated data_types.buffer_dtype
    takes the buffers along; the run ends near the fp32 one."""
    report = json.loads((ranks / "zero2-bf16-channels-last.json").read_text())
    assert report["step"] == 4 and report["param_dtypes"] == ["torch.bfloat16"]
    assert report["bare_forward"] == "torch.bfloat16", report["bare_forward"]
    w = weights(ranks, "zero2-bf16-channels-last")
    assert any("running_mean" in k for k in w)
    assert_same(w, weights(ranks, "zero2-channels-last"), atol=0.05)


@needs_deepspeed
@pytest.mark.slow
def test_eval_reads_a_deepspeed_checkpoint_as_full_weights(ranks, capsys):
    """`torchdeck eval` on a ZeRO-3 checkpoint directory gives what it gives on DDP's file."""
    from torchdeck.cli.main import main

    got = []
    for path in (ckpt.latest(ranks / "zero3-straight" / "checkpoints", dirs=True)[0],
                 ckpt.latest(ranks / "ddp-adam" / "checkpoints")[0]):
        assert main(["eval", str(path)]) == 0
        got.append(capsys.readouterr().out.splitlines()[-1])
    assert "accuracy" in got[0]
    assert got[0] == got[1] or abs(float(got[0].split("loss ")[1].split(",")[0]) -
                                   float(got[1].split("loss ")[1].split(",")[0])) < 0.01


EVIL = """
import os, pickle, torch
class Evil:
    def __reduce__(self):
        return (os.system, ("touch {marker}",))
torch.save({{"optimizer_state_dict": Evil()}}, "{target}")
"""


@needs_deepspeed
@pytest.mark.slow
def test_a_checkpoint_that_would_run_code_is_refused(ranks, tmp_path):
    """DeepSpeed reads its files with a full unpickler; torchdeck first reads every one as plain
    tensors and settings (weights_only), so a file carrying code is refused by eval and by resume."""
    bad = tmp_path / "ckpt-00000004"
    shutil.copytree(ckpt.latest(ranks / "zero2" / "checkpoints", dirs=True)[0], bad)
    target = bad / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    marker = tmp_path / "ran"
    subprocess.run([sys.executable, "-c", EVIL.format(marker=marker, target=target)], check=True)
    from torchdeck.engine.evaluate import EvalError, evaluate
    from torchdeck.engine.strategies._deepspeed import check_weights_only

    with pytest.raises(ValueError, match="refused, it could run code"):
        check_weights_only(bad)
    with pytest.raises(EvalError, match="refused, it could run code"):
        evaluate(bad)
    assert not marker.exists()


# ----------------------------------------------------------------------------- whole runs

SLOW_MODEL = """
import time
from torchdeck.engine.models import mlp


def build(info):
    net = mlp(info, 32)
    net.register_forward_pre_hook(lambda mod, args: time.sleep(0.03) if mod.training else None)
    return net
"""


def _supervise(run: Path, cfg: dict, env: dict, wait_steps: int | None = None) -> subprocess.CompletedProcess:
    """`python -m torchdeck.engine.supervisor RUN` as launch.start does; with wait_steps, touch the stop file
    once that many step events are in."""
    run.mkdir(parents=True, exist_ok=True)
    cfgmod.save(cfgmod.from_dict(cfg), run / "config.yaml")
    proc = subprocess.Popen([sys.executable, "-m", "torchdeck.engine.supervisor", str(run)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if wait_steps:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and proc.poll() is None:
            if sum(e["kind"] == "step" for e in events.read_all(run / "events.jsonl")) >= wait_steps:
                break
            time.sleep(0.05)
        (run / "stop").touch()
    out, _ = proc.communicate(timeout=240)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, "")


@needs_deepspeed
@pytest.mark.slow
def test_stop_then_resume_latest_equals_uninterrupted_and_the_users_file_wins(tmp_path, monkeypatch):
    """Through the supervisor, as a user's run: the user's ds_config sets the micro-batch to 8 (the
    form says 16); the run says so, writes the ds_config it used, trains with 8 and checkpoints in
    DeepSpeed's own format. Stopped through its stop file and resumed `latest`, it ends on the
    weights of an uninterrupted one-process run with the same batch. One rank: what needs two
    (a partitioned checkpoint resumed by every rank) is the ranks fixture's ZeRO-3 resume."""
    (tmp_path / "slowmlp.py").write_text(SLOW_MODEL)
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    user = write_json(tmp_path / "mine.json", {"train_micro_batch_size_per_gpu": 8})
    cfg = cfg_dict(devices=1, **{"train.batch_size": 16, "train.grad_accum": 1, "train.max_steps": 0, "train.epochs": 1,
                                 "model.name": "slowmlp:build", "deepspeed.config": user,
                                 "checkpoint.every_n_steps": 4, "checkpoint.keep_last": 2})
    run = tmp_path / "run"
    proc = _supervise(run, cfg, env, wait_steps=3)
    assert proc.returncode == 0, proc.stdout + (run / "rank0.log").read_text()
    assert json.loads((run / "status.json").read_text())["status"] == "stopped"
    logs = [e["message"] for e in events.read_all(run / "events.jsonl") if e["kind"] == "log"]
    assert any("train_micro_batch_size_per_gpu = 8 replaces 16 (train.batch_size)" in m for m in logs), logs
    used = json.loads((run / "ds_config.json").read_text())
    assert used["train_micro_batch_size_per_gpu"] == 8 and used["train_batch_size"] == 8
    stopped_at = ckpt.latest(run / "checkpoints", dirs=True)[1]["step"]
    assert 0 < stopped_at < 32, "stopped too late to test a resume; the stop file was not honoured"
    assert all(e["total_steps"] == 32 for e in events.read_all(run / "events.jsonl") if e["kind"] == "step")

    (run / "stop").unlink()
    shutil.move(run / "events.jsonl", run / "events.first.jsonl")
    cfg["checkpoint"]["resume"] = "latest"
    proc = _supervise(run, cfg, env)
    assert proc.returncode == 0, proc.stdout + (run / "rank0.log").read_text()
    msgs = [e["message"] for e in events.read_all(run / "events.jsonl") if e["kind"] == "log"]
    assert any(f"resumed from {run / 'checkpoints' / ckpt.dir_name(stopped_at)}" in m for m in msgs), msgs
    path, meta = ckpt.latest(run / "checkpoints", dirs=True)
    assert meta["step"] == 32

    from torchdeck.engine.evaluate import _deepspeed_state
    from tests.engine.helpers import final_model, run_in_process

    monkeypatch.syspath_prepend(str(tmp_path))
    straight = cfg_dict("cpu", devices=1, **{"train.batch_size": 8, "train.grad_accum": 1, "train.max_steps": 0,
                                             "train.epochs": 1, "model.name": "slowmlp:build"})
    run_in_process(tmp_path / "straight", straight)
    assert_same(_deepspeed_state(path)["model"], final_model(tmp_path / "straight")["model"], atol=1e-5)


@needs_deepspeed
@pytest.mark.slow
def test_a_killed_rank_fails_the_run_like_ddp(tmp_path):
    """The shipped `deepspeed` preset through `torchdeck run`; SIGKILL one rank mid-run (as the OOM
    killer does): the command exits 1 naming the rank and the signal, and every process of the run
    is gone within 15 s, as for DDP."""
    from tests.engine.helpers import LEFT_WITHIN_S, assert_nothing_left, rank_pids, start_cli, steps_seen, the_run, wait_for

    long = ["data.train_size=4096", "data.val_size=64", "train.epochs=1000", "train.log_every_n_steps=1",
            "train.threads_per_rank=1", "nodes.master_port=0"]
    proc, log = start_cli(tmp_path, "run", "deepspeed", *[a for item in long for a in ("--set", item)])
    run = the_run(tmp_path)
    try:
        wait_for(lambda: steps_seen(run) and len(rank_pids(run)) == 2, 180, "training steps")
        pids = rank_pids(run)
        t0 = time.monotonic()
        os.kill(pids[1], signal.SIGKILL)
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            from torchdeck.engine.runs import control

            control.kill(run)
    out = log.read_text()
    assert code == 1, out
    assert "rank 1 killed by signal 9" in out
    final = run.final_status()
    assert final["status"] == "failed" and "rank 1 killed by signal 9" in final["root_cause"]
    assert_nothing_left(run, list(pids.values()) + [run.supervisor_pid()],
                        within=max(1.0, LEFT_WITHIN_S - (time.monotonic() - t0)))


# ----------------------------------------------------------------------------- export


def test_export_for_deepspeeds_launcher_has_a_hostfile_and_a_line_per_node(tmp_path, capsys):
    """GPUs by index through --include (the launcher makes exactly those visible), no ssh, a new run
    directory per node and launch, the config every node reads."""
    from torchdeck.cli.main import main

    preset = tmp_path / "p.yaml"
    preset.write_text(cfgmod.dumps(cfgmod.from_dict(cfg_dict(**{
        "accelerator": "cuda", "devices": [6, 7], "backend": "nccl", "nodes.num_nodes": 2,
        "nodes.master_addr": "10.0.0.1", "nodes.master_port": 29600}))))
    assert main(["export", str(preset), "--deepspeed"]) == 0
    out = capsys.readouterr().out
    assert "cat > ds.hostfile <<'EOF'\nnode0 slots=8\nnode1 slots=8\nEOF\n" in out
    lines = [ln for ln in out.splitlines() if ln.startswith("deepspeed ")]
    assert len(lines) == 2
    for k, line in enumerate(lines):
        assert line.startswith(f"deepspeed --hostfile ds.hostfile --no_ssh --node_rank {k} --master_addr 10.0.0.1 "
                               "--master_port 29600 --include node0:6,7@node1:6,7 --no_local_rank --module "
                               f"torchdeck.engine.worker {preset.resolve()} --run-dir ")
        assert line.endswith(f'-ds-node{k}"') and "$(date +%Y%m%d-%H%M%S)" in line


@needs_deepspeed
@pytest.mark.slow
def test_exported_deepspeed_launch_runs_as_two_nodes(tmp_path, capsys):
    """The exported hostfile and lines, run here as two nodes of one CPU rank each (DeepSpeed's own
    launcher, without ssh): each node writes a run directory that says who launched it, every rank
    takes part, and the weights equal one process with the whole batch (eval reads them from node
    0's folder, which holds only its ranks' partitions)."""
    from torchdeck.cli.main import main
    from tests.engine.helpers import assert_same_weights, final_model, run_in_process

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = cfg_dict(devices=1, **{"train.batch_size": 16, "train.grad_accum": 1, "nodes.num_nodes": 2,
                                 "nodes.master_port": port})
    preset = tmp_path / "job.yaml"
    preset.write_text(cfgmod.dumps(cfgmod.from_dict(cfg)))
    assert main(["export", str(preset), "--deepspeed", "--run-root", str(tmp_path / "runs")]) == 0
    text = capsys.readouterr().out
    head = text[:text.index("\nEOF\n") + len("\nEOF\n")]
    bin_dir = Path(sys.executable).parent
    if not (bin_dir / "deepspeed").exists():  # an environment sharing another's packages: its entry point
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        (bin_dir / "deepspeed").write_text(f"#!{sys.executable}\nfrom deepspeed.launcher.runner import main\nmain()\n")
        (bin_dir / "deepspeed").chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    subprocess.run(["bash", "-c", head], cwd=tmp_path, env=env, check=True)
    nodes = [subprocess.Popen(["bash", "-c", ln], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
             for ln in text.splitlines() if ln.startswith("deepspeed ")]
    outs = [p.communicate(timeout=300)[0] for p in nodes]
    assert [p.returncode for p in nodes] == [0, 0], "\n".join(o[-3000:] for o in outs)
    runs = sorted((tmp_path / "runs").iterdir(), key=lambda p: p.name[-1])
    assert [p.name[-6:] for p in runs] == ["-node0", "-node1"]
    ranks = []
    for k, run in enumerate(runs):
        evs = events.read_all(run / "events.jsonl")
        started = next(e for e in evs if e["kind"] == "run_started")
        assert (started["launcher"], started["node_rank"], started["world_size"]) == ("deepspeed", k, 2)
        assert json.loads((run / "status.json").read_text())["status"] == "finished"
        ranks += [e["rank"] for e in evs if e["kind"] == "rank_ready"]
    assert sorted(ranks) == [0, 1]
    run_in_process(tmp_path / "one", cfg_dict("cpu", devices=1, **{"train.batch_size": 32, "train.grad_accum": 1}))
    path, _ = ckpt.latest(runs[0] / "checkpoints", dirs=True)
    from torchdeck.engine.evaluate import _deepspeed_state

    assert_same_weights(_deepspeed_state(path)["model"], final_model(tmp_path / "one")["model"])


def _wheel_ninja() -> Path:
    import ninja

    return (Path(ninja.BIN_DIR) / "ninja").resolve()


@needs_deepspeed
def test_a_rank_builds_deepspeeds_ops_with_one_ninja_whatever_path_finds_first(tmp_path, monkeypatch):
    """DeepSpeed's CPU op (deepspeed_shm_comm) was rebuilt, 25 s to 3 minutes, each time a run
    started from a PATH with .venv/bin first (the wheel's ninja 1.13) followed one started without
    it (/usr/bin/ninja 1.11), and back: torch runs the `ninja` PATH finds, and the two hash the same
    compile command differently, so each took the other's objects for stale. A rank's setup puts the
    wheel's ninja first, so both kinds of start build with it (and the ranks fixture checks the
    spawned ranks do). Here another `ninja` comes first on PATH, then the wheel's."""
    other = tmp_path / "bin"
    other.mkdir()
    (other / "ninja").write_text("#!/bin/sh\necho 1.0.0\n")
    (other / "ninja").chmod(0o755)
    import ninja

    wheel = _wheel_ninja()
    for first in (str(other), ninja.BIN_DIR):
        monkeypatch.setenv("PATH", os.pathsep.join([first, "/usr/bin", "/bin"]))
        ds.pin_ninja()
        assert Path(shutil.which("ninja")).resolve() == wheel, first
        version = subprocess.run(["ninja", "--version"], capture_output=True, text=True, check=True).stdout
        assert version != "1.0.0\n", first
    assert os.environ["PATH"].split(os.pathsep).count(ninja.BIN_DIR) == 1  # put first once, not again


@needs_deepspeed
def test_a_deepspeed_run_on_the_cpu_compiles_nothing(tmp_path):
    """DeepSpeed compiled its shared-memory op (deepspeed_shm_comm) with g++ at a host's first
    DeepSpeed start: a CPU-minute while the Monitor said 'building the model' (issue 27), and ~50 s
    of this file's setup in a fresh clone (issue 36), for an op only DeepSpeed inference's
    all-reduce uses. A training rank tells DeepSpeed not to build it: a run with an empty extensions
    cache and CXX=/bin/false (any compile fails the run at once) finishes and leaves the cache empty.
    DS_ACCELERATOR=cpu: DeepSpeed's CPU accelerator, the one with that op, on a GPU host too."""
    from tests.engine.helpers import cli_cmd, env_for

    preset = tmp_path / "p.yaml"
    preset.write_text(cfgmod.dumps(cfgmod.from_dict(cfg_dict(devices=1))))
    cache = tmp_path / "torch_extensions"
    cache.mkdir()
    env = dict(env_for(tmp_path), TORCH_EXTENSIONS_DIR=str(cache), CXX="/bin/false", DS_ACCELERATOR="cpu")
    p = subprocess.run(cli_cmd() + ["run", str(preset)], env=env, capture_output=True, text=True, timeout=300)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    assert "built successfully" not in out and sorted(cache.rglob("*")) == [], out


@needs_deepspeed
@pytest.mark.slow
def test_two_ranks_build_no_op(ranks):
    """The ranks fixture's 2 ranks ran every scenario with an empty extensions cache and
    CXX=/bin/false: DeepSpeed built nothing into it (a build would have failed the fixture)."""
    assert sorted((ranks / "torch_extensions").rglob("*")) == []
