"""3. What watching costs a run: torchdeck cpu runs timed over whole epochs, (a) with step
events only at epoch ends and nobody watching, (b) at the default log_every_n_steps, and
(c) at the default with a watcher process tailing the events and sampling GPU/host at the
app's rates (bench.watcher, using app.sources). Target: (b) and (c) cost < 1 % of (a)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from bench import common as C

NAME = "monitoring_cost"
TARGET = 0.01
NEVER = 10 ** 9


def sizes(quick: bool) -> dict:
    return dict(train=512, batch=32, epochs=3) if quick else dict(train=4096, batch=64, epochs=6)


def _run(s: dict, root: Path, log_every: int, watcher: bool) -> dict:
    spe = s["train"] // s["batch"]
    cfg = C.engine_config(data={"train_size": s["train"], "val_size": 256},
                          train={"batch_size": s["batch"], "epochs": s["epochs"], "max_steps": 0,
                                 "log_every_n_steps": log_every})
    w = {}

    def start_watcher(run):
        if watcher and "proc" not in w:
            env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(C.ROOT), os.environ.get("PYTHONPATH", "")]))
            w["proc"] = subprocess.Popen([sys.executable, "-m", "bench.watcher", str(run.path)],
                                         stdout=subprocess.PIPE, text=True, env=env, cwd=str(C.ROOT))

    res = C.run_engine(cfg, root, on_poll=start_watcher)
    marks = [m for m in C.step_marks(res["events"]) if m[0] % spe == 0]  # epoch ends: in every variant
    out = {"samples_per_s": C.throughput(marks, s["batch"], spe),
           "step_events": sum(1 for e in res["events"] if e.get("kind") == "step")}
    if "proc" in w:
        stdout, _ = w["proc"].communicate(timeout=60)
        out["watcher"] = json.loads(stdout.strip().splitlines()[-1]) if stdout.strip() else None
    return out


def run(quick: bool = False, reps: int = 3) -> dict:
    s = sizes(quick)
    root = C.tmpdir(NAME)
    variants = [("epoch-end events only, no watcher", NEVER, False),
                ("default log_every_n_steps (10)", 10, False),
                ("default + watcher (tail 0.2 s, samplers 1 s)", 10, True)]
    res = {v[0]: [] for v in variants}
    for i in range(reps):
        order = variants[i % 3:] + variants[:i % 3]
        for label, every, watch in order:
            res[label].append(_run(s, root, every, watch))
    base = C.median([r["samples_per_s"] for r in res[variants[0][0]]])
    rows, costs = [], {}
    for label, _, _ in variants:
        tp = C.median([r["samples_per_s"] for r in res[label]])
        cost = 1 - tp / base if tp and base else None
        costs[label] = cost
        rows.append([label, tp, C.median([r["step_events"] for r in res[label]]),
                     None if cost is None else f"{cost * 100:+.2f} %"])
    watcher_info = next((r.get("watcher") for r in res[variants[2][0]] if r.get("watcher")), None)
    text = C.table(f"monitoring_cost: cpu cnn, {s['epochs']} epochs x {s['train'] // s['batch']} steps, "
                   f"epochs 2..{s['epochs']} timed, median of {reps}",
                   ["variant", "samples/s", "step events", "cost"], rows)
    text += f"\nwatcher: {watcher_info}"
    targets = [{"what": f"monitoring cost: {label}", "value": costs[label], "target": f"< {TARGET:.0%}",
                "verdict": C.verdict(costs[label], TARGET, higher_is_better=False)} for label, _, _ in variants[1:]]
    return {"name": NAME, "text": text, "sizes": s, "reps": reps, "runs": res, "costs": costs,
            "watcher": watcher_info, "targets": targets}
