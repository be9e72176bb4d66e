"""lm_vs_plain (issue 30): the lm-cpu preset's workload (a 4-layer GPT on the built-in text, 2 DDP
ranks over gloo on the CPU) in torchdeck against the same model, data, optimizer, schedule and
threads per rank in a plain hand-written mp.spawn DDP loop (bench/baselines/plain_lm.py),
alternating. Tokens/s between the same step marks (after a warm-up) on rank 0.
Target: torchdeck >= 1.00x the plain loop."""
from __future__ import annotations

from bench import common as C

NAME = "lm_vs_plain"
TARGET = 1.0
RANKS = 2


def sizes(quick: bool) -> dict:
    return dict(steps=40, warm=10) if quick else dict(steps=300, warm=50)


def preset() -> dict:
    import yaml

    return yaml.safe_load((C.ROOT / "presets" / "lm-cpu.yaml").read_text())


def run(quick: bool = False, reps: int = 3) -> dict:
    s = sizes(quick)
    p = preset()
    m, t = p["model"], p["train"]
    tokens_per_step = t["batch_size"] * RANKS * m["block_size"]
    root = C.tmpdir(NAME)
    cfg = C.merge(p, {"name": "bench", "nodes": {"master_port": 0},
                      "train": {"epochs": 1000, "max_steps": s["steps"], "eval_every_epoch": False,
                                "log_every_n_steps": 10},
                      "checkpoint": {"every_epoch": False, "keep_last": 1}})
    cfg.pop("schema_version", None)
    o, sch = p["optimizer"], p["scheduler"]

    def engine(affinity=None):
        def go():
            c = C.merge(cfg, {"train": {"cpu_affinity": affinity}}) if affinity else cfg
            return C.engine_result(C.run_engine(c, root), tokens_per_step, s["warm"])
        return go

    def plain():
        out = C.run_script("bench.baselines.plain_lm", [
            "--ranks", str(RANKS), "--steps", str(s["steps"]), "--batch-size", str(t["batch_size"]),
            "--block-size", str(m["block_size"]), "--n-layer", str(m["n_layer"]), "--n-head", str(m["n_head"]),
            "--n-embd", str(m["n_embd"]), "--lr", str(o["lr"]), "--min-lr", str(sch["min_lr"]),
            "--warmup", str(sch["warmup_steps"]), "--grad-clip", str(t["grad_clip"])])
        r = C.script_result(out, tokens_per_step, s["warm"])
        r["threads"] = out.get("threads")
        return r

    # Full runs add torchdeck with its ranks left unbound (train.cpu_affinity none), as the plain
    # loop's are: on a host other jobs load, a rank bound to one core cannot move off it.
    fns = [engine(), plain] + ([] if quick else [engine("none")])
    eng, pl, *unbound = C.alternate(reps, *fns)
    e_tp, p_tp = (C.median([r["samples_per_s"] for r in x]) for x in (eng, pl))
    u_tp = C.median([r["samples_per_s"] for r in unbound[0]]) if unbound else None
    ratio = e_tp / p_tp if e_tp and p_tp else None
    pairs = [a["samples_per_s"] / b["samples_per_s"] for a, b in zip(eng, pl) if a["samples_per_s"] and b["samples_per_s"]]
    med = lambda xs, k: C.median([r[k] for r in xs])
    rows = [["plain DDP loop (threads = cores/ranks)", p_tp, med(pl, "startup_s"), 1.0],
            ["torchdeck lm-cpu", e_tp, med(eng, "startup_s"), ratio]]
    if unbound:
        rows.append(["torchdeck lm-cpu, cpu_affinity none", u_tp, med(unbound[0], "startup_s"),
                     u_tp / p_tp if u_tp and p_tp else None])
    text = C.table(f"lm_vs_plain: {RANKS} ranks gloo, gpt {m['n_layer']}x{m['n_embd']} ctx {m['block_size']}, "
                   f"batch {t['batch_size']}/rank, steps {s['warm']}..{s['steps']} timed, median of {reps}",
                   ["loop", "tokens/s (global)", "start-up s", "vs plain"], rows)
    text += (f"\ntorchdeck/plain {C.fmt(ratio)} (target >= {TARGET}: {C.verdict(ratio, TARGET)}); "
             f"per repetition: {', '.join(C.fmt(x) for x in pairs)}; "
             f"runs alternate, tokens/s on rank 0 between step marks {s['warm']} and {s['steps']}")
    return {"name": NAME, "text": text, "sizes": s, "reps": reps, "engine": eng, "plain": pl,
            "engine_unbound": unbound[0] if unbound else None,
            "ratio": ratio, "pairs": pairs,
            "targets": [{"what": "lm-cpu engine/plain tokens/s", "value": ratio, "target": f">= {TARGET}",
                         "verdict": C.verdict(ratio, TARGET)}]}
