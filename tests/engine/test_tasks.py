"""Any task in torchdeck's own loop (issue 30): a HuggingFace causal LM built from a config (random
weights, no download) on dict batches, through `torchdeck run` with every process-group strategy;
a regression (train.loss: mse, float targets, data without image fields); a loss callable's extra
metrics into the events and metrics.csv; the refusals and the decision said once.

The whole runs are tiny (a few steps each); the user's code is a module written into the test's
folder, found there as a user's is (engine/usercode.py).
"""
from __future__ import annotations

import csv
import importlib.util
import json
import math
import os
import subprocess

import pytest
import torch

from torchdeck.engine import config as cfgmod
from torchdeck.engine import preflight
from torchdeck.engine.events import read_all
from torchdeck.engine.strategies import deepspeed as ds
from tests.engine.helpers import assert_same_weights, cli_cmd, final_model, run_in_process, small_cfg

needs_transformers = pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                                        reason="the test extra: pip install transformers")

USER = '''
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset, TensorDataset

VOCAB, T = 64, 16


class Tokens(Dataset):
    """Arithmetic sequences mod VOCAB (a start and a stride per sample): an LM learns the next token
    within a few steps. Every sample ends in 4 padding positions (attention_mask 0, labels -100):
    the same real tokens per sample, so the model's loss, a mean over a batch's tokens, averaged
    over 2 ranks' batches is the mean over both (DDP equals one process with the double batch)."""

    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        start = torch.randint(0, VOCAB, (n, 1), generator=g)
        stride = torch.randint(1, 3, (n, 1), generator=g)
        self.ids = (start + stride * torch.arange(T)) % VOCAB
        self.mask = torch.ones_like(self.ids)
        self.mask[:, -4:] = 0
        self.labels = self.ids.masked_fill(self.mask == 0, -100)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": self.mask[i], "labels": self.labels[i]}


def lm_data(cfg):
    # 63 val samples: 2 ranks' shards are 32 and 31, the short one padded to an equal count of forwards
    return Tokens(512, 1), Tokens(63, 2), {"vocab_size": VOCAB}


def gpt2(info):
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=info.vocab_size, n_positions=32,
                                      bos_token_id=0, eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0,
                                      attn_pdrop=0.0))


class TinyLM(torch.nn.Module):
    """Embedding and head: model(**batch) -> {"loss", "logits"} (a dict: the loss read as ["loss"])."""

    def __init__(self, vocab):
        super().__init__()
        self.emb, self.head = torch.nn.Embedding(vocab, 16), torch.nn.Linear(16, vocab)

    def forward(self, input_ids, attention_mask=None, labels=None):
        logits = self.head(self.emb(input_ids))
        out = {"logits": logits}
        if labels is not None:
            out["loss"] = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
        return out


def tiny_lm(info):
    return TinyLM(info.vocab_size)


def tabular(cfg):
    """Rows of 4 features, a float target: no image, no classes."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(576, 4, generator=g)
    y = x @ torch.tensor([1.0, -2.0, 0.5, 3.0]) + 0.05 * torch.randn(576, generator=g)
    return TensorDataset(x[:512], y[:512]), TensorDataset(x[512:], y[512:])


def regressor(info):
    return torch.nn.Sequential(torch.nn.Linear(4, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))


def mse_and_mae(out, batch):
    x, y = batch
    pred = out.squeeze(-1)
    return F.mse_loss(pred, y), {"mae": (pred - y).abs().mean(), "seen": 1.0}
'''

HF_OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


@pytest.fixture
def user(tmp_path, monkeypatch):
    (tmp_path / "taskmod.py").write_text(USER)
    monkeypatch.syspath_prepend(str(tmp_path))
    for k, v in HF_OFFLINE.items():
        monkeypatch.setenv(k, v)
    return tmp_path


def final_path(run):
    from torchdeck.engine import checkpoint as ckpt

    return ckpt.latest(run / "checkpoints")[0]


def lm_cfg(strategy="cpu", devices=1, **over) -> dict:
    base = {"name": f"lm-{strategy}", "strategy": strategy, "devices": devices, "nodes.master_port": 0,
            "model": {"name": "taskmod:gpt2"}, "data": {"dataset": "taskmod:lm_data"},
            "optimizer.name": "sgd", "optimizer.lr": 0.5, "optimizer.momentum": 0.9,
            "train.batch_size": 32 // devices, "train.epochs": 1, "train.max_steps": 10,
            "train.eval_every_epoch": True, "train.log_every_n_steps": 2}
    base.update(over)
    cfg = small_cfg(**base)
    cfg["data"] = {"dataset": "taskmod:lm_data", "num_workers": 0}  # no loader processes to start: seconds
    return cfg


def torchdeck_run(tmp_path, cfg: dict, name: str):
    """`torchdeck run FILE` as a user runs it, from the folder holding their module."""
    preset = tmp_path / f"{name}.yaml"
    cfgmod.save(cfgmod.from_dict(cfg), preset)
    env = dict(os.environ, TORCHDECK_RUNS=str(tmp_path / "runs"), **HF_OFFLINE)
    proc = subprocess.run(cli_cmd() + ["run", str(preset)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=240)
    runs = [p for p in (tmp_path / "runs").iterdir() if p.name.endswith("-" + cfg["name"])]
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:] + "".join(
        f.read_text()[-3000:] for r in runs for f in r.glob("rank*.log"))
    assert len(runs) == 1
    return runs[0], read_all(runs[0] / "events.jsonl")


START = math.log(64)  # an untrained LM's loss over 64 tokens: a uniform guess (its first steps' loss is within 1 %)


def check_lm_run(events: list[dict], world: int) -> None:
    """Exit 0 was checked; here: the loss decided once as the model's own, val loss down by a
    stated margin (20 % below the untrained model's ln 64), no accuracy, tokens/s on every rank."""
    started = next(e for e in events if e["kind"] == "run_started")
    assert started["loss"] == "auto (decided on the first batch)"
    said = [e["message"] for e in events if e["kind"] == "log" and str(e.get("message", "")).startswith("loss:")]
    assert said == ["loss: the model's own (output.loss)"]
    end = [e for e in events if e["kind"] == "epoch_end"][-1]
    steps = [e for e in events if e["kind"] == "step"]
    assert steps[0]["loss"] == pytest.approx(START, rel=0.03)  # where it started
    assert end["val_loss"] < 0.8 * START, end["val_loss"]
    assert end["val_acc"] is None and end["train_acc"] is None
    assert end["val_metrics"]["perplexity"] == pytest.approx(math.exp(end["val_loss"]))
    assert all(e["accuracy"] is None for e in steps)
    assert {e["rank"] for e in steps} == set(range(world))
    # 16 positions, 4 of them padding: 12 real tokens a sample
    assert all(e["tokens_per_s"] == pytest.approx(12 * e["samples_per_s"]) for e in steps)


@needs_transformers
@pytest.mark.slow
def test_hf_causal_lm_trains_through_torchdeck_run_on_every_strategy(user, tmp_path):
    """cpu (batch 32), then 2-rank ddp, fsdp and deepspeed (2 x 16): each exits 0 with its val loss
    20 % below the untrained model's; DDP's weights and val loss equal the one process's after the
    same 10 steps (the equivalence tests' check, on this task), and so does its val loss, though
    rank 1's last val batch is padded (the model's own loss must see only the real samples)."""
    strategies = [("cpu", 1), ("ddp", 2), ("fsdp", 2)] + ([("deepspeed", 2)] if ds.installed() else [])
    runs = {}
    for strategy, world in strategies:
        runs[strategy], events = torchdeck_run(tmp_path, lm_cfg(strategy, world), f"lm-{strategy}")
        check_lm_run(events, world)
        runs[strategy + "-val"] = [e["val_loss"] for e in events if e["kind"] == "epoch_end" and e["rank"] == 0]
    a, b = final_model(runs["ddp"]), final_model(runs["cpu"])
    assert a["step"] == b["step"] == 10
    assert_same_weights(a["model"], b["model"])
    assert runs["ddp-val"] == pytest.approx(runs["cpu-val"], rel=1e-5)
    # `torchdeck eval`'s engine on the cpu run's checkpoint: the model's own loss, its perplexity, no accuracy
    from torchdeck.engine.evaluate import evaluate

    res = evaluate(final_path(runs["cpu"]))
    assert res["loss"] == pytest.approx(runs["cpu-val"][-1], rel=1e-5) and res["accuracy"] is None
    assert res["metrics"]["perplexity"] == pytest.approx(math.exp(res["loss"]))
    assert res["loss_rule"] == "loss: the model's own (output.loss)" and res["samples"] == 63


@pytest.mark.slow
def test_a_loss_callables_metrics_reach_events_and_metrics_csv(user, tmp_path):
    """A regression on tabular data (no image fields anywhere) with a loss callable returning
    (loss, {mae, seen}): each step event and epoch end carries them, and metrics.csv has them in
    its JSON columns, the header the same from the first row."""
    cfg = small_cfg(**{"name": "reg", "model.name": "taskmod:regressor", "train.loss": "taskmod:mse_and_mae",
                       "train.eval_every_epoch": True, "train.max_steps": 0, "train.epochs": 2,
                       "optimizer.lr": 0.02})
    cfg["data"] = {"dataset": "taskmod:tabular"}
    run, events = torchdeck_run(tmp_path, cfg, "reg")
    assert [e["message"] for e in events if e["kind"] == "log" and e["message"].startswith("loss:")] == \
        ["loss: taskmod:mse_and_mae"]
    steps = [e for e in events if e["kind"] == "step"]
    assert all(set(e["metrics"]) == {"mae", "seen"} and e["metrics"]["seen"] == 1.0 for e in steps)
    assert all(e["accuracy"] is None and e["tokens_per_s"] is None for e in steps)
    ends = [e for e in events if e["kind"] == "epoch_end"]
    assert len(ends) == 2 and ends[-1]["val_loss"] < ends[0]["val_loss"]
    assert set(ends[-1]["val_metrics"]) == set(ends[-1]["train_metrics"]) == {"mae", "seen"}
    assert ends[-1]["val_acc"] is None and ends[-1]["train_acc"] is None
    with open(run / "metrics.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert all(None not in r for r in rows)  # as many cells as header columns, in every row
    got = [json.loads(r["metrics"]) for r in rows if r["kind"] == "step"]
    assert got == [e["metrics"] for e in steps]
    val = [json.loads(r["val_metrics"]) for r in rows if r["kind"] == "epoch_end"]
    assert val == [e["val_metrics"] for e in ends]
    assert all(r["accuracy"] == "" for r in rows if r["kind"] == "step")
    # `torchdeck eval`'s engine on its checkpoint: the same loss rule, its metrics, no accuracy
    from torchdeck.engine.evaluate import evaluate

    res = evaluate(final_path(run))
    assert res["loss"] == pytest.approx(ends[-1]["val_loss"], rel=1e-5) and res["accuracy"] is None
    assert res["metrics"] == pytest.approx(ends[-1]["val_metrics"], rel=1e-5)
    assert res["loss_rule"] == "loss: taskmod:mse_and_mae"


def test_regression_with_mse_on_data_without_image_fields(user, tmp_path):
    """train.loss mse, float targets, a data callable that says nothing about images: trains, says
    its loss once, no accuracy anywhere; the built-in image models name what they would need."""
    cfg = small_cfg(**{"model.name": "taskmod:regressor", "train.loss": "mse", "train.eval_every_epoch": True,
                       "train.max_steps": 0, "train.epochs": 2, "optimizer.lr": 0.02})
    cfg["data"] = {"dataset": "taskmod:tabular"}
    ev = run_in_process(tmp_path / "mse", cfg)
    assert [e["message"] for e in ev if e["kind"] == "log" and e["message"].startswith("loss:")] == ["loss: mse"]
    ends = [e for e in ev if e["kind"] == "epoch_end"]
    assert ends[-1]["val_loss"] < 0.5 * ends[0]["val_loss"] and ends[-1]["val_acc"] is None
    assert all(e["accuracy"] is None for e in ev if e["kind"] == "step")
    from torchdeck.engine.data import DataError, build_datasets
    from torchdeck.engine.models import build_model

    c = cfgmod.from_dict(cfg)
    from torchdeck.engine import memory

    est = memory.estimate(c)  # `validate --memory`: a real batch of the data callable, measured
    assert not est.note and est.params == 4 * 32 + 32 + 32 + 1 and est.device_mb["activations"] > 0
    _, _, info = build_datasets(c)
    assert getattr(info, "image_size", None) is None and info.get("num_classes") is None
    c.model.name = "mlp"
    with pytest.raises(DataError, match="has no in_channels.*cnn, mlp and resnet18 need in_channels, image_size"):
        build_model(c, info)


def test_validate_memory_measures_a_dict_batch(user):
    """`validate --memory` on a dict data callable: one real batch through model(**batch) and its
    own loss, not "not estimated"."""
    from torchdeck.engine import memory

    cfg = cfgmod.from_dict({**lm_cfg(), "model": {"name": "taskmod:tiny_lm"}})
    est = memory.estimate(cfg)
    assert not est.note and est.params == 64 * 16 + 16 * 64 + 64
    # per sample: at least the logits of its 16 positions over 64 tokens, in fp32, kept for the backward
    assert est.device_mb["activations"] * 2 ** 20 >= cfg.train.batch_size * 16 * 64 * 4
    assert "memory per rank" in memory.lines(cfg)[0]


def test_dict_batches_without_a_loss_are_refused_saying_what_to_set(user, tmp_path):
    """A dict batch whose model returns no loss and whose targets are floats: one error naming
    train.loss's choices, not a traceback from cross_entropy."""
    from torchdeck.engine.losses import Loss, LossError

    loss = Loss("auto")
    batch = {"x": torch.randn(4, 3), "labels": torch.randn(4)}
    x, y = loss.split(batch)
    with pytest.raises(LossError, match="Set train.loss mse or bce"):
        loss(torch.randn(4, 1), y, batch)


def test_validate_says_the_loss_and_model_parallel_refuses_dict_batches(user, tmp_path):
    cfg = cfgmod.from_dict(lm_cfg())
    assert "loss: auto, decided on the first batch" in "\n".join(preflight.describe(cfg))
    cfg.train.loss = "cross_entopy"
    assert ("train.loss", "must be one of auto, cross_entropy, mse, bce or 'package.module:callable'; got "
                          "'cross_entopy'; did you mean 'cross_entropy'?") in preflight.validate(cfg)
    cfg.train.loss = "taskmod:nothing_here"
    assert any(f == "train.loss" and "nothing_here" in why for f, why in preflight.file_problems(cfg))
    mp = cfgmod.from_dict(small_cfg(**{"strategy": "model-parallel", "devices": 2, "data.dataset": "text",
                                       "model.name": "gpt"}))
    assert any("model-parallel splits an nn.Sequential" in why for _, why in preflight.validate(mp))
    from torchdeck.engine.models import ModelError
    from torchdeck.engine.strategies._pipeline import Pipeline

    pipe = Pipeline(torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 2)), ["cpu", "cpu"])
    with pytest.raises(ModelError, match=r"a dict \(input_ids\).*use ddp, fsdp"):
        pipe(input_ids=torch.zeros(2, 3, dtype=torch.long))


def test_deepspeed_casts_a_dict_batchs_floats_and_keeps_its_token_ids():
    """Under bf16/fp16 DeepSpeed's weights are bf16/fp16 and its forward switches autocast off: the
    batch is cast on the way in, by name too (model(**batch)); token ids and masks stay integers."""
    from torchdeck.engine.strategies._deepspeed import _cast_inputs

    class Probe(torch.nn.Module):
        def forward(self, pixels=None, input_ids=None):
            return pixels.dtype, input_ids.dtype

    m = Probe()
    m.register_forward_pre_hook(_cast_inputs(torch.bfloat16), with_kwargs=True)
    assert m(pixels=torch.randn(2, 3), input_ids=torch.zeros(2, 3, dtype=torch.long)) == (torch.bfloat16, torch.long)


def test_auto_takes_the_loss_a_model_returns_first_in_a_tuple():
    """A HuggingFace model called with return_dict=False and labels returns (loss, logits, ...):
    auto trains on that loss and reads the logits behind it (token logits: perplexity), as it does
    for output.loss; a tuple of logits alone still gets cross-entropy."""
    from torchdeck.engine.losses import ClassCrossEntropy, Loss, OwnLoss

    class TupleLM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(16, 16)

        def forward(self, input_ids, labels=None):
            logits = self.emb(input_ids)
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 16), labels.reshape(-1))
            return (loss, logits)

    model = TupleLM()
    ids = torch.randint(0, 16, (4, 8))
    batch = {"input_ids": ids, "labels": ids}
    loss_fn = Loss("auto")
    inputs, targets = loss_fn.split(batch)
    out = model(**inputs)
    loss, extras = loss_fn(out, targets, batch)
    assert isinstance(loss_fn.rule, OwnLoss) and "first element of its output tuple" in loss_fn.said
    assert loss is out[0] and loss_fn.tokens and not loss_fn.classification and extras is None
    loss.backward()
    assert model.emb.weight.grad is not None

    clf = Loss("auto")  # (logits, features): no loss in it, cross-entropy on the integer targets
    x, y = torch.randn(4, 3, requires_grad=True), torch.tensor([0, 2, 1, 0])
    loss, _ = clf((x, torch.randn(4, 5)), y, (x, y))
    assert isinstance(clf.rule, ClassCrossEntropy) and clf.classification
    assert torch.allclose(loss, torch.nn.functional.cross_entropy(x, y))
