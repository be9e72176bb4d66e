"""The run config rejects every invalid case of issue 2 with the field named, and derives values."""
import os
from pathlib import Path

import pytest

from torchdeck.engine import config as c
from torchdeck.engine import preflight
from torchdeck.engine.config import ConfigError
from torchdeck.engine.hardware import Hardware
from torchdeck.engine.strategies import global_batch, world_size

GPU8 = Hardware(gpu_count=8, mpi_available=False)
NO_GPU = Hardware(gpu_count=0, mpi_available=False)


def problems(data, hw=None):
    with pytest.raises(ConfigError) as info:
        preflight.from_dict(data, source="test.yaml", hw=hw)
    return info.value.by_field(), str(info.value)


def ddp_cpu(**over):
    d = {"strategy": "ddp", "accelerator": "cpu", "devices": 2, "backend": "gloo"}
    d.update(over)
    return d


def test_unknown_key_suggests_the_close_one():
    fields, text = problems({"train": {"batchsize": 32}})
    assert "did you mean 'train.batch_size'" in fields["train.batchsize"]
    assert text.startswith("test.yaml: train.batchsize: unknown key")


def test_unknown_top_level_key_lists_known_keys_when_nothing_is_close():
    fields, _ = problems({"zzzqqq": 1})
    assert "unknown key" in fields["zzzqqq"] and "strategy" in fields["zzzqqq"]


@pytest.mark.parametrize("path,value,want", [
    ("train.batch_size", "big", "integer"),
    ("train.batch_size", 3.5, "integer"),
    ("train.batch_size", True, "integer"),
    ("optimizer.lr", "fast", "number"),
    ("train.eval_every_epoch", "yes please", "true or false"),
    ("train.epochs", [1, 2], "integer"),
    ("model", "cnn", "mapping"),
    ("optimizer.betas", 0.9, "list"),
])
def test_wrong_type_names_field_and_expected_type(path, value, want):
    data = c.apply_overrides({}, [])
    node = data
    parts = path.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value
    fields, _ = problems(data)
    assert want in fields[path]


@pytest.mark.parametrize("override,field", [
    ("train.batch_size=0", "train.batch_size"),
    ("train.grad_accum=0", "train.grad_accum"),
    ("optimizer.lr=0", "optimizer.lr"),
    ("optimizer.lr=-1", "optimizer.lr"),
    ("optimizer.momentum=1.5", "optimizer.momentum"),
    ("optimizer.weight_decay=-0.1", "optimizer.weight_decay"),
    ("nodes.master_port=70000", "nodes.master_port"),
    ("nodes.node_rank=3", "nodes.node_rank"),
    ("nodes.num_nodes=0", "nodes.num_nodes"),
    ("nodes.master_addr=", "nodes.master_addr"),
    ("nodes.master_addr=node 0", "nodes.master_addr"),
    ("checkpoint.keep_last=0", "checkpoint.keep_last"),
    ("scheduler.gamma=2", "scheduler.gamma"),
    ("train.grad_clip=-1", "train.grad_clip"),
    ("data.num_workers=-2", "data.num_workers"),
    ("strategy=ddpp", "strategy"),
    ("train.precision=fp8", "train.precision"),
    ("optimizer.name=lion", "optimizer.name"),
    ("scheduler.name=linear", "scheduler.name"),
    ("model.name=transformer", "model.name"),
    ("data.dataset=imagenet", "data.dataset"),
    ("init_method=http://x", "init_method"),
    ("backend=ucc", "backend"),
])
def test_out_of_range_or_unknown_value_names_field(override, field):
    data = c.apply_overrides(ddp_cpu(), [override])
    fields, _ = problems(data)
    assert field in fields, fields


def test_did_you_mean_for_choices():
    fields, _ = problems(ddp_cpu(strategy="ddpp"))
    assert "did you mean 'ddp'" in fields["strategy"]


def test_nccl_without_cuda():
    fields, _ = problems(ddp_cpu(backend="nccl"))
    assert "nccl needs CUDA" in fields["backend"]


def test_ddp_with_one_process():
    fields, _ = problems(ddp_cpu(devices=1))
    assert "one process" in fields["devices"]
    fields, _ = problems({"strategy": "ddp", "accelerator": "cuda", "devices": [3]}, GPU8)
    assert "one process" in fields["devices"]


def test_devices_that_do_not_exist():
    fields, _ = problems({"strategy": "ddp", "accelerator": "cuda", "devices": "6,7"}, Hardware(gpu_count=2))
    assert "GPU 6, 7 does not exist" in fields["devices"] and "0-1" in fields["devices"]


def test_cuda_on_a_host_without_gpu():
    fields, _ = problems({"strategy": "gpu", "accelerator": "cuda", "devices": [0]}, NO_GPU)
    assert "has none" in fields["accelerator"]


def test_fsdp_over_gloo_on_gpus():
    """The H100 run: gathering FSDP's CUDA shards over gloo killed the rank with SIGSEGV."""
    fields, _ = problems({"strategy": "fsdp", "accelerator": "cuda", "devices": [0, 1], "backend": "gloo"},
                         Hardware(gpu_count=2))
    assert "needs nccl" in fields["backend"] and "132471" in fields["backend"]
    for ok in ({"strategy": "fsdp", "accelerator": "cuda", "devices": [0, 1]},  # auto: nccl
               {"strategy": "fsdp", "accelerator": "cpu", "devices": 2, "backend": "gloo"},
               {"strategy": "ddp", "accelerator": "cuda", "devices": [0, 1], "backend": "gloo"}):
        preflight.from_dict(ok, source="test.yaml", hw=Hardware(gpu_count=2))


def test_fp16_on_cpu():
    fields, _ = problems(ddp_cpu(train={"precision": "16-mixed"}))
    assert "needs CUDA" in fields["train.precision"]


def test_mpi_when_torch_has_none():
    fields, _ = problems(ddp_cpu(backend="mpi"), Hardware(gpu_count=0, mpi_available=False))
    assert "MPI" in fields["backend"]


@pytest.mark.parametrize("data,field", [
    ({"strategy": "cpu", "devices": 2}, "devices"),
    ({"strategy": "gpu", "accelerator": "cuda", "devices": [0, 1]}, "devices"),
    ({"strategy": "ddp", "accelerator": "cuda", "devices": [1, 1]}, "devices"),
    ({"strategy": "ddp", "accelerator": "cuda", "devices": "a,b"}, "devices"),
    ({"strategy": "ddp", "accelerator": "cpu", "devices": "0,1"}, "devices"),
    ({"train": {"epochs": 0, "max_steps": 0}}, "train.epochs"),
    ({"data": {"cache": "disk"}}, "data.cache"),
    ({"data": {"augment": "rotate"}}, "data.augment"),
    ({"data": {"cache_budget_mb": -1}}, "data.cache_budget_mb"),
    ({"data": {"prefetch_factor": 0}}, "data.prefetch_factor"),
    ({"data": {"pin_memory": True}}, "data.pin_memory"),
    ({"optimizer": {"name": "adam", "nesterov": True}}, "optimizer.nesterov"),
    ({"scheduler": {"name": "warmup", "warmup_steps": 0}}, "scheduler.warmup_steps"),
    ({"nodes": {"num_nodes": 2, "master_port": 0}, "strategy": "ddp", "devices": 2}, "nodes.master_port"),
    ({"nodes": {"num_nodes": 2}, "strategy": "cpu"}, "nodes.num_nodes"),
    ({"model": {"name": "cnn"}, "data": {"image_size": 8}}, "data.image_size"),  # the form took it; the rank died
])
def test_impossible_combinations(data, field):
    fields, _ = problems(data, GPU8)
    assert field in fields, fields


def test_every_problem_is_reported_at_once():
    fields, text = problems(ddp_cpu(train={"batch_size": -1, "grad_accum": 0}, optimizer={"lr": -1}))
    assert {"train.batch_size", "train.grad_accum", "optimizer.lr"} <= set(fields)
    assert len(text.splitlines()) >= 3


def test_broken_yaml_reports_line_and_column():
    with pytest.raises(ConfigError) as info:
        preflight.loads("strategy: ddp\ntrain:\n  batch_size: [1, 2\n", source="p.yaml")
    assert "line" in str(info.value) and "column" in str(info.value)


def test_newer_schema_version_is_refused():
    fields, _ = problems({"schema_version": 99})
    assert "version" in fields["schema_version"]


def test_round_trip_dumps_loads_equal():
    cfg = preflight.from_dict(ddp_cpu(train={"batch_size": 32, "grad_accum": 2, "precision": "bf16-mixed"},
                              optimizer={"name": "adamw", "lr": 0.001, "betas": [0.8, 0.99]},
                              scheduler={"name": "cosine", "min_lr": 1e-5},
                              checkpoint={"every_n_steps": 5, "keep_last": 2},
                              model={"name": "mlp", "hidden": 64}))
    again = preflight.loads(c.dumps(cfg))
    assert again == cfg
    assert again.to_dict() == cfg.to_dict()


def test_round_trip_through_file(tmp_path):
    cfg = preflight.from_dict({"strategy": "ddp", "accelerator": "cuda", "devices": "0,2", "backend": "nccl"}, hw=GPU8)
    c.save(cfg, tmp_path / "x.yaml")
    assert preflight.load(tmp_path / "x.yaml", hw=GPU8) == cfg
    assert cfg.devices == [0, 2]


def test_derived_world_size_and_global_batch():
    cfg = preflight.from_dict(ddp_cpu(devices=4, train={"batch_size": 16, "grad_accum": 3}))
    assert world_size(cfg) == 4
    assert global_batch(cfg) == 16 * 4 * 3
    cfg = preflight.from_dict({"strategy": "ddp", "accelerator": "cuda", "devices": [0, 2, 5],
                       "nodes": {"num_nodes": 2, "master_port": 29400}, "train": {"batch_size": 8}}, hw=GPU8)
    assert world_size(cfg) == 6 and global_batch(cfg) == 48
    assert [cfg.device_for(i) for i in range(3)] == ["cuda:0", "cuda:2", "cuda:5"]  # real indices
    assert world_size(preflight.from_dict({})) == 1


def test_lightning_style_devices():
    assert preflight.from_dict({"strategy": "ddp", "accelerator": "cuda", "devices": 3}, hw=GPU8).devices == [0, 1, 2]
    all_gpus = preflight.from_dict({"strategy": "ddp", "accelerator": "cuda", "devices": -1}, hw=GPU8)
    assert all_gpus.devices == list(range(8)) and world_size(all_gpus) == 8
    # unknown hardware: -1 stays symbolic and still round-trips
    unknown = preflight.from_dict({"strategy": "ddp", "accelerator": "cuda", "devices": -1})
    assert preflight.loads(c.dumps(unknown)) == unknown


def test_overrides_parse_yaml_scalars_and_create_sections():
    data = c.apply_overrides({}, ["train.batch_size=128", "devices=0,1", "optimizer.lr=1e-3",
                                 "data.pin_memory=false", "name=my run"])
    assert data["train"] == {"batch_size": 128} and data["devices"] == "0,1"
    assert data["data"] == {"pin_memory": False} and data["name"] == "my run"
    with pytest.raises(ConfigError):
        c.apply_overrides({}, ["novalue"])


def test_scientific_notation_is_a_number():
    """PyYAML reads `1e-3` (no dot) as a string; users write it that way all the time."""
    assert preflight.loads("optimizer:\n  lr: 1e-3\n").optimizer.lr == pytest.approx(0.001)
    data = c.apply_overrides({}, ["optimizer.lr=5E-4", "optimizer.weight_decay=1e-2"])
    cfg = preflight.from_dict(data)
    assert cfg.optimizer.lr == pytest.approx(5e-4) and cfg.optimizer.weight_decay == pytest.approx(0.01)
    fields, _ = problems({"optimizer": {"lr": "1e-3x"}})
    assert "number" in fields["optimizer.lr"]


@pytest.mark.parametrize("over,field", [
    (["nodes.num_nodes=2"], "nodes.master_addr"),
    (["nodes.num_nodes=2", "nodes.master_addr=localhost"], "nodes.master_addr"),
    (["nodes.num_nodes=3", "nodes.master_addr=::1"], "nodes.master_addr"),
    (["nodes.num_nodes=2", "init_method=tcp://127.0.0.2:29511"], "init_method"),
])
def test_several_nodes_meeting_at_loopback_are_warned_not_refused(over, field):
    """Issue 14 rough edge 9: two nodes at 127.0.0.1 passed silently; only the rendezvous, minutes
    later on the other node, said that the address is this host itself. Several nodes on one host
    is legitimate (a rehearsal), so it is a warning, not a refusal."""
    cfg = preflight.from_dict(c.apply_overrides({"strategy": "ddp", "devices": 2}, over))
    (got,) = preflight.advice(cfg)
    assert got[0] == field and "this host itself" in got[1] and "node 0's network address" in got[1]


@pytest.mark.parametrize("over", [
    [], ["nodes.master_addr=localhost"],  # one node: loopback is right
    ["nodes.num_nodes=2", "nodes.master_addr=10.0.0.5"],
    ["nodes.num_nodes=2", "nodes.master_addr=node0.cluster"],
    ["nodes.num_nodes=2", "nodes.master_addr=10.0.0.5", "init_method=env://"],
])
def test_no_advice_where_nothing_looks_wrong(over):
    assert preflight.advice(preflight.from_dict(c.apply_overrides({"strategy": "ddp", "devices": 2}, over))) == []


@pytest.mark.parametrize("data,field,said", [
    ({"train": {"epochs": ""}}, "train.epochs", "must be an integer; it is empty"),
    ({"train": {"epochs": None}}, "train.epochs", "must be an integer; it is empty"),
    ({"train": {"epochs": "abc"}}, "train.epochs", 'must be an integer, got "abc"'),
    ({"train": {"epochs": 1.5}}, "train.epochs", "must be an integer, got 1.5"),
    ({"optimizer": {"lr": [1, 2]}}, "optimizer.lr", "must be a number, got the list [1, 2]"),
    ({"train": {"compile": 3}}, "train.compile", "must be true or false, got 3"),
    ({"model": {"kwargs": "depth"}}, "model.kwargs", 'must be a mapping, got "depth"'),
    ({"model": "cnn"}, "model", 'must be a mapping of settings (key: value lines), got "cnn"'),
    ({"nodes": [1]}, "nodes", "must be a mapping of settings (key: value lines), got the list [1]"),
])
def test_wrong_types_are_said_in_the_words_of_the_preset(data, field, said):
    """Issue 14 rough edge 11: `must be an integer, got '' (str)` read like Python; the message
    says what the user wrote, in YAML's words."""
    fields, text = problems(data)
    assert fields[field] == said
    for python in ("(str)", "(int)", "(list)", "(NoneType)", "'abc'", "got ''"):
        assert python not in text


def _load_in_fresh_process(path, cache_dir) -> str:
    import subprocess
    import sys

    code = ("import sys\nfrom torchdeck.engine import preflight\n"  # as the app opens it
            f"cfg = preflight.load({str(path)!r}, cache=True)\n"
            "print(cfg.train.batch_size, 'yaml' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "TORCHDECK_CACHE_DIR": str(cache_dir)}, cwd=Path(c.__file__).parents[1])
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_the_apps_preset_is_read_from_its_json_copy_while_unchanged(tmp_path):
    """The app opens its preset with cache=True: PyYAML's import (~7 ms, 4 % of the first frame)
    is paid once per edit of the file, not per start; the YAML file stays the truth."""
    preset = tmp_path / "p.yaml"
    preset.write_text("strategy: ddp\ndevices: 2\ntrain:\n  batch_size: 32\n")
    cache = tmp_path / "cache"
    assert _load_in_fresh_process(preset, cache) == "32 True"  # parsed, copy written
    assert _load_in_fresh_process(preset, cache) == "32 False"  # from the copy: no PyYAML
    preset.write_text("strategy: ddp\ndevices: 2\ntrain:\n  batch_size: 48\n")  # same size class, new text
    assert _load_in_fresh_process(preset, cache) == "48 True"
    assert _load_in_fresh_process(preset, cache) == "48 False"
    (copy,) = (cache / "presets").iterdir()
    copy.write_text("{not json")  # a broken copy is ignored and replaced
    assert _load_in_fresh_process(preset, cache) == "48 True"
    assert c.load(preset).train.batch_size == 48  # without cache=True: never looks


def test_a_preset_json_cannot_hold_is_not_copied_and_a_broken_one_still_errors(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHDECK_CACHE_DIR", str(tmp_path / "cache"))
    odd = tmp_path / "odd.yaml"
    odd.write_text("strategy: cpu\ndescription: 2026-11-26\n")  # YAML reads a date: JSON would give a string
    with pytest.raises(ConfigError):  # description must be a string: the same error with or without
        c.load(odd, cache=True)
    assert not (tmp_path / "cache" / "presets").exists() or not list((tmp_path / "cache" / "presets").iterdir())
    broken = tmp_path / "broken.yaml"
    broken.write_text("strategy: [cpu\n")
    with pytest.raises(ConfigError, match="broken YAML"):
        c.load(broken, cache=True)
    monkeypatch.setenv("TORCHDECK_CACHE_DIR", "/proc/no-such-dir")  # unwritable: loads all the same
    ok = tmp_path / "ok.yaml"
    ok.write_text("strategy: cpu\n")
    assert c.load(ok, cache=True).strategy == "cpu"


def test_a_combination_error_names_each_value_with_where_it_came_from(tmp_path):
    """Issue 27 bug 8: `torchdeck run quickstart --set strategy=dp` said `presets/quickstart.yaml:
    accelerator: strategy dp needs accelerator cuda`, blaming the preset for the --set. Each value
    the rule involves is now named with its own source; a value nobody wrote is the default."""
    import subprocess

    from tests.engine.helpers import cli_cmd, env_for

    def run(*args):
        r = subprocess.run(cli_cmd() + list(args), capture_output=True, text=True, timeout=120,
                           env=env_for(tmp_path), cwd=tmp_path)
        assert r.returncode == 2, r.stdout + r.stderr
        return r.stderr

    quickstart = str(c.Path(preflight.__file__).parents[1] / "presets" / "quickstart.yaml")
    err = run("run", "quickstart", "--set", "strategy=dp")
    assert (f"accelerator: strategy dp needs accelerator cuda (GPUs) (strategy dp from --set, accelerator cpu "
            f"from {quickstart})") in err, err
    assert f"{quickstart}: accelerator:" not in err  # the preset is not blamed for the --set
    err = run("validate", "quickstart", "--set", "train.precision=16-mixed", "--set", "accelerator=cpu")
    assert "train.precision: fp16 mixed precision needs CUDA" in err and err.startswith("--set: "), err  # one source
    preset = tmp_path / "p.yaml"
    preset.write_text("strategy: ddp\ndevices: 2\n")  # accelerator: the default
    err = run("validate", str(preset), "--set", "strategy=fsdp", "--set", "backend=nccl")
    assert "backend: nccl needs CUDA GPUs; use gloo for CPU processes (backend nccl from --set, accelerator cpu " \
           "from the default)" in err, err


def test_a_gpu_listed_twice_is_each_strategys_to_refuse():
    """The schema no longer names model-parallel (issue 36): a strategy says whether two of its
    devices may be one GPU (two pipeline stages may share one; two DDP ranks may not)."""
    hw = Hardware(gpu_count=2)
    for strategy, refused in (("ddp", True), ("model-parallel", False), ("script", True)):
        cfg, _ = c.build({"strategy": strategy, "accelerator": "cuda", "devices": [0, 0],
                          "script": {"path": "train.py"} if strategy == "script" else {}}, None, hw)
        said = dict(preflight.validate(cfg, hw)).get("devices", "")
        assert ("each GPU may be listed once, got [0, 0]" in said) == refused, (strategy, said)
