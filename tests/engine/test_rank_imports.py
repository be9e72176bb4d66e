"""What a rank of our loop imports: torch._dynamo (sympy, fx, part of inductor: about as much CPU
as torch itself) only when something in it compiles (engine/nodynamo.py).

Each rank says so itself: the model (a user's callable) notes, at each training forward, which of
these modules its process holds and how many training forwards it has run, in a file per rank.
The last note comes after DDP's construction and forwards, optimizer steps, zero_grad, a
checkpoint (state_dict) and an evaluation.
"""
from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from tests.engine.helpers import ROOT, Run, ddp_cfg

PROBE = '''
import json, os, sys

from torchdeck.engine.models import mlp

WATCHED = ("torch._dynamo", "sympy", "torch._inductor")


def noting(info, out, hidden=32):
    net = mlp(info, hidden)
    seen = {"forwards": 0}

    def note(mod, args):
        if mod.training:
            seen["forwards"] += 1
            with open(os.path.join(out, f"rank{os.environ['RANK']}.json"), "w") as f:
                json.dump({"forwards": seen["forwards"],
                           "loaded": [m for m in WATCHED if m in sys.modules]}, f)
    net.register_forward_pre_hook(note)
    return net
'''


def _notes(tmp_path, run: Run, ranks=(0, 1)) -> dict:
    code = run.wait(timeout=600)
    assert code == 0, run.output()
    return {r: json.loads((tmp_path / f"rank{r}.json").read_text()) for r in ranks}


def _cfg(tmp_path, **over):
    (tmp_path / "rankprobe.py").write_text(PROBE)
    return ddp_cfg(**{"model.name": "rankprobe:noting", "model.kwargs": {"out": str(tmp_path)},
                      "data.train_size": 64, "train.epochs": 2, "train.max_steps": 0,
                      "train.eval_every_epoch": True, "checkpoint.every_epoch": True,
                      "scheduler.name": "cosine", "scheduler.warmup_steps": 2, **over})


def test_a_rank_that_compiles_nothing_never_imports_dynamo(tmp_path, runs):
    run = Run(tmp_path, _cfg(tmp_path))
    runs.append(run)
    notes = _notes(tmp_path, run)
    for rank, note in notes.items():
        assert note["forwards"] == 8, (rank, note)  # 4 steps an epoch, 2 epochs: the last note is late
        assert note["loaded"] == [], f"rank {rank} imported {note['loaded']} though nothing compiles"
    losses = [e["loss"] for e in run.events() if e["kind"] == "step"]
    assert losses and all(math.isfinite(v) for v in losses)


@pytest.mark.slow
def test_a_compiled_model_still_trains_with_dynamo(tmp_path, runs):
    """train.compile: the rank imports dynamo as before (ahead, while it starts) and the compiled
    forward trains. One rank, no evaluation (a second graph): inductor's C++ for the first compile
    takes ~1 min on 2 busy cores (~15 s once its cache holds the kernels)."""
    run = Run(tmp_path, _cfg(tmp_path, **{"train.compile": True, "strategy": "cpu", "devices": 1,
                                          "train.eval_every_epoch": False, "train.epochs": 1}))
    runs.append(run)
    (note,) = _notes(tmp_path, run, ranks=(0,)).values()
    assert "torch._dynamo" in note["loaded"] and note["forwards"] >= 2, note
    losses = [e["loss"] for e in run.events() if e["kind"] == "step"]
    assert losses and all(math.isfinite(v) for v in losses)


HANDOVER = '''
import sys, torch
from torchdeck.engine import nodynamo

nodynamo.prepare([torch.optim.SGD])
model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
zero_grad = torch.optim.Optimizer.zero_grad.__wrapped__


def step():
    model(torch.ones(3, 4)).sum().backward()
    opt.step()
    opt.zero_grad()
    return getattr(zero_grad, "__dynamo_disable").__qualname__


print(step(), nodynamo.loaded())
import torch._dynamo  # a user's model compiling a part of itself, say
print(step(), nodynamo.loaded())
'''


def test_once_anything_imports_dynamo_the_calls_go_torchs_way_again():
    """The plain calls stand in only while dynamo is not loaded: after, torch's own disable is made
    and kept, as its first call would have made it."""
    out = subprocess.run([sys.executable, "-c", HANDOVER], capture_output=True, text=True, timeout=300,
                         cwd=ROOT)
    assert out.returncode == 0, out.stderr
    before, after = out.stdout.split("\n")[:2]
    assert before == "_skip_disable.<locals>.plain False"
    assert after.endswith(" True") and "plain" not in after, after
