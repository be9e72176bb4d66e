"""What torchdeck's training loop adds to each step, with the compute taken out of the way.

    python -m bench.step_overhead [--reps N] [--steps N]

A near-zero-compute model (MLP, 8 hidden units, 8x8 images, batch 4, one thread) makes a step
mostly Python and dispatch, so a few microseconds of loop overhead are visible above the noise
that hides them in engine_vs_plain. Both run in this one process, alternating: the engine's rank
code (engine.worker.train_rank: Trainer, sampler, metrics, step events, stop agreement) and the
plain loop with batch fetching (bench/baselines/batch_fetch.py). The difference in microseconds
per step, divided by a real step time, is the loop's share of it.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from bench import common as C

IMG, BATCH, HIDDEN = 8, 4, 8


def engine_step_s(steps: int, warm: int) -> float:
    from torchdeck.engine import config as cfgmod
    from torchdeck.engine import events
    from torchdeck.engine.worker import RankJob, train_rank

    out: list[dict] = []
    cfg = C.engine_config(model={"name": "mlp", "hidden": HIDDEN},
                          data={"train_size": 4096, "val_size": 16, "image_size": IMG},
                          train={"batch_size": BATCH, "max_steps": steps, "threads_per_rank": 1})
    with tempfile.TemporaryDirectory() as d:
        train_rank(RankJob(cfgmod.from_dict(cfg), Path(d), 0, 0, 1),
                   lambda kind, **f: out.append(events.make(kind, rank=0, **f)))
    marks = [m for m in C.step_marks(out) if m[0] >= warm]
    return (marks[-1][1] - marks[0][1]) / (marks[-1][0] - marks[0][0])


def plain_step_s(steps: int, warm: int) -> float:
    import torch
    import torch.nn.functional as F

    from bench.baselines.batch_fetch import loader
    from torchdeck.engine.data import DataInfo, synthetic
    from torchdeck.engine.models import mlp

    torch.manual_seed(0)
    train, _ = synthetic(4096, 16, 10, IMG)
    model = mlp(DataInfo(3, 10, IMG, "synthetic"), HIDDEN)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    step, marks = 0, []
    while step < steps:
        for x, y in loader(train, BATCH, shuffle=True):
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            loss.item()
            step += 1
            if step % 10 == 0:
                marks.append((step, time.time()))
            if step == steps:
                break
    marks = [m for m in marks if m[0] >= warm]
    return (marks[-1][1] - marks[0][1]) / (marks[-1][0] - marks[0][0])


def run(quick: bool = False, reps: int = 5, steps: int | None = None) -> dict:
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    steps = steps or (300 if quick else 3000)
    warm = steps // 6
    try:
        eng, pl = C.alternate(reps, lambda: engine_step_s(steps, warm), lambda: plain_step_s(steps, warm))
    finally:
        torch.set_num_threads(threads)
    diffs = [a - b for a, b in zip(eng, pl)]
    e, p, d = statistics.median(eng), statistics.median(pl), statistics.median(diffs)
    text = C.table(f"step_overhead: MLP {HIDDEN} hidden, {IMG}x{IMG}, batch {BATCH}, 1 thread, {steps} steps, "
                   f"median of {reps}", ["loop", "us per step", "per rep"],
                   [["plain, batch fetch", p * 1e6, " ".join(f"{x * 1e6:.0f}" for x in pl)],
                    ["torchdeck rank code", e * 1e6, " ".join(f"{x * 1e6:.0f}" for x in eng)]])
    text += (f"\ntorchdeck adds {d * 1e6:.1f} us per step (median of paired differences); on a 5.5 ms CPU "
             f"step of the tutorial CNN that is {d / 5.5e-3 * 100:.2f} %")
    return {"name": "step_overhead", "text": text, "engine_s": eng, "plain_s": pl, "overhead_s": d, "targets": []}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.step_overhead")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--steps", type=int, default=0)
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args(argv)
    print(run(a.quick, a.reps, a.steps or None)["text"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
