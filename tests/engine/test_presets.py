"""Shipped presets load; user presets save, load back equal and delete; shipped ones stay untouched."""
import hashlib

import pytest

from torchdeck.engine import config as c
from torchdeck.engine import preflight, presets
from torchdeck.engine.config import ConfigError
from torchdeck.engine.hardware import Hardware
from torchdeck.engine.presets import shipped_presets_dir
from torchdeck.engine.strategies import global_batch, world_size

GPU8 = Hardware(gpu_count=8, mpi_available=True)
NO_GPU = Hardware(gpu_count=0, mpi_available=False)
OWN = ["quickstart", "cpu", "gpu", "ddp-cpu", "ddp-gpu"]


@pytest.fixture
def user_dir(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCHDECK_PRESETS", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    return tmp_path / "xdg" / "torchdeck" / "presets"


def _shipped_digest():
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in shipped_presets_dir().iterdir()}


def _needs_cuda(path):
    import yaml

    return yaml.safe_load(path.read_text()).get("accelerator") == "cuda"


def _shipped():
    """Every shipped preset; the deepspeed ones need the extra (`make test` installs it)."""
    from torchdeck.engine.strategies.deepspeed import INSTALL_HINT, installed

    missing = pytest.mark.skipif(not installed(), reason=f"deepspeed {INSTALL_HINT}")
    return [pytest.param(i, marks=missing) if i.strategy == "deepspeed" else i
            for i in presets.list_presets() if i.source == "shipped"]


@pytest.mark.parametrize("info", _shipped(), ids=lambda i: i.name)
def test_every_shipped_preset_is_valid(info):
    cfg = preflight.load(info.path, hw=GPU8)
    assert cfg.name == info.name, "the name inside a preset matches its file name"
    assert info.description and cfg.description == info.description
    assert info.strategy == cfg.strategy
    assert world_size(cfg) >= 1 and global_batch(cfg) >= cfg.train.batch_size
    assert preflight.loads(c.dumps(cfg), hw=GPU8) == cfg
    if _needs_cuda(info.path):
        with pytest.raises(ConfigError) as err:
            preflight.load(info.path, hw=NO_GPU)
        assert "accelerator" in err.value.by_field()
        assert "NVIDIA GPU" in str(err.value)
    else:
        assert preflight.load(info.path, hw=NO_GPU) == cfg


def test_own_presets_are_shipped_with_what_issue_2_asks():
    names = {i.name for i in presets.list_presets() if i.source == "shipped"}
    assert set(OWN) <= names
    q = preflight.load(presets.resolve(presets.DEFAULT_PRESET), hw=NO_GPU)
    assert (q.strategy, q.accelerator, q.devices, q.resolved_backend, q.data.dataset) == ("ddp", "cpu", 2, "gloo", "synthetic")
    assert world_size(q) == 2
    ddp_gpu = preflight.load(presets.resolve("ddp-gpu"), hw=Hardware(gpu_count=4))
    assert ddp_gpu.devices == [0, 1, 2, 3] and ddp_gpu.resolved_backend == "nccl"
    gpu = preflight.load(presets.resolve("gpu"), hw=GPU8)
    assert gpu.train.precision == "bf16-mixed" and gpu.model.name == "resnet18" and world_size(gpu) == 1
    assert presets.list_presets()[0].name == presets.DEFAULT_PRESET


def test_resolve_names_paths_and_unknowns(user_dir, tmp_path):
    assert presets.resolve("quickstart") == shipped_presets_dir() / "quickstart.yaml"
    f = tmp_path / "mine.yaml"
    f.write_text("strategy: cpu\n")
    assert presets.resolve(str(f)) == f
    with pytest.raises(ConfigError) as err:
        presets.resolve("quikstart")
    assert "did you mean 'quickstart'" in str(err.value) and "ddp-cpu" in str(err.value)
    with pytest.raises(ConfigError) as err:
        presets.resolve(str(tmp_path / "missing.yaml"))
    assert "no such preset file" in str(err.value)


def test_save_load_delete_user_preset(user_dir):
    before = _shipped_digest()
    cfg = preflight.load(presets.resolve("quickstart"))
    cfg.train.batch_size = 32
    cfg.description = "mine"
    path = presets.save_user_preset(cfg, "my-ddp")
    assert path.parent == user_dir and path.is_file()

    info = {i.name: i for i in presets.list_presets()}["my-ddp"]
    assert (info.source, info.strategy, info.description) == ("user", "ddp", "mine")
    back = preflight.load(presets.resolve("my-ddp"))
    assert back.name == "my-ddp"
    cfg.name = "my-ddp"
    assert back == cfg

    with pytest.raises(presets.PresetExists):
        presets.save_user_preset(cfg, "my-ddp")
    cfg.train.batch_size = 16
    presets.save_user_preset(cfg, "my-ddp", overwrite=True)
    assert preflight.load(presets.resolve("my-ddp")).train.batch_size == 16

    presets.delete_user_preset("my-ddp")
    assert not path.exists()
    with pytest.raises(ConfigError):
        presets.resolve("my-ddp")
    with pytest.raises(ConfigError):
        presets.delete_user_preset("my-ddp")
    assert _shipped_digest() == before


def test_shipped_presets_are_never_overwritten_or_deleted(user_dir):
    before = _shipped_digest()
    cfg = preflight.load(presets.resolve("cpu"))
    for name in ("quickstart", "cpu"):
        with pytest.raises(ConfigError) as err:
            presets.save_user_preset(cfg, name, overwrite=True)
        assert "shipped" in str(err.value)
        with pytest.raises(ConfigError):
            presets.delete_user_preset(name)
    for bad in ("", "../evil", "a/b", ".hidden", "sp ace"):
        with pytest.raises(ConfigError) as err:
            presets.save_user_preset(cfg, bad)
        assert "name" in err.value.by_field()
    assert _shipped_digest() == before
    assert not any(user_dir.parent.parent.rglob("*.yaml"))


def test_user_file_with_a_shipped_name_is_listed_separately(user_dir):
    user_dir.mkdir(parents=True)
    (user_dir / "cpu.yaml").write_text("name: cpu\ndescription: my cpu\nstrategy: cpu\n")
    (user_dir / "broken.yaml").write_text("strategy: [cpu\n")
    listed = [(i.name, i.source) for i in presets.list_presets()]
    assert ("cpu", "shipped") in listed and ("cpu", "user") in listed
    assert ("broken", "user") in listed  # listed, not hidden, so the user can find and fix it
    assert presets.resolve("cpu") == shipped_presets_dir() / "cpu.yaml"
    assert presets.resolve("user:cpu") == user_dir / "cpu.yaml"
    with pytest.raises(ConfigError) as err:
        preflight.load(presets.resolve("broken"))
    assert "broken YAML at line 2, column 1" in str(err.value)


def test_a_saved_preset_holds_what_differs_from_the_defaults_in_one_style(user_dir):
    """Issue 14 rough edge 11: a saved preset held every setting, some sections as `{...}` flow
    mappings and others as blocks. Now: only what differs from the defaults (plus schema_version
    and name), mappings as blocks and lists inline, as the shipped presets are written."""
    import yaml

    cfg = preflight.load(presets.resolve("quickstart"))
    cfg.train.batch_size = 32
    cfg.optimizer.betas = [0.8, 0.99]
    cfg.model.kwargs = {"depth": 4}
    text = presets.save_user_preset(cfg, "mine").read_text()
    assert yaml.safe_load(text) == {
        "schema_version": 1, "name": "mine",
        "description": "CPU quick start: 2 DDP ranks over gloo, small CNN on built-in synthetic images",
        "strategy": "ddp", "devices": 2, "backend": "gloo",
        "model": {"kwargs": {"depth": 4}}, "optimizer": {"betas": [0.8, 0.99]}, "train": {"batch_size": 32}}
    assert "optimizer:\n  betas: [0.8, 0.99]\n" in text and "model:\n  kwargs:\n    depth: 4\n" in text
    cfg.name = "mine"
    assert preflight.load(presets.resolve("mine")) == cfg
    # the resolved configs a run directory and an sbatch script hold are complete, in the same style
    full = c.dumps(cfg)
    assert "{" not in full.replace("kwargs: {}", "").replace("env: {}", "") and "betas: [0.8, 0.99]" in full
    assert preflight.loads(full) == cfg


def test_lm_presets_train_a_gpt_on_text_on_two_cpu_ranks_and_on_every_gpu():
    """Issue 30 item 5: lm-cpu is 2 DDP ranks over gloo on the built-in corpus, its description
    stating the val loss it reaches; lm-gpu takes every GPU (a 2-GPU host here), bf16, compiled
    (for MFU), a larger GPT; both keep the text in the rank (no loader process)."""
    import re

    from torchdeck.engine.data import build_datasets
    from torchdeck.engine.models import build_model

    cpu = preflight.load(presets.resolve("lm-cpu"), hw=NO_GPU)
    assert (cpu.strategy, cpu.accelerator, cpu.devices, cpu.resolved_backend) == ("ddp", "cpu", 2, "gloo")
    assert (cpu.model.name, cpu.data.dataset, cpu.data.root, cpu.data.num_workers) == ("gpt", "text", "", 0)
    assert world_size(cpu) == 2 and re.search(r"val loss [\d.]+", cpu.description)
    from torchdeck.engine import cache

    assert cache.plan(cpu, 2).line == "data: text, the built-in corpus (1 MiB, generated), held in memory by each rank"
    gpu = preflight.load(presets.resolve("lm-gpu"), hw=Hardware(gpu_count=2))
    assert (gpu.strategy, gpu.devices, gpu.resolved_backend, world_size(gpu)) == ("ddp", [0, 1], "nccl", 2)
    assert gpu.train.precision == "bf16-mixed" and gpu.train.compile and gpu.data.num_workers == 0
    assert (gpu.model.name, gpu.data.dataset, gpu.data.root) == ("gpt", "text", "")
    _, _, info = build_datasets(cpu)
    small, large = build_model(cpu, info), build_model(gpu, info)
    assert large.flops_per_token() > 10 * small.flops_per_token()
