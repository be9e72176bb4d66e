"""1. torchdeck (strategy cpu, one process) against the plain tutorial loop: same model, data,
batch, optimizer and steps. Target: throughput ratio >= 0.99.

A second baseline, the same loop fetching whole batches from the in-memory tensors (as torchdeck
does), separates what the engine gains from its data path from what the framework costs."""
from __future__ import annotations

from bench import common as C

NAME = "engine_vs_plain"
TARGET = 0.99


def sizes(quick: bool) -> dict:
    # quick: a few steps past a short warm-up, enough for a throughput figure; start-up dominates anyway.
    # val: generated and not used by either side (no eval); 2048 synthetic samples cost each process ~1 CPU-s
    return dict(steps=12, warm=4, batch=32, train=1024, val=64) if quick else \
        dict(steps=300, warm=50, batch=64, train=8192, val=2048)


def run(quick: bool = False, reps: int = 3) -> dict:
    s = sizes(quick)
    root = C.tmpdir(NAME)
    cfg = C.engine_config(data={"train_size": s["train"], "val_size": s["val"]},
                          train={"batch_size": s["batch"], "max_steps": s["steps"]})

    def engine():
        return C.engine_result(C.run_engine(cfg, root), s["batch"], s["warm"])

    def plain(batched=False):
        out = C.run_script("bench.baselines.plain_loop",
                           ["--steps", str(s["steps"]), "--batch-size", str(s["batch"]),
                            "--train-size", str(s["train"]), "--val-size", str(s["val"])]
                           + (["--batched"] if batched else []), forked=quick)
        return C.script_result(out, s["batch"], s["warm"])

    eng, pl, pb = C.alternate(reps, engine, plain, lambda: plain(batched=True))
    tp = lambda rs: C.median([r["samples_per_s"] for r in rs])
    e_tp, p_tp, b_tp = tp(eng), tp(pl), tp(pb)

    def paired(a, b):
        return C.median([x["samples_per_s"] / y["samples_per_s"] for x, y in zip(a, b)
                         if x["samples_per_s"] and y["samples_per_s"]])

    ratio = e_tp / p_tp if e_tp and p_tp else None
    overhead = e_tp / b_tp if e_tp and b_tp else None
    pair, pair_b = paired(eng, pl), paired(eng, pb)
    row = lambda name, rs, r: [name, tp(rs), C.median([x["startup_s"] for x in rs]),
                               C.median([x["first_step_s"] for x in rs]), r]
    rows = [row("plain loop (tutorial)", pl, 1.0),
            row("plain loop, batch fetch", pb, b_tp / p_tp if b_tp and p_tp else None),
            row("torchdeck cpu", eng, ratio)]
    text = C.table(f"engine_vs_plain: cnn, batch {s['batch']}, steps {s['warm']}..{s['steps']} timed, "
                   f"median of {reps}", ["script", "samples/s", "start-up s", "to first mark s", "vs tutorial"], rows)
    text += (f"\nvs tutorial loop: ratio of medians {C.fmt(ratio)}, median of paired ratios {C.fmt(pair)} "
             f"(target >= {TARGET}: {C.verdict(ratio, TARGET)})"
             f"\nvs batch-fetch loop (framework overhead alone): {C.fmt(overhead)}, paired {C.fmt(pair_b)}")
    if quick:
        text += "\n" + C.FORKED_NOTE
    return {"name": NAME, "text": text, "sizes": s, "reps": reps,
            "engine": eng, "plain": pl, "plain_batched": pb, "ratio": ratio, "paired_ratio": pair,
            "ratio_vs_batched": overhead, "paired_ratio_vs_batched": pair_b,
            "targets": [{"what": "engine/plain throughput", "value": ratio, "target": f">= {TARGET}",
                         "verdict": C.verdict(ratio, TARGET)}]}
