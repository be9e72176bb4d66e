"""8. strategy deepspeed: torchdeck (2 ranks, gloo, CPU, ZeRO-2) against a hand-written DeepSpeed
script in the tutorial's style (same model, data, batch, stage; threads per rank = cores / ranks),
and peak memory per rank for DDP against ZeRO-1/2/3 on one job.

Target: >= 0.99 of the plain script's throughput. The plain script is also run with batch fetching
(torchdeck's data path, like for like) and as the tutorial wrote it (`training_data=`: DeepSpeed
builds the loader), over fewer steps.

Memory: an mlp big enough for ZeRO's partitions to show in a rank's resident memory (about 10.5 M
parameters, 40 MiB in fp32) trained with Adam, whose two moments are what ZeRO-1 shares out first;
each rank's peak RSS is what the rank reports at its last step (its high-water mark),
and the same job with a tiny mlp is subtracted, so torch's and DeepSpeed's libraries drop out.
Needs the extra: pip install 'torchdeck[deepspeed]'.
"""
from __future__ import annotations

from bench import common as C

NAME = "deepspeed_vs_plain"
TARGET = 0.99
RANKS = 2
HIDDEN = 2048  # mlp width for the memory job


def sizes(quick: bool) -> dict:
    # quick: ZeRO-3 on both sides, so torchdeck's throughput runs give the memory row too (a DeepSpeed
    # run costs ~15 CPU-s on 2 cores: the suite's smoke run starts two, not three)
    return dict(steps=12, warm=4, batch=32, train=1024, val=64, tutorial_steps=20, stage=3) if quick else \
        dict(steps=200, warm=40, batch=64, train=16384, val=2048, tutorial_steps=60, stage=2, mem_steps=30,
             hidden=HIDDEN)


def _throughput(s: dict, reps: int, quick: bool) -> dict:
    root = C.tmpdir(NAME)
    per_step = s["batch"] * RANKS
    cfg = C.engine_config(strategy="deepspeed", devices=RANKS, backend="gloo", deepspeed={"stage": s["stage"]},
                          data={"train_size": s["train"], "val_size": s["val"]},
                          train={"batch_size": s["batch"], "max_steps": s["steps"]})

    def engine():
        res = C.run_engine(cfg, root)
        return {**C.engine_result(res, per_step, s["warm"]), "peak_rss_mb": _rank_peaks(res["events"])}

    def script(data="loader", batched=False):
        steps, warm = (s["tutorial_steps"], min(s["warm"], s["tutorial_steps"] // 2)) if data == "training_data" \
            else (s["steps"], s["warm"])

        def go():
            out = C.run_script("bench.baselines.plain_deepspeed",
                               ["--ranks", str(RANKS), "--steps", str(steps), "--batch-size", str(s["batch"]),
                                "--train-size", str(s["train"]), "--val-size", str(s["val"]), "--stage", str(s["stage"]),
                                "--data", data]
                               + (["--batched"] if batched else []), forked=quick, imports=("deepspeed",))
            r = C.script_result(out, per_step, warm)
            r["threads"] = out.get("threads")
            return r
        return go

    fns = [engine, script()] + ([] if quick else [script(batched=True), script("training_data")])
    got = C.alternate(reps, *fns) + [[], []]
    eng, pl, pb, tut = got[:4]
    med = lambda xs, k: C.median([r[k] for r in xs])
    e_tp, p_tp, b_tp, t_tp = (med(x, "samples_per_s") for x in (eng, pl, pb, tut))
    ratio = e_tp / p_tp if e_tp and p_tp else None
    rows = [["plain DeepSpeed (DataLoader + DistributedSampler)", p_tp, med(pl, "startup_s"), med(pl, "first_step_s"), 1.0]]
    if pb:
        rows.append(["plain DeepSpeed, batch fetch", b_tp, med(pb, "startup_s"), med(pb, "first_step_s"),
                     b_tp / p_tp if b_tp and p_tp else None])
    if tut:
        rows.append(["tutorial as written (training_data=)", t_tp, med(tut, "startup_s"), med(tut, "first_step_s"),
                     t_tp / p_tp if t_tp and p_tp else None])
    rows.append(["torchdeck deepspeed", e_tp, med(eng, "startup_s"), med(eng, "first_step_s"), ratio])
    text = C.table(f"deepspeed_vs_plain: {RANKS} ranks gloo, ZeRO-{s['stage']}, cnn, batch {s['batch']}/rank, steps "
                   f"{s['warm']}..{s['steps']} timed, median of {reps}",
                   ["script", "samples/s (global)", "start-up s", "first step s", "vs plain"], rows)
    text += (f"\ntorchdeck/plain {C.fmt(ratio)} (target >= {TARGET}: {C.verdict(ratio, TARGET)}); "
             f"torchdeck/batch-fetch plain {C.fmt(e_tp / b_tp if e_tp and b_tp else None)}")
    if quick:
        text += ("\nquick: torchdeck and the plain script only, ZeRO-3 (ZeRO-2, batch fetch and the tutorial as "
                 "written: full run)\n" + C.FORKED_NOTE)
    return {"engine": eng, "plain": pl, "plain_batched": pb, "tutorial": tut, "ratio": ratio,
            "ratio_batched": e_tp / b_tp if e_tp and b_tp else None, "text": text}


def _peak_rss(cfg: dict, root) -> list[float]:
    """Each rank's peak resident memory (MiB) over a real run, as the rank reports it at its last
    step (peak_mem_mb of its last step event: the kernel's high-water mark, which sampling from
    outside misses on a short run)."""
    return _rank_peaks(C.run_engine(C.engine_config(**cfg), root)["events"])


def _rank_peaks(evs: list[dict]) -> list[float | None]:
    last = {e["rank"]: e for e in evs if e.get("kind") == "step"}
    return [last[k].get("peak_mem_mb") if k in last else None for k in range(RANKS)]


def _memory(s: dict) -> dict:
    """Per rank, the peak RSS of the job with the big mlp minus that of the same job with a tiny
    one (width 16): what grows with the model (weights, gradients, optimizer state, buffers), with
    torch's and DeepSpeed's own libraries (the same for both sizes) taken out."""
    root = C.tmpdir(NAME + "-mem")
    base = dict(devices=RANKS, backend="gloo", data={"train_size": 2048, "val_size": 0},
                optimizer={"name": "adam", "lr": 1e-3},
                train={"batch_size": 32, "max_steps": s["mem_steps"], "log_every_n_steps": 1})
    jobs = [("ddp", {"strategy": "ddp"}), ("zero (ZeroRedundancyOptimizer)", {"strategy": "zero"})]
    jobs += [(f"deepspeed ZeRO-{st}", {"strategy": "deepspeed", "deepspeed": {"stage": st}}) for st in (1, 2, 3)]
    params = sum(p.numel() for p in _mlp(s["hidden"]).parameters())
    rows, out = [], {}
    for label, over in jobs:
        cfg = C.merge(base, over)
        big = _peak_rss(C.merge(cfg, {"model": {"name": "mlp", "hidden": s["hidden"]}}), root)
        small = _peak_rss(C.merge(cfg, {"model": {"name": "mlp", "hidden": 16}}), root)
        grown = [round(b - t, 1) if b and t else None for b, t in zip(big, small)]
        out[label] = {"model_mb": grown, "peak_rss_mb": big, "tiny_model_peak_rss_mb": small}
        rows.append([label, *grown, max(big) if all(big) else None])
    ddp = out["ddp"]["model_mb"]
    for row in rows:
        row.append(max(row[1:1 + RANKS]) / max(ddp) if all(row[1:1 + RANKS]) and all(ddp) else None)
    text = C.table(f"memory per rank that grows with the model (peak RSS MiB with the model minus with a tiny "
                   f"one): {RANKS} ranks, mlp {s['hidden']} ({params / 1e6:.1f} M parameters, "
                   f"{params * 4 / 2 ** 20:.0f} MiB fp32), Adam, batch 32, {s['mem_steps']} steps",
                   ["strategy"] + [f"rank {r}" for r in range(RANKS)] + ["peak RSS", "vs ddp"], rows)
    return {"per_strategy": out, "params": params, "text": text}


def _memory_quick(engine_runs: list[dict]) -> dict:
    """The suite's smoke run: each rank's peak RSS in torchdeck's ZeRO-3 throughput runs (the
    measuring is the full run's; the mlp jobs, with ddp's and the tiny-model runs: full run)."""
    big = [C.median([r["peak_rss_mb"][k] for r in engine_runs]) for k in range(RANKS)]
    label = "deepspeed ZeRO-3"
    text = C.table(f"memory per rank: peak RSS MiB of torchdeck's {label} throughput run",
                   ["strategy"] + [f"rank {r}" for r in range(RANKS)] + ["peak RSS"],
                   [[label, *big, max(big) if all(big) else None]])
    text += ("\nquick: the peak RSS of the ZeRO-3 throughput runs (the mlp jobs for ddp, zero, ZeRO-1/2/3, "
             "each minus a tiny model's: full run)")
    return {"per_strategy": {label: {"model_mb": [None] * RANKS, "peak_rss_mb": big,
                                     "tiny_model_peak_rss_mb": [None] * RANKS}}, "params": None, "text": text}


def _mlp(hidden: int):
    from torchdeck.engine.data import DataInfo
    from torchdeck.engine.models import mlp

    return mlp(DataInfo(3, 10, 32, "synthetic"), hidden)


def run(quick: bool = False, reps: int = 3) -> dict:
    from torchdeck.engine.strategies.deepspeed import INSTALL_HINT, installed

    if not installed():
        return {"name": NAME, "skipped": INSTALL_HINT, "targets": [],
                "text": f"\n### {NAME}\nNOT RUN: deepspeed {INSTALL_HINT}"}
    s = sizes(quick)
    tp = _throughput(s, reps, quick)
    mem = _memory_quick(tp["engine"]) if quick else _memory(s)
    ratio = tp["ratio"]
    return {"name": NAME, "text": tp["text"] + "\n" + mem["text"], "sizes": s, "reps": reps,
            **{k: v for k, v in tp.items() if k != "text"}, "memory": {k: v for k, v in mem.items() if k != "text"},
            "targets": [{"what": "deepspeed engine/plain DeepSpeed script throughput", "value": ratio,
                         "target": f">= {TARGET}", "verdict": C.verdict(ratio, TARGET)}]}
