"""9. Start-up: from a command typed at the shell to the first training step, `torchdeck run`
(2 DDP ranks, gloo, the built-in set, the tutorial CNN) against a plain mp.spawn DDP script doing
the same job (bench/baselines/plain_ddp.py), alternating, each timed from just before its process
is started to the wall time rank 0 finishes its first step. Target: torchdeck <= 1.00x the plain
script. On 2 cores a plain 2-rank script itself needs several seconds: three torch imports and
torch._dynamo's (which the first DDP or optimizer construction pulls in)."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

from bench import common as C

NAME = "startup"
TARGET = 1.00
RANKS = 2


def _torchdeck() -> list[str]:
    exe = Path(sys.executable).with_name("torchdeck")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "torchdeck.cli"]


def run(quick: bool = False, reps: int = 3) -> dict:
    reps = max(reps, 1) if quick else max(reps, 5)
    root = C.tmpdir(NAME)
    steps = 3
    # quick: one process a side, real starts both (torchdeck strategy cpu: its CLI, supervisor and one
    # rank; the plain tutorial loop), on a smaller set: 2 processes fewer, ~6 CPU-s less on 2 cores
    data = {"train_size": 1024, "val_size": 64} if quick else {}
    ranks = {"strategy": "cpu", "devices": 1} if quick else {"strategy": "ddp", "devices": RANKS, "backend": "gloo"}
    cfg = C.engine_config(**ranks, data=data,
                          train={"max_steps": steps, "log_every_n_steps": 1, "report_every_s": 0},
                          checkpoint={"every_epoch": False})
    preset = root / "startup.yaml"
    preset.write_text(yaml.safe_dump(cfg))
    env = dict(os.environ, TORCHDECK_RUNS=str(root / "runs"))

    def engine():
        before = set((root / "runs").glob("*")) if (root / "runs").exists() else set()
        t0 = time.time()
        p = subprocess.run(_torchdeck() + ["run", str(preset)], env=env, capture_output=True, text=True,
                           timeout=600, stdin=subprocess.DEVNULL)
        if p.returncode != 0:
            raise RuntimeError(f"torchdeck run failed ({p.returncode}): {p.stderr[-2000:]}")
        (run,) = set((root / "runs").glob("*")) - before
        from torchdeck.engine import events

        evs = events.read_all(run / "events.jsonl")
        first = min(e["t"] for e in evs if e["kind"] == "step" and e["rank"] == 0)
        ready = max(e["t"] for e in evs if e["kind"] == "rank_ready")
        started = min(e["t"] for e in evs if e["kind"] == "run_started")
        return {"first_step_s": first - t0, "ranks_ready_s": ready - t0, "supervisor_s": started - t0}

    def plain():
        t0 = time.time()
        script = ("bench.baselines.plain_loop", []) if quick else ("bench.baselines.plain_ddp", ["--ranks", str(RANKS)])
        out = C.run_script(script[0], script[1] + ["--steps", str(steps), "--mark-every", "1", "--batch-size", "64"]
                           + [f"--{k.replace('_', '-')}={v}" for k, v in data.items()])
        return {"first_step_s": out["marks"][0][1] - t0, "ranks_ready_s": out["t_ready"] - t0}

    eng, pl = C.alternate(reps, engine, plain)
    med = lambda rs, k: C.median([r.get(k) for r in rs])
    e, p = med(eng, "first_step_s"), med(pl, "first_step_s")
    ratio = e / p if e and p else None
    paired = C.median([a["first_step_s"] / b["first_step_s"] for a, b in zip(eng, pl)])
    rows = [["plain tutorial loop" if quick else "plain mp.spawn DDP script", p, med(pl, "ranks_ready_s"), "-", 1.0],
            ["torchdeck run", e, med(eng, "ranks_ready_s"), med(eng, "supervisor_s"), ratio]]
    what = "one process" if quick else f"{RANKS} ranks gloo"
    text = C.table(f"{NAME}: command to first step, {what}, cnn on the built-in set, "
                   f"median of {reps}, alternating",
                   ["what", "first step s", "ranks ready s", "supervisor up s", "vs plain"], rows)
    text += (f"\ntorchdeck/plain first step {C.fmt(ratio)} (paired {C.fmt(paired)}; target <= {TARGET}: "
             f"{C.verdict(ratio, TARGET, higher_is_better=False)}); runs: "
             + ", ".join(f"{a['first_step_s']:.2f}/{b['first_step_s']:.2f}" for a, b in zip(eng, pl)))
    if quick:
        text += ("\nquick: one process a side (torchdeck strategy cpu, the plain tutorial loop) and 1024 train / "
                 f"64 val samples (full run: {RANKS} DDP ranks a side, the plain mp.spawn DDP script, 8192 / 2048)")
    return {"name": NAME, "text": text, "reps": reps, "engine": eng, "plain": pl, "ratio": ratio, "paired": paired,
            "targets": [{"what": "start-up to first step engine/plain", "value": ratio, "target": f"<= {TARGET}",
                         "verdict": C.verdict(ratio, TARGET, higher_is_better=False)}]}
