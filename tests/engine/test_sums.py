"""One metric model (engine/sums.py): the loss and every metric of a task are named sums over the
samples, and a training window, an evaluation and 2 real gloo ranks reduce them the same way, so
the same batches give the same figures on every path. The set (22 samples, batches of 4: the
last one has 2, and rank 1's evaluation shard is padded) makes a per-batch mean, a per-rank mean
or a padded sample counted visibly wrong."""
from __future__ import annotations

import json
import os
import time

import pytest
import torch
import torch.nn.functional as F

from torchdeck.engine.evaluate import evaluate_model
from torchdeck.engine.losses import Loss
from torchdeck.engine.strategies.base import RankContext
from torchdeck.engine.window import Window

N, B, V, T = 22, 4, 8, 5


class Pairs(torch.utils.data.Dataset):
    """(features, class): a classification task, accuracy counted."""

    def __init__(self):
        g = torch.Generator().manual_seed(3)
        self.x, self.y = torch.randn(N, 6, generator=g), torch.randint(0, V, (N,), generator=g)

    def __len__(self):
        return N

    def __getitem__(self, i):
        return self.x[i], self.y[i]


class Tokens(torch.utils.data.Dataset):
    """Dict samples for a model that returns its own loss and a metric: perplexity and an extra."""

    def __init__(self):
        g = torch.Generator().manual_seed(4)
        self.ids = torch.randint(0, V, (N, T), generator=g)

    def __len__(self):
        return N

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i].roll(-1)}


class OwnLM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(V, V)

    def forward(self, input_ids, labels):
        logits = self.emb(input_ids)
        loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten())
        return {"loss": loss, "logits": logits, "metrics": {"hit": (logits.argmax(-1) == labels).float().mean()}}


def task(name):
    torch.manual_seed(0)
    if name == "classes":
        return torch.nn.Linear(6, V), Pairs()
    return OwnLM(), Tokens()


def train_figures(name, rank=0, world=1) -> dict:
    """The training path: a rank's batches (its samples rank::world) through a log window into its
    epoch's sums, reduced over the ranks, read once."""
    model, data = task(name)
    loss = Loss("auto")
    window = Window(torch.device("cpu"), None, loss)
    mine = torch.utils.data.Subset(data, list(range(rank, N, world)))
    first = True
    with torch.no_grad():
        for batch in torch.utils.data.DataLoader(mine, batch_size=B):
            x, y = loss.split(batch)
            out = model(**x) if isinstance(x, dict) else model(x)
            value, extras = loss(out, y, batch)
            if first:
                window.decided()  # as the loop does once, after the run's first batch
                first = False
            window.add(value, out, y, len(y), extras)
    window.fold()
    window.close()
    window.epoch_sums.all_reduce()
    return window.epoch_sums.figures(loss.tokens)


def eval_figures(name, rank=0, world=1) -> dict:
    model, data = task(name)
    ctx = RankContext(rank, rank, world, world, 0, torch.device("cpu"), None)
    got = evaluate_model(model, data, ctx, B, loss=Loss("auto"))
    return {k: got[k] for k in ("loss", "accuracy", "metrics", "samples")}


def _rank(rank, store, out_dir):
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    got = {f"{path}-{name}": fn(name, rank, 2) for name in ("classes", "own")
           for path, fn in (("train", train_figures), ("eval", eval_figures))}
    dist.destroy_process_group()
    (out_dir / f"rank{rank}.json").write_text(json.dumps(got))
    os._exit(0)


def same(a: dict, b: dict, what: str) -> None:
    assert a["samples"] == b["samples"] == N, f"{what}: samples {a['samples']} vs {b['samples']}, {N} in the set"
    assert a["accuracy"] == b["accuracy"], f"{what}: accuracy {a['accuracy']} vs {b['accuracy']}"
    assert a["loss"] == pytest.approx(b["loss"], rel=1e-6), f"{what}: loss {a['loss']} vs {b['loss']}"
    assert a["metrics"].keys() == b["metrics"].keys(), f"{what}: metrics {a['metrics']} vs {b['metrics']}"
    for k in a["metrics"]:
        assert a["metrics"][k] == pytest.approx(b["metrics"][k], rel=1e-6), f"{what}: {k} {a['metrics']} vs {b['metrics']}"


def test_train_eval_and_two_ranks_reduce_the_same_sums_to_the_same_figures(tmp_path):
    import torch.multiprocessing as mp

    ranks = mp.start_processes(_rank, args=(tmp_path / "store", tmp_path), nprocs=2, join=False, start_method="fork")
    one = {f"{path}-{name}": fn(name) for name in ("classes", "own")
           for path, fn in (("train", train_figures), ("eval", eval_figures))}
    deadline = time.monotonic() + 120
    while not ranks.join(timeout=0.2):  # raises with the rank's traceback if one failed
        assert time.monotonic() < deadline, "the 2 gloo ranks did not finish in 120 s"
    two = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for name in ("classes", "own"):
        train, ev = one[f"train-{name}"], one[f"eval-{name}"]
        same(train, ev, f"{name}: training window vs evaluation, one process")
        for r in (0, 1):
            same(two[r][f"train-{name}"], train, f"{name}: training over 2 ranks (rank {r}) vs one process")
            same(two[r][f"eval-{name}"], ev, f"{name}: evaluation over 2 ranks (rank {r}) vs one process")
    assert one["train-classes"]["accuracy"] is not None and one["train-own"]["accuracy"] is None
    assert set(one["eval-own"]["metrics"]) == {"hit", "perplexity"}
