"""1. torchdeck (strategy cpu, one process) against the plain tutorial loop: same model, data,
batch, optimizer and steps. Target: throughput ratio >= 0.99."""
from __future__ import annotations

from bench import common as C

NAME = "engine_vs_plain"
TARGET = 0.99


def sizes(quick: bool) -> dict:
    return dict(steps=30, warm=10, batch=32, train=2048) if quick else \
        dict(steps=300, warm=50, batch=64, train=8192)


def run(quick: bool = False, reps: int = 3) -> dict:
    s = sizes(quick)
    root = C.tmpdir(NAME)
    cfg = C.engine_config(data={"train_size": s["train"]},
                          train={"batch_size": s["batch"], "max_steps": s["steps"]})

    def engine():
        return C.engine_result(C.run_engine(cfg, root), s["batch"], s["warm"])

    def plain():
        out = C.run_script("bench.baselines.plain_loop",
                           ["--steps", str(s["steps"]), "--batch-size", str(s["batch"]),
                            "--train-size", str(s["train"])])
        return C.script_result(out, s["batch"], s["warm"])

    eng, pl = C.alternate(reps, engine, plain)
    e_tp = C.median([r["samples_per_s"] for r in eng])
    p_tp = C.median([r["samples_per_s"] for r in pl])
    pair = C.median([a["samples_per_s"] / b["samples_per_s"] for a, b in zip(eng, pl)
                     if a["samples_per_s"] and b["samples_per_s"]])
    ratio = e_tp / p_tp if e_tp and p_tp else None
    rows = [
        ["plain loop", p_tp, C.median([r["startup_s"] for r in pl]), C.median([r["first_step_s"] for r in pl]), 1.0],
        ["torchdeck cpu", e_tp, C.median([r["startup_s"] for r in eng]), C.median([r["first_step_s"] for r in eng]), ratio],
    ]
    text = C.table(f"engine_vs_plain: cnn, batch {s['batch']}, steps {s['warm']}..{s['steps']} timed, "
                   f"median of {reps}", ["script", "samples/s", "start-up s", "to first mark s", "ratio"], rows)
    text += (f"\nratio of medians {C.fmt(ratio)}, median of paired ratios {C.fmt(pair)} "
             f"(target >= {TARGET}: {C.verdict(ratio, TARGET)})")
    return {"name": NAME, "text": text, "sizes": s, "reps": reps,
            "engine": eng, "plain": pl, "ratio": ratio, "paired_ratio": pair,
            "targets": [{"what": "engine/plain throughput", "value": ratio, "target": f">= {TARGET}",
                         "verdict": C.verdict(ratio, TARGET)}]}
