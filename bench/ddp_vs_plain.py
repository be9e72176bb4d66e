"""2. torchdeck ddp (2 ranks, gloo, CPU) against a hand-written mp.spawn DDP script with threads
per rank = cores / ranks, and a naive one where every rank uses every core.
Targets: >= 0.99 of the plain script, faster than the naive one. The plain script with batch
fetching (as torchdeck does for in-memory sets) shows the framework's own overhead."""
from __future__ import annotations

from bench import common as C

NAME = "ddp_vs_plain"
TARGET = 0.99
RANKS = 2


def sizes(quick: bool) -> dict:
    return dict(steps=12, warm=4, batch=32, train=1024, val=64) if quick else \
        dict(steps=200, warm=40, batch=64, train=16384, val=2048)  # val: generated, not used (no eval)


def run(quick: bool = False, reps: int = 3) -> dict:
    s = sizes(quick)
    root = C.tmpdir(NAME)
    per_step = s["batch"] * RANKS
    cfg = C.engine_config(strategy="ddp", devices=RANKS, backend="gloo",
                          data={"train_size": s["train"], "val_size": s["val"]},
                          train={"batch_size": s["batch"], "max_steps": s["steps"]})

    def engine():
        return C.engine_result(C.run_engine(cfg, root), per_step, s["warm"])

    def script(threads, batched=False):
        # the naive script is several times slower: time it over fewer steps (its window stays long)
        steps, warm = (s["steps"], s["warm"]) if threads == "per-rank" or quick else (60, 20)

        def go():
            out = C.run_script("bench.baselines.plain_ddp",
                               ["--ranks", str(RANKS), "--steps", str(steps), "--batch-size",
                                str(s["batch"]), "--train-size", str(s["train"]), "--val-size", str(s["val"]),
                                "--threads", threads]
                               + (["--batched"] if batched else []), forked=quick)
            r = C.script_result(out, per_step, warm)
            r["threads"] = out.get("threads")
            return r
        return go

    fns = [engine, script("per-rank")]
    if not quick:  # quick: torchdeck and the plain script only; the naive and batch-fetch scripts are
        # the same plain_ddp.py with another flag (batch fetch: proven by engine_vs_plain's quick run)
        fns += [script("all"), script("per-rank", batched=True)]
    got = C.alternate(reps, *fns)
    eng, pl, nv, pb = got + [[]] * (4 - len(got))
    e_tp, p_tp, n_tp, b_tp = (C.median([r["samples_per_s"] for r in x]) for x in (eng, pl, nv, pb))
    vs_plain = e_tp / p_tp if e_tp and p_tp else None
    vs_naive = e_tp / n_tp if e_tp and n_tp else None
    med = lambda xs, k: C.median([r[k] for r in xs])
    rows = [["plain DDP (threads = cores/ranks)", p_tp, med(pl, "startup_s"), 1.0]]
    if nv:
        rows += [["naive DDP (every rank all cores)", n_tp, med(nv, "startup_s"), n_tp / p_tp if n_tp and p_tp else None],
                 ["plain DDP, batch fetch", b_tp, med(pb, "startup_s"), b_tp / p_tp if b_tp and p_tp else None]]
    rows.append(["torchdeck ddp", e_tp, med(eng, "startup_s"), vs_plain])
    text = C.table(f"ddp_vs_plain: {RANKS} ranks gloo, cnn, batch {s['batch']}/rank, steps "
                   f"{s['warm']}..{s['steps']} timed, median of {reps}",
                   ["script", "samples/s (global)", "start-up s", "vs plain"], rows)
    text += (f"\ntorchdeck/plain {C.fmt(vs_plain)} (target >= {TARGET}: {C.verdict(vs_plain, TARGET)}); "
             f"torchdeck/naive {C.fmt(vs_naive)} (target > 1: {C.verdict(vs_naive, 1.0)}); "
             f"torchdeck/batch-fetch plain (framework overhead alone) {C.fmt(e_tp / b_tp if e_tp and b_tp else None)}")
    if quick:
        text += "\nquick: torchdeck and the plain script only (naive and batch-fetch scripts: full run)\n" + C.FORKED_NOTE
    return {"name": NAME, "text": text, "sizes": s, "reps": reps, "engine": eng, "plain": pl, "naive": nv, "plain_batched": pb,
            "ratio_plain": vs_plain, "ratio_naive": vs_naive,
            "targets": [
                {"what": "ddp engine/plain throughput", "value": vs_plain, "target": f">= {TARGET}",
                 "verdict": C.verdict(vs_plain, TARGET)},
                {"what": "ddp engine/naive throughput", "value": vs_naive, "target": "> 1",
                 "verdict": C.verdict(vs_naive, 1.0)}]}
