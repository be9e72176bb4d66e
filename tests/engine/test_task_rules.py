"""A fast test per task rule (TESTING.md, "A fast test per rule"): each calls the rule itself and
fails naming it. When a copy of the code was broken one way at a time, these rules were caught
only by the slow HuggingFace run of test_tasks.py, or by nothing. The last tests run the rules
together, in process (one rank) and on 2 real gloo ranks, in seconds.
"""
from __future__ import annotations

import importlib.util
import json
import math
import os
import time

import pytest
import torch
import torch.nn.functional as F

from torchdeck.engine.batch import forward, to_device, token_count
from torchdeck.engine.losses import Loss, OwnLoss
from tests.engine.helpers import assert_same_weights, assert_trained, final_model, run_in_process, small_cfg

needs_transformers = pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                                        reason="the test extra: pip install transformers")

VOCAB, T, PAD = 32, 8, 2


def lm_batch(b=4, pad=PAD, seed=0) -> dict:
    """Token ids, an attention mask whose last `pad` positions are padding, labels -100 there."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (b, T), generator=g)
    mask = torch.ones_like(ids)
    if pad:
        mask[:, -pad:] = 0
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


class KeywordLM(torch.nn.Module):
    """forward(*, input_ids, ...): keyword-only, as a dict batch reaches a HuggingFace model
    (model(batch) raises TypeError). Returns {"loss", "logits"}; `own` replaces its loss by a
    fixed value, so the model's own loss cannot be mistaken for cross-entropy of its logits."""

    def __init__(self, own: float | None = None):
        super().__init__()
        self.emb, self.head = torch.nn.Embedding(VOCAB, 8), torch.nn.Linear(8, VOCAB)
        self.own = own

    def forward(self, *, input_ids, attention_mask=None, labels=None):
        logits = self.head(self.emb(input_ids))
        loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
        if self.own is not None:
            loss = loss * 0 + self.own
        return {"loss": loss, "logits": logits}


# ---------------------------------------------------------------------------- one rule each
@needs_transformers
def test_rule_auto_trains_on_the_models_own_loss():
    """A HuggingFace ModelOutput's .loss (and a dict's ["loss"]) is the loss under auto, even where
    cross-entropy of its logits against the batch's labels could be computed."""
    from transformers.modeling_outputs import CausalLMOutput

    batch = lm_batch()
    logits = torch.randn(4, T, VOCAB)
    for out in (CausalLMOutput(loss=torch.tensor(7.0), logits=logits), {"loss": torch.tensor(7.0), "logits": logits}):
        loss = Loss("auto")
        x, y = loss.split(batch)
        value, extras = loss(out, y, batch)
        ce = F.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=-100)
        assert value.item() == 7.0, (
            f"rule 'auto takes the model's own loss': trained on {value.item():.4f} (cross-entropy of the "
            f"logits is {ce:.4f}), not the output's loss 7.0")
        assert loss.said == "loss: the model's own (output.loss)" and isinstance(loss.rule, OwnLoss)
        assert loss.tokens, "rule 'token logits [B, T, V] under the model's own loss report perplexity'"


def test_rule_tokens_are_the_real_ones_not_the_padding():
    """tokens/s counts the attention mask's ones: 4 samples x 8 positions, 2 of them padding, are 24
    tokens, not 32; without a mask every id counts; a batch without input_ids has no tokens."""
    batch = lm_batch(pad=PAD)
    assert token_count(batch) == 4 * (T - PAD), (
        f"rule 'padding is not counted as tokens': {token_count(batch)} tokens counted in a batch of "
        f"{batch['input_ids'].numel()} positions of which {int(batch['attention_mask'].sum())} are real")
    assert token_count({"input_ids": batch["input_ids"]}) == 4 * T
    assert token_count({"x": torch.zeros(4, 3)}) is None and token_count((torch.zeros(4, 3), torch.zeros(4))) is None


def test_rule_a_dict_batch_is_passed_by_name():
    """model(**batch) for a dict batch (keyword-only forward: model(batch) would raise), model(x)
    for a tensor; the loss is the model's own under auto."""
    model = KeywordLM()
    batch = lm_batch()
    loss = Loss("auto")
    x, y = loss.split(batch)
    try:
        out = forward(model, x)
    except TypeError as exc:
        pytest.fail(f"rule 'a dict batch is passed as model(**batch)': {exc}")
    assert set(out) == {"loss", "logits"}
    lin = torch.nn.Linear(3, 2)
    t = torch.randn(4, 3)
    assert torch.equal(forward(lin, t), lin(t))


@needs_transformers
def test_rule_a_tokenizers_batch_encoding_is_a_dict_batch():
    """A tokenizer's BatchEncoding (a UserDict, not a dict) is a dict batch everywhere: split, moved
    whole, its tokens counted, and passed as model(**batch), not as model(batch)."""
    from transformers import BatchEncoding

    enc = BatchEncoding(lm_batch())
    loss = Loss("auto")
    x, y = loss.split(enc)
    assert y is enc["labels"]
    try:
        out = forward(KeywordLM(), x)
    except TypeError as exc:
        pytest.fail(f"rule 'any Mapping batch (a BatchEncoding) is passed as model(**batch)': {exc}")
    value, _ = loss(out, y, enc)
    assert value.dim() == 0 and isinstance(loss.rule, OwnLoss)
    assert token_count(enc) == 4 * (T - PAD)
    moved = to_device(enc, torch.device("meta"))
    assert isinstance(moved, BatchEncoding) and all(v.is_meta for v in moved.values())


def test_rule_a_dict_batch_moves_every_key_to_the_device():
    """Every tensor of a collated batch goes to the device: each key of a dict (nested too), each
    element of a tuple. The meta device needs no GPU."""
    meta = torch.device("meta")
    batch = {**lm_batch(), "extra": {"pixels": torch.zeros(4, 3)}, "pair": (torch.zeros(4), torch.ones(4))}
    moved = to_device(batch, meta)
    left = [k for k, v in moved.items() if isinstance(v, torch.Tensor) and not v.is_meta]
    assert not left, f"rule 'a dict batch moves all its keys to the device': {left} stayed on the CPU"
    assert list(moved) == list(batch)
    assert moved["extra"]["pixels"].is_meta and all(t.is_meta for t in moved["pair"])
    x, y = to_device((torch.zeros(4, 3), torch.zeros(4)), meta)
    assert x.is_meta and y.is_meta


def test_rule_perplexity_is_exp_of_the_mean_loss():
    """Training's epoch end and evaluation say perplexity from the summed loss over the samples:
    exp(sum / count), not exp(sum); extra metrics are their means; no perplexity without tokens."""
    from torchdeck.engine.sums import read

    got = read([4.0, 6.0, 2.0], hits=False, extras=["mae"], tokens=True)["metrics"]
    assert got["perplexity"] == pytest.approx(math.exp(1.5)), (
        f"rule 'perplexity is exp of the mean loss': {got['perplexity']} for a mean loss of 1.5 "
        f"(exp 1.5 = {math.exp(1.5):.4f})")
    assert got["mae"] == 0.5
    assert read([4.0, 6.0, 2.0], hits=False, extras=["mae"], tokens=False)["metrics"] == {"mae": 0.5}


def test_rule_validation_perplexity_is_exp_of_the_mean_loss():
    """evaluate_model on 10 samples (batches of 4, 4, 2) of a model whose own loss is 0.5 on every
    batch: val loss 0.5 (the mean), perplexity exp(0.5), not exp of the sum (exp 5)."""
    from torchdeck.engine.strategies.base import RankContext
    from torchdeck.engine.train import evaluate_model

    class Samples(torch.utils.data.Dataset):
        def __init__(self):
            self.rows = [{k: v[i] for k, v in lm_batch(10, seed=1).items()} for i in range(10)]

        def __len__(self):
            return len(self.rows)

        def __getitem__(self, i):
            return self.rows[i]

    cpu = torch.device("cpu")
    ctx = RankContext(rank=0, local_rank=0, world_size=1, local_world_size=1, node_rank=0, device=cpu, cfg=None)
    got = evaluate_model(KeywordLM(own=0.5), Samples(), ctx, batch_size=4, loss=Loss("auto"))
    assert got["loss"] == pytest.approx(0.5) and got["samples"] == 10
    assert got["metrics"]["perplexity"] == pytest.approx(math.exp(0.5)), (
        f"rule 'validation perplexity is exp of the mean loss': {got['metrics']['perplexity']:.4f}, "
        f"exp(0.5) = {math.exp(0.5):.4f}")


# ---------------------------------------------------------------------------- the rules together
USER = '''
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

VOCAB, T, PAD = 32, 8, 2


class Tokens(Dataset):
    """Arithmetic sequences mod VOCAB, the last PAD positions padding (mask 0, labels -100): the
    same real tokens per sample, so 2 ranks' mean losses average to one process's. `encoded`:
    each sample is a tokenizer's BatchEncoding (collated into one), not a dict."""

    def __init__(self, n, seed, encoded=False):
        g = torch.Generator().manual_seed(seed)
        start = torch.randint(0, VOCAB, (n, 1), generator=g)
        self.ids = (start + torch.arange(T)) % VOCAB
        self.mask = torch.ones_like(self.ids)
        self.mask[:, -PAD:] = 0
        self.labels = self.ids.masked_fill(self.mask == 0, -100)
        self.encoded = encoded

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        d = {"input_ids": self.ids[i], "attention_mask": self.mask[i], "labels": self.labels[i]}
        if self.encoded:
            from transformers import BatchEncoding

            return BatchEncoding(d)
        return d


def lm_data(cfg):
    return Tokens(64, 1), Tokens(20, 2), {"vocab_size": VOCAB}


def encoded_data(cfg):
    return Tokens(64, 1, encoded=True), Tokens(20, 2, encoded=True), {"vocab_size": VOCAB}


class KeywordLM(torch.nn.Module):
    def __init__(self, vocab):
        super().__init__()
        self.emb, self.head = torch.nn.Embedding(vocab, 16), torch.nn.Linear(16, vocab)

    def forward(self, *, input_ids, attention_mask=None, labels=None):
        logits = self.head(self.emb(input_ids))
        return {"loss": F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100), "logits": logits}


def keyword_lm(info):
    return KeywordLM(info.vocab_size)
'''


@pytest.fixture
def rulesmod(tmp_path, monkeypatch):
    (tmp_path / "rulesmod.py").write_text(USER)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def lm_cfg(dataset="rulesmod:lm_data", **over) -> dict:
    base = {"name": "rules", "model": {"name": "rulesmod:keyword_lm"}, "optimizer.name": "sgd",
            "optimizer.lr": 0.5, "optimizer.momentum": 0.0, "train.batch_size": 16, "train.epochs": 1,
            "train.max_steps": 0, "train.eval_every_epoch": True, "train.log_every_n_steps": 1}
    base.update(over)
    cfg = small_cfg(**base)
    cfg["data"] = {"dataset": dataset, "num_workers": 0}
    return cfg


@needs_transformers
def test_a_batch_encoding_task_trains_with_its_rules_in_the_loop(rulesmod, tmp_path):
    """One rank, in process, on BatchEncoding samples and a keyword-only model: the step and the
    evaluation call model(**batch), the loss is the model's own, tokens/s counts 6 real tokens
    of 8 a sample, and the epoch end's train and val perplexity are exp of their mean losses."""
    ev = run_in_process(tmp_path / "run", lm_cfg("rulesmod:encoded_data"))
    errors = [e for e in ev if e["kind"] == "error"]
    assert not errors, errors[0].get("message")
    assert [e["message"] for e in ev if e["kind"] == "log" and e["message"].startswith("loss:")] == \
        ["loss: the model's own (output.loss)"]
    steps = [e for e in ev if e["kind"] == "step"]
    assert len(steps) == 4 and all(e["tokens_per_s"] == pytest.approx((T - PAD) * e["samples_per_s"]) for e in steps)
    end = [e for e in ev if e["kind"] == "epoch_end"][-1]
    assert end["train_metrics"]["perplexity"] == pytest.approx(math.exp(end["train_loss"])), \
        "rule 'training perplexity is exp of the mean train loss'"
    assert end["val_metrics"]["perplexity"] == pytest.approx(math.exp(end["val_loss"])), \
        "rule 'validation perplexity is exp of the mean val loss'"


def _ddp_rank(rank, cfg_dict, run_dir, out_dir):
    """One of 2 ranks, forked: the worker's own train_rank (real Trainer, DDP over gloo)."""
    from torchdeck.engine import config as cfgmod
    from torchdeck.engine import events
    from torchdeck.engine.worker import RankJob, train_rank

    got = []
    train_rank(RankJob(cfgmod.from_dict(cfg_dict), run_dir, rank, rank, 2, local_world_size=2),
               lambda kind, **f: got.append(events.make(kind, rank=rank, **f)))
    (out_dir / f"events{rank}.json").write_text(json.dumps(got))
    os._exit(0)  # no interpreter teardown with torch loaded: seconds


def test_rule_ddp_averages_the_model_own_loss_once(rulesmod, tmp_path):
    """The loss is scaled over the ranks once (DDP's all-reduce averages the gradients; torchdeck
    divides only by grad_accum): 2 gloo ranks x 8 samples, on the model's own loss, give after 2
    SGD steps the weights of one process with 16. Scaled twice, the DDP steps are half as long."""
    import torch.multiprocessing as mp

    from torchdeck.engine import worker

    # forked ranks inherit this process's worker state: one left by an earlier test serving a store
    # makes both ranks wait for each other 60 s at leave_group (seen: 61 s in the suite, 1 s alone)
    assert worker._SERVED is None, "an earlier test left worker._SERVED set (serve_store in the pytest process)"
    one = lm_cfg(**{"train.max_steps": 2, "train.eval_every_epoch": False})
    ddp = lm_cfg(**{"strategy": "ddp", "devices": 2, "train.batch_size": 8, "train.max_steps": 2,
                    "train.eval_every_epoch": False, "init_method": f"file://{tmp_path / 'store'}"})
    ddp["train"]["report_every_s"] = 0  # as under the supervisor: no rank_report all-gather
    run_in_process(tmp_path / "one", one)
    # fork: the ranks start in a fraction of a second with torch imported (spawn: ~10 s on 2 busy cores)
    ranks = mp.start_processes(_ddp_rank, args=(ddp, tmp_path / "ddp", tmp_path), nprocs=2, join=False,
                               start_method="fork")
    deadline = time.monotonic() + 120
    while not ranks.join(timeout=0.2):  # raises with the rank's traceback if one failed
        if time.monotonic() > deadline:
            for p in ranks.processes:
                p.kill()
            pytest.fail(f"2 DDP ranks not done in 120 s; alive: {[p.pid for p in ranks.processes if p.is_alive()]}")
    for rank in (0, 1):
        ev = json.loads((tmp_path / f"events{rank}.json").read_text())
        assert not [e for e in ev if e["kind"] == "error"]
    a, b = final_model(tmp_path / "ddp"), final_model(tmp_path / "one")
    assert a["step"] == b["step"] == 2
    try:
        assert_same_weights(a["model"], b["model"])
    except AssertionError as exc:
        pytest.fail(f"rule 'under DDP the loss is scaled over the ranks once': 2 ranks x 8 did not end where "
                    f"one process x 16 did (weight, max difference: {exc})")
    assert_trained(a["model"], one, tmp_path / "init")  # the steps moved the weights: not equal by standing still
