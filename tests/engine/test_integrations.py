"""torchdeck.integrations: a HuggingFace Trainer callback, an Accelerate tracker and a Lightning
logger turning each framework's own logging into torchdeck.log events (issue 35).

Whole runs: a tiny script per framework (CPU, 2 gloo ranks, synthetic data, no download) under
the real `torchdeck launch --nproc-per-node 2`, then `torchdeck attach` and `torchdeck metrics
--csv` on the finished run, as a user reads them. The counting rules (samples per optimizer
step, the step number, the learning rate) each get a quick in-process test with the real
framework, torchdeck.log replaced by a recorder: what the integration hands to torchdeck.log is
the thing under test there.
"""
from __future__ import annotations

import csv
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import torchdeck

TORCHDECK = Path(sys.executable).with_name("torchdeck")


def needs(*modules):
    """Skip, naming what is missing: they come with the test extra (pip install -e '.[test]')."""
    import importlib.util

    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    return pytest.mark.skipif(bool(missing), reason=f"needs {', '.join(missing)}: pip install -e '.[test]'")


# ----------------------------------------------------------------------------- the scripts

HF = '''
import sys, torch
from transformers import Trainer, TrainingArguments
from torchdeck.integrations import TorchdeckCallback

class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 1)

    def forward(self, x, labels=None):
        out = self.linear(x)
        return {"loss": torch.nn.functional.mse_loss(out, labels), "logits": out}

g = torch.Generator().manual_seed(0)
data = [{"x": torch.randn(4, generator=g), "labels": torch.randn(1, generator=g)} for _ in range(256)]
args = TrainingArguments(output_dir="out", per_device_train_batch_size=4, gradient_accumulation_steps=2,
                         max_steps=24, logging_steps=2, learning_rate=0.01, report_to=[], use_cpu=True,
                         ddp_backend="gloo", save_strategy="no", disable_tqdm=True)
Trainer(model=Tiny(), args=args, train_dataset=data, callbacks=[TorchdeckCallback()]).train()
'''

ACCELERATE = '''
import torch
from accelerate import Accelerator
from torchdeck.integrations import TorchdeckTracker

accelerator = Accelerator(cpu=True, log_with=TorchdeckTracker(samples_per_step=4))
accelerator.init_trackers("tiny")
g = torch.Generator().manual_seed(0)
data = torch.utils.data.TensorDataset(torch.randn(256, 4, generator=g), torch.randn(256, 1, generator=g))
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loader = torch.utils.data.DataLoader(data, batch_size=4, shuffle=True)
model, opt, loader = accelerator.prepare(model, opt, loader)
for step, (x, y) in enumerate(loader, 1):
    loss = torch.nn.functional.mse_loss(model(x), y)
    accelerator.backward(loss)
    opt.step()
    opt.zero_grad()
    accelerator.log({"loss": loss.item(), "epoch": 0}, step=step)
    if step == 24:
        break
accelerator.end_training()
'''

LIGHTNING = '''
import torch
import lightning as L
from torchdeck.integrations import TorchdeckLogger

class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.linear(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

g = torch.Generator().manual_seed(0)
data = torch.utils.data.TensorDataset(torch.randn(256, 4, generator=g), torch.randn(256, 1, generator=g))
trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", num_nodes=1, max_steps=24, log_every_n_steps=2,
                    logger=TorchdeckLogger(samples_per_step=4), enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False)
trainer.fit(Tiny(), torch.utils.data.DataLoader(data, batch_size=4))
'''

# script, the modules it needs, the ranks whose own loss the framework hands to its logger
WHOLE_RUNS = {
    "hf-trainer": (HF, ("transformers", "accelerate"), (0, 1)),
    "accelerate": (ACCELERATE, ("accelerate",), (0,)),  # Accelerator.log runs on the main process only
    "lightning": (LIGHTNING, ("lightning",), (0, 1)),
}


def torchdeck_cli(*args, cwd, timeout=240):
    cmd = [str(TORCHDECK)] if TORCHDECK.exists() else [sys.executable, "-m", "torchdeck.cli"]
    env = dict(os.environ, TORCHDECK_RUNS=str(Path(cwd) / "runs"))
    return subprocess.run(cmd + list(args), cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


RANK_LINE = re.compile(r"^rank\s+(\d+)\s+step\s+(\d+)\b(.*)$", re.M)


@pytest.mark.slow
@pytest.mark.parametrize("framework", list(WHOLE_RUNS))
def test_a_frameworks_own_loop_shows_loss_and_samples_per_rank_in_attach_and_metrics_csv(tmp_path, framework):
    script, modules, loss_ranks = WHOLE_RUNS[framework]
    for m in modules:
        pytest.importorskip(m, reason=f"needs {m}: pip install -e '.[test]'")
    (tmp_path / "train.py").write_text(textwrap.dedent(script))
    r = torchdeck_cli("launch", "--nproc-per-node", "2", "train.py", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    (run,) = (tmp_path / "runs").iterdir()

    r = torchdeck_cli("attach", run.name, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    ranks = {int(rank): (int(step), rest) for rank, step, rest in RANK_LINE.findall(r.stdout)}
    assert sorted(ranks) == [0, 1], r.stdout
    for rank, (step, rest) in ranks.items():
        assert step == 24, (rank, r.stdout)  # the run's 24 optimizer steps, counted as torchdeck counts
        assert re.search(r"\d samples/s", rest), (rank, r.stdout)
        assert ("loss " in rest) == (rank in loss_ranks), (rank, r.stdout)

    r = torchdeck_cli("metrics", run.name, "--csv", "m.csv", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    with open(tmp_path / "m.csv", newline="") as f:
        rows = [row for row in csv.DictReader(f) if row["kind"] == "step"]
    for rank in (0, 1):
        mine = [row for row in rows if row["rank"] == str(rank)]
        assert any(row["samples_per_s"] and float(row["samples_per_s"]) > 0 for row in mine), (rank, mine)
        assert any(row["loss"] for row in mine) == (rank in loss_ranks), (rank, mine)
    assert all('"lr"' in row["metrics"] for row in rows if row["loss"]), rows  # the learning rate, every framework


# ----------------------------------------------------------------------------- the rules, in process


@pytest.fixture
def logged(monkeypatch):
    """What the integrations hand to torchdeck.log, as (metrics, step, samples, tokens)."""
    calls = []
    monkeypatch.setattr(torchdeck, "log", lambda metrics, step=None, samples=None, tokens=None:
                        calls.append((dict(metrics), step, samples, tokens)))
    return calls


def test_importing_torchdeck_and_its_integrations_imports_no_framework():
    code = ("import sys, torchdeck, torchdeck.integrations as i; assert sorted(i.__all__) == "
            "['TorchdeckCallback', 'TorchdeckLogger', 'TorchdeckTracker'];"
            "print(sorted(m for m in ('torch', 'transformers', 'accelerate', 'lightning') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr


@needs("transformers", "accelerate")
def test_hf_callback_sends_the_trainers_logs_with_this_ranks_samples_per_optimizer_step(tmp_path, logged):
    import torch
    from transformers import Trainer, TrainingArguments

    from torchdeck.integrations import TorchdeckCallback

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 1)

        def forward(self, x, labels=None):
            return {"loss": torch.nn.functional.mse_loss(self.linear(x), labels)}

    data = [{"x": torch.randn(4), "labels": torch.randn(1)} for _ in range(64)]
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=4, gradient_accumulation_steps=2,
                             max_steps=6, logging_steps=3, report_to=[], use_cpu=True, save_strategy="no",
                             disable_tqdm=True)
    Trainer(model=Tiny(), args=args, train_dataset=data, callbacks=[TorchdeckCallback()]).train()
    # 3 optimizer steps between logs, each 4 samples x 2 micro-batches on this rank; no step= (a
    # script's step= holds the rank's step until its next call: torchdeck's optimizer-step count,
    # the Trainer's global_step here, stays live between logs); the end-of-training summary is left out
    assert [(step, samples) for _, step, samples, _ in logged] == [(None, 24), (None, 24)], logged
    for metrics, *_ in logged:
        assert {"loss", "lr", "epoch"} <= set(metrics) and "learning_rate" not in metrics, metrics
        assert not any(k.endswith("_runtime") or k == "train_loss" for k in metrics), metrics


@needs("lightning")
def test_lightning_logger_counts_samples_at_optimizer_steps_and_uses_torchdecks_step(monkeypatch, logged):
    import lightning as L
    import torch

    from torchdeck.integrations import TorchdeckLogger

    monkeypatch.setenv("TORCHDECK_EVENTS_FD", "3")  # as under torchdeck launch (torchdeck.log is the recorder)

    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            loss = torch.nn.functional.mse_loss(self.linear(batch[0]), batch[1])
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)

    data = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=6, accumulate_grad_batches=2, log_every_n_steps=3,
                        logger=TorchdeckLogger(samples_per_step=8), enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Tiny(), torch.utils.data.DataLoader(data, batch_size=4))
    with_loss = [c for c in logged if "loss" in c[0]]
    assert with_loss and all(c[0]["lr"] == 0.05 and "epoch" in c[0] for c in with_loss), logged
    # a log every 3 optimizer steps (of 2 micro-batches each): 3 x 8 samples each. No step: Lightning
    # logs the step just done as the steps done before it (2 after the 3rd), so torchdeck's own
    # count of optimizer steps, the one the rank's other events carry, numbers it
    assert [(step, samples) for _, step, samples, _ in logged] == [(None, 24), (None, 24)], logged


@needs("accelerate")
def test_accelerate_tracker_main_rank_logs_and_other_ranks_count_their_samples(monkeypatch, logged):
    import torch
    from accelerate import Accelerator

    from torchdeck.integrations import TorchdeckTracker

    monkeypatch.setenv("TORCHDECK_EVENTS_FD", "3")
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.02)

    # a rank Accelerate never calls (init_trackers and log run on the main process only)
    other = TorchdeckTracker(samples_per_step=3)
    for _ in range(2):
        model(torch.randn(3, 4)).sum().backward()
        opt.step()
    assert [(m, samples) for m, _, samples, _ in logged] == [({}, 3), ({}, 3)], logged
    other.finish()
    logged.clear()

    tracker = TorchdeckTracker(samples_per_step=4, loss_key="train/loss")
    accelerator = Accelerator(cpu=True, log_with=tracker)
    accelerator.init_trackers("tiny", config={"lr": 0.02})
    for step in (1, 2):
        model(torch.randn(4, 4)).sum().backward()
        opt.step()
        accelerator.log({"train/loss": 0.5, "loss": 9.0}, step=step)
    model(torch.randn(4, 4)).sum().backward()
    opt.step()
    accelerator.log({"train/loss": 0.25}, step=3, log_kwargs={"torchdeck": {"samples": 5, "tokens": 50}})
    accelerator.log({"val_loss": 0.75}, step=3)  # no step since: no samples (None, not a rate of 0)
    accelerator.end_training()
    assert [(m.get("loss"), step, samples, tokens) for m, step, samples, tokens in logged] == [
        (0.5, 1, 4, None), (0.5, 2, 4, None), (0.25, 3, 5, 50), (None, 3, None, None)], logged
    assert all(m["lr"] == 0.02 for m, *_ in logged) and logged[0][0]["loss_logged"] == 9.0, logged
    assert logged[-1][0] == {"val_loss": 0.75, "lr": 0.02}, logged


@needs("pytorch_lightning")
def test_lightning_logger_is_a_pytorch_lightning_logger_for_a_script_that_imported_that():
    code = ("import sys, pytorch_lightning as pl; from torchdeck.integrations import TorchdeckLogger;"
            "assert isinstance(TorchdeckLogger(), pl.loggers.Logger), TorchdeckLogger.__mro__;"
            "print(sorted(m for m in sys.modules if m == 'lightning' or m.startswith('lightning.')))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr


def test_a_bad_samples_per_step_is_refused_by_name():
    from torchdeck.integrations import _common

    for bad in (0, -4, 2.5, "8", True):
        with pytest.raises(ValueError, match=r"samples_per_step: expected a whole number >= 1 .* got"):
            _common.check_samples(bad)
    assert _common.check_samples(None) is None and _common.check_samples(8) == 8
