"""torchdeck tune --batch-size: the search, the refusal on the CPU, and real trial runs in which
one rank runs out of memory (the one thing this machine lacks, a GPU's OOM, raised by a user
model; the runs, ranks and process groups are real)."""
from __future__ import annotations

import json
import os
import subprocess

import pytest

from torchdeck.engine import config as cfgmod
from torchdeck.engine.runs import tune
from torchdeck.engine.runs.tune import FITS, OOM, Trial

from tests.engine.helpers import cli_cmd, small_cfg


def _search(limit: int, start: int, max_batch: int = 1 << 16, max_trials: int = 30) -> tuple[int | None, list[int]]:
    trials: list[Trial] = []
    while len(trials) < max_trials:
        b = tune.next_batch(trials, start, max_batch)
        if b is None:
            break
        assert b not in [t.batch for t in trials], f"tried {b} twice"
        trials.append(Trial(b, FITS if b <= limit else OOM))
    return tune.best(trials), [t.batch for t in trials]


@pytest.mark.parametrize("limit,start", [(40, 32), (1000, 64), (7, 64), (64, 64), (63, 64), (5, 1), (300, 3)])
def test_the_search_finds_the_largest_fit_to_a_multiple_of_8(limit, start):
    found, tried = _search(limit, start)
    want = limit // 8 * 8 if limit >= 8 else limit  # multiples of 8 once the batch is that large
    assert found == want, tried
    assert len(tried) <= 2 * limit.bit_length() + 2, tried


def test_the_search_stops_at_max_batch_and_when_nothing_fits():
    assert _search(10 ** 6, 64, max_batch=300) == (300, [64, 128, 256, 300])
    found, tried = _search(0, 16)
    assert found is None and tried == [16, 8, 4, 2, 1]


def test_on_the_cpu_it_says_it_needs_a_gpu_and_starts_nothing(tmp_path):
    out = subprocess.run(cli_cmd() + ["tune", "quickstart", "--batch-size", "--runs-dir", str(tmp_path)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "tune --batch-size needs GPUs (accelerator: cuda)" in out.stderr, out.stderr
    assert "torchdeck validate PRESET --memory" in out.stderr
    assert list(tmp_path.iterdir()) == []


OOM_MODEL = '''
import os
import torch
from torchdeck.engine.models import mlp


def oom_above(info, rank0=100, rank1=40):
    """Runs out of memory (as CUDA would) when a training batch is larger than this rank's limit."""
    net = mlp(info, 32)
    limit = {"0": rank0, "1": rank1}[os.environ.get("RANK", "0")]

    def hook(mod, args):
        if mod.training and args[0].shape[0] > limit:
            raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate 2.00 GiB (batch {args[0].shape[0]})")
    net.register_forward_pre_hook(hook)
    return net
'''


@pytest.mark.slow
def test_trials_are_real_runs_and_every_rank_must_fit(tmp_path, monkeypatch):
    """DDP, 2 ranks: rank 1 runs out of memory above 40 per process, rank 0 above 100. The batch
    found is rank 1's (40): a batch fits only when no rank ran out of memory."""
    (tmp_path / "oom_models.py").write_text(OOM_MODEL)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    cfg = small_cfg(**{"strategy": "ddp", "devices": 2, "model.name": "oom_models:oom_above",
                       "data.train_size": 512, "checkpoint.every_epoch": True})
    cfgmod.save(cfgmod.from_dict(cfg), tmp_path / "job.yaml")
    seen = []
    path, result = tune.search(str(tmp_path / "job.yaml"), steps=2, root=tmp_path / "runs",
                               watch=lambda b, run: seen.append((b, run)), require_gpu=False)
    trials = result["trials"]
    assert [(t.batch, t.outcome) for t in trials] == [(32, FITS), (64, OOM), (48, OOM), (40, FITS)], trials
    assert result["best"] == 40 and [b for b, _ in seen] == [32, 64, 48, 40]
    assert all("rank 1" in t.reason and "out of memory" in t.reason for t in trials if t.outcome == OOM), trials
    fit = trials[0]
    assert len(fit.peak_mem_mb) == 2 and all(m > 0 for m in fit.peak_mem_mb), fit  # each rank's peak, by report
    for _, run in seen:  # each trial an ordinary run directory, its weights removed
        assert run.path.parent == path and (run.path / "events.jsonl").exists()
        assert not (run.path / "checkpoints").exists()
    saved = json.loads((path / tune.RESULT_FILE).read_text())
    assert saved["best"] == 40 and [t["batch"] for t in saved["trials"]] == [32, 64, 48, 40]
    text = tune.lines(result)
    assert text[-1].startswith("largest batch that fits: 40 per process (80 global over 2 process(es))"), text
    assert any(ln.startswith("batch     64  out of memory") and "rank 1" in ln for ln in text), text
