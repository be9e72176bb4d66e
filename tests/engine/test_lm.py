"""The built-in language-model workload: the gpt model, the text data set and its default corpus,
MFU's arithmetic, the lm presets' runs. Real tensors, real files; no mocks."""
from __future__ import annotations

import hashlib
import math
import random

import pytest
import torch

from torchdeck.engine import config as c
from torchdeck.engine.config import RunConfig
from torchdeck.engine.data import DataError, build_datasets
from torchdeck.engine.models import GPT, ModelError, build_model, mfu, model_flops_per_token, peak_flops
from torchdeck.engine.text import DEFAULT_BYTES, default_corpus

# sha256 of the built-in corpus: the lm presets' stated val losses are measured on exactly these
# bytes. Changing the generator changes this, and those numbers must be measured again.
CORPUS_SHA256 = "1371b6598f9b31bdbb8aca2370cbf52c390ad72c262231e0748e50a746d19833"


def _text_cfg(root: str = "", block: int = 16) -> RunConfig:
    cfg = RunConfig()
    cfg.data.dataset, cfg.data.root = "text", root
    cfg.model.name, cfg.model.block_size = "gpt", block
    cfg.model.n_layer, cfg.model.n_head, cfg.model.n_embd = 2, 2, 32
    return cfg


def test_gpt_shapes_causal_mask_initial_loss_and_flops():
    torch.manual_seed(0)
    model = GPT(vocab_size=256, block_size=16, n_layer=2, n_head=2, n_embd=32).eval()
    x = torch.randint(0, 256, (3, 16))
    out = model(x)
    assert out.logits.shape == (3, 16, 256) and "loss" not in out
    # causal: changing the tokens after position 7 leaves positions 0..7's logits as they were
    y = x.clone()
    y[:, 8:] = torch.randint(0, 256, (3, 8))
    same = model(y).logits
    assert torch.allclose(out.logits[:, :8], same[:, :8], atol=1e-6)
    assert not torch.allclose(out.logits[:, 8:], same[:, 8:], atol=1e-3)
    # with labels: the HF-style output carries the mean cross-entropy, ln(256) at init
    labeled = model(input_ids=x, labels=torch.roll(x, -1, 1))
    assert labeled["loss"] is labeled.loss and labeled.loss.dim() == 0
    assert abs(labeled.loss.item() - math.log(256)) < 0.1
    # the head is the token embedding (tied), and FLOPs per token are nanoGPT's 6N + 12 L H Q T
    assert model.head.weight is model.tok_emb.weight
    n = sum(p.numel() for p in model.parameters()) - 16 * 32  # without the position embedding
    assert model.flops_per_token() == 6 * n + 12 * 2 * 2 * 16 * 16
    ddp_like = torch.nn.Module()
    ddp_like.module = model  # what DDP and torch.compile wrap it in: .module / ._orig_mod
    assert model_flops_per_token(ddp_like) == model.flops_per_token()
    assert model_flops_per_token(torch.nn.Linear(2, 2)) is None
    with pytest.raises(ValueError, match="block_size"):
        model(torch.zeros(1, 17, dtype=torch.long))


def test_mfu_arithmetic_and_the_peak_table():
    assert peak_flops("NVIDIA H100 80GB HBM3") == 989e12
    assert peak_flops("NVIDIA H100 PCIe") == 756e12
    assert peak_flops("NVIDIA H200") == 989e12
    assert peak_flops("NVIDIA A100-SXM4-80GB") == 312e12
    assert peak_flops("Tesla T4") is None and peak_flops(None) is None and peak_flops("cpu") is None
    assert mfu(6e6, 1e6, "NVIDIA H100 80GB HBM3") == pytest.approx(6e12 / 989e12)
    assert mfu(6e6, 1e6, "NVIDIA A100-SXM4-40GB") == pytest.approx(6e12 / 312e12)
    assert mfu(6e6, 1e6, "Some Future GPU") is None
    assert mfu(None, 1e6, "NVIDIA H200") is None and mfu(6e6, None, "NVIDIA H200") is None


def test_text_set_split_windows_and_determinism(tmp_path):
    raw = bytes(random.Random(0).choices(range(32, 127), k=3800))
    (tmp_path / "a.txt").write_bytes(raw)
    cfg = _text_cfg(str(tmp_path / "a.txt"))
    train, val, info = build_datasets(cfg)
    assert (info.vocab_size, info.block_size) == (256, 16) and info.name.startswith("text:")
    n_val = len(raw) // 10
    assert bytes(val.data.tolist()) == raw[-n_val:] and bytes(train.data.tolist()) == raw[:-n_val]
    s = train[5]
    assert set(s) == {"input_ids", "labels"} and s["input_ids"].dtype == torch.int64
    assert s["input_ids"].shape == s["labels"].shape == (16,)
    assert torch.equal(s["input_ids"][1:], s["labels"][:-1])  # labels: the next byte
    o = int(train.offsets[5])
    assert bytes(s["input_ids"].tolist()) == raw[o:o + 16]
    batch = train.__getitems__([5, 0, 9])
    assert all(torch.equal(batch[i]["labels"], train[j]["labels"]) for i, j in enumerate((5, 0, 9)))
    assert len(train) == (len(raw) - n_val) // 16
    assert len(val) == len(range(0, n_val - 16, 16))  # end to end over the val split
    # the same windows in every build (every rank), whatever torch's global seed is
    torch.manual_seed(123)
    again, _, _ = build_datasets(cfg)
    assert torch.equal(again.offsets, train.offsets)
    # the gpt model is sized from the data: vocab 256, context = the windows
    model = build_model(cfg, info)
    assert model.vocab_size == 256 and model.block_size == 16


def test_text_folder_and_clear_errors(tmp_path):
    folder = tmp_path / "books"
    (folder / "sub").mkdir(parents=True)
    (folder / "b.txt").write_text("b" * 300)
    (folder / "sub" / "a.txt").write_text("a" * 300)
    (folder / "skip.md").write_text("m" * 300)
    train, val, info = build_datasets(_text_cfg(str(folder)))
    data = bytes(train.data.tolist()) + bytes(val.data.tolist())
    assert data == b"b" * 300 + b"\n" + b"a" * 300 + b"\n"  # sorted paths, .txt only
    (tmp_path / "empty").mkdir()
    (tmp_path / "short.txt").write_text("x" * 100)
    for root, words in (("missing", ("no such file or folder", "data.root")),
                        ("empty", ("no .txt file", "data.root")),
                        ("short.txt", ("too little text", "model.block_size"))):
        with pytest.raises(DataError) as err:
            build_datasets(_text_cfg(str(tmp_path / root)))
        assert all(w in str(err.value) for w in words), str(err.value)
    cfg = _text_cfg()
    cfg.model.kwargs = {"n_layers": 3}
    with pytest.raises(ModelError, match="n_layers"):
        build_model(cfg, build_datasets(cfg)[2])
    cfg = RunConfig()
    cfg.model.name, cfg.data.train_size, cfg.data.val_size = "gpt", 64, 16
    with pytest.raises(ModelError, match="token data"):
        build_model(cfg, build_datasets(cfg)[2])  # synthetic images have no vocabulary
    cfg.model.n_head, cfg.model.n_embd = 3, 128
    assert "model.n_embd" in dict(c.validate(cfg))


def test_default_corpus_is_fixed_and_used_for_an_empty_root():
    corpus = default_corpus()
    assert len(corpus) == DEFAULT_BYTES
    assert hashlib.sha256(corpus).hexdigest() == CORPUS_SHA256
    assert corpus.isascii() and corpus.count(b"\n\n") > 1000
    train, val, info = build_datasets(_text_cfg(""))
    assert info.name == "text:builtin" and len(train.data) + len(val.data) == DEFAULT_BYTES


def test_mfu_is_reported_only_for_a_compiled_model_on_a_gpu():
    from torchdeck.engine.models import mfu_meter

    model = GPT(vocab_size=256, block_size=16, n_layer=1, n_head=1, n_embd=16)
    assert mfu_meter(model, True, torch.device("cpu")) is None  # on the CPU: no MFU
    assert mfu_meter(model, False, torch.device("cuda", 0)) is None  # not compiled: none either


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_mfu_meter_on_this_gpu():
    from torchdeck.engine.models import mfu_meter

    dev = torch.device("cuda", 0)
    model = GPT(vocab_size=256, block_size=16, n_layer=1, n_head=1, n_embd=16)
    meter = mfu_meter(model, True, dev)
    peak = peak_flops(torch.cuda.get_device_name(dev))
    if peak is None:
        assert meter is None
    else:
        assert meter(1e6) == pytest.approx(model.flops_per_token() * 1e6 / peak)


@pytest.mark.slow
def test_lm_cpu_preset_trains_through_torchdeck_run(tmp_path):
    """`torchdeck run lm-cpu`, cut to 30 steps: 2 DDP ranks on the built-in corpus learn (val loss
    below what byte frequencies alone give), step events say tokens/s and no accuracy, no MFU on the CPU, and the
    epoch's end says perplexity."""
    import json
    import os
    import subprocess
    import sys

    env = dict(os.environ, TORCHDECK_RUNS=str(tmp_path))
    p = subprocess.run([sys.executable, "-m", "torchdeck.cli", "run", "lm-cpu", "--set", "train.max_steps=30"],
                       capture_output=True, text=True, env=env, timeout=240)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    (events_path,) = tmp_path.glob("*/events.jsonl")
    evs = [json.loads(line) for line in events_path.read_text().splitlines() if line.strip()]
    steps = [e for e in evs if e["kind"] == "step"]
    assert {e["rank"] for e in steps} == {0, 1} and max(e["step"] for e in steps) == 30
    assert all(e["tokens_per_s"] > 0 and e["accuracy"] is None and e.get("mfu") is None for e in steps)
    (end,) = [e for e in evs if e["kind"] == "epoch_end" and e["rank"] == 0]
    assert end["val_loss"] < 2.7, end  # 5.55 at the start; byte frequencies alone give ~3 (2.40 seen)
    assert end["val_metrics"]["perplexity"] == pytest.approx(math.exp(end["val_loss"]), rel=1e-3)
    assert "perplexity" in p.stdout and "tokens/s" in p.stdout


def test_text_runs_start_no_loader_process_at_auto_workers():
    """The text is in memory (a batch is one gather): data.num_workers -1 starts no loader worker
    per rank, as for tensor sets, and a SLURM job asks no CPUs for them; a number given is kept."""
    from types import SimpleNamespace

    from torchdeck.engine.cache import asked_workers
    from torchdeck.engine.data import TrainData

    cfg = _text_cfg()
    assert cfg.data.num_workers == -1
    ctx = SimpleNamespace(local_world_size=1)
    assert TrainData(cfg, ctx, None).workers == 0
    assert asked_workers(cfg, 2) == 0
    cfg.data.num_workers = 1
    assert asked_workers(cfg, 2) == 1


def test_validate_counts_the_text_windows_without_reading_the_text(tmp_path):
    """The run's length before any rank exists (validate, run_started's epoch total), from the
    files' sizes: the same count of training windows the data set then holds, for the built-in
    corpus, a file, and a folder whose files end in newlines (read_root keeps one of them)."""
    import subprocess
    import sys

    from torchdeck.engine.preflight import length, train_samples
    from torchdeck.engine.text import text_datasets

    (tmp_path / "one.txt").write_bytes(b"abc def\n" * 700)
    folder = tmp_path / "many"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.txt").write_bytes(b"x" * 5000 + b"\n\n\n")
    (folder / "sub" / "b.txt").write_bytes(b"y" * 3001)
    (folder / "c.txt").write_bytes(b"\n" * 5000 + b"z" * 900 + b"\n" * 9000)
    for root in ("", str(tmp_path / "one.txt"), str(folder)):
        cfg = _text_cfg(root, block=32)
        train, _, _ = text_datasets(root, 32)
        assert train_samples(cfg) == len(train), root
    cfg = _text_cfg("", block=32)
    cfg.train.batch_size, cfg.train.epochs = 16, 2
    spe = len(text_datasets("", 32)[0]) // 16
    assert length(cfg, shards=1).said().startswith(f"ends at step {2 * spe:,}: 2 epochs x {spe:,} steps")
    # counted with no torch: the supervisor plans without importing it
    code = ("import sys; from torchdeck.engine.text import root_size, train_windows; "
            "print(train_windows(root_size(''), 64), 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out[1] == "False" and int(out[0]) == len(text_datasets("", 64)[0])
