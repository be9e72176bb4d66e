"""10. CIFAR-10-shaped arrays through the torchvision path: files in CIFAR-10's python layout (the
built-in set's pictures as bytes, 50,000 train / 10,000 test; no download here), read by
torchdeck (data.dataset cifar10: straight into uint8 tensors, one copy per node, normalized per
batch) against a hand-written mp.spawn DDP script that unpickles them into a normalized float
TensorDataset (bench/baselines/plain_cifar.py). The files are not the real CIFAR-10, so they would
fail torchvision's md5 check: the benchmark leaves the stamp torchdeck writes after a successful
check, as if they had passed it once.

Throughput after warm-up (step marks) and the time to have the set in memory; memory of the
node's ranks (sum of PSS, which counts a shared page once) with data.cache auto (one copy) and
none (one per rank), for 2 and 8 ranks. Target: torchdeck >= 1.00x the plain script. A row for the plain
script with its ranks bound to cores as torchdeck binds them (`--pin`) shows what that binding is worth."""
from __future__ import annotations

import pickle
import time
from pathlib import Path

from bench import common as C

NAME = "cifar_vs_plain"
TARGET = 1.00
RANKS = 2


def sizes(quick: bool) -> dict:
    return dict(train=1280, val=256, steps=12, warm=4, batch=64) if quick else \
        dict(train=50000, val=10000, steps=300, warm=60, batch=64, mem_ranks=[2, 8], mem_steps=5)


def make_cifar(root: Path, train: int, val: int) -> Path:
    """CIFAR-10's python files (5 train batches, test_batch, batches.meta) holding the built-in set."""
    import torch

    from torchdeck.engine.data import _tv_stamp, synthetic

    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)
    tr, va = synthetic(train, val, 10, 32)
    lo, hi = -2.5, 2.5
    for split, ds in (("train", tr), ("val", va)):
        x, y = ds.tensors
        data = ((x.clamp(lo, hi) - lo) * (255 / (hi - lo))).round().to(torch.uint8).reshape(len(x), -1).numpy()
        labels = y.tolist()
        if split == "val":
            (folder / "test_batch").write_bytes(pickle.dumps({"data": data, "labels": labels}))
            continue
        per = len(data) // 5
        for i in range(5):
            (folder / f"data_batch_{i + 1}").write_bytes(
                pickle.dumps({"data": data[i * per:(i + 1) * per], "labels": labels[i * per:(i + 1) * per]}))
    (folder / "batches.meta").write_bytes(pickle.dumps({"label_names": [f"class{i}" for i in range(10)]}))
    stamp_path, stamp = _tv_stamp("cifar10", root)
    stamp_path.write_text(stamp)
    return root


def _node_pss_mb(run) -> float | None:
    import psutil

    from torchdeck.engine.runs import control

    sup = run.supervisor_pid()
    total = 0
    for p in control.run_processes(run):
        try:
            if p.pid == sup or "resource_tracker" in " ".join(p.cmdline()):
                continue
            total += p.memory_full_info().pss
        except psutil.Error:
            continue
    return total / 2 ** 20 if total else None


def memory(root: Path, data_root: Path, ranks: int, cache: str, steps: int) -> dict:
    """Peak sum of the ranks' PSS while they train (sampled every 0.5 s)."""
    cfg = C.engine_config(strategy="ddp", devices=ranks, backend="gloo",
                          data={"dataset": "cifar10", "root": str(data_root), "download": False, "cache": cache},
                          train={"batch_size": 16, "max_steps": steps, "log_every_n_steps": 1})
    poll, peak = pss_sampler()
    C.run_engine(cfg, root, on_poll=poll)
    return {"ranks": ranks, "cache": cache, "node_pss_mb": peak["pss_mb"]}


def pss_sampler():
    """(on_poll for run_engine, the dict whose pss_mb it raises to the peak, sampled every 0.5 s)."""
    peak = {"pss_mb": 0.0}
    last = {"t": 0.0}

    def poll(run):
        if time.monotonic() - last["t"] < 0.5:
            return
        last["t"] = time.monotonic()
        v = _node_pss_mb(run)
        if v:
            peak["pss_mb"] = max(peak["pss_mb"], v)
    return poll, peak


def run(quick: bool = False, reps: int = 3) -> dict:
    s = sizes(quick)
    data_root = make_cifar(C.tmpdir(NAME + "-data"), s["train"], s["val"])
    root = C.tmpdir(NAME)
    per_step = s["batch"] * RANKS
    cfg = C.engine_config(strategy="ddp", devices=RANKS, backend="gloo",
                          data={"dataset": "cifar10", "root": str(data_root), "download": False},
                          train={"batch_size": s["batch"], "max_steps": s["steps"]})

    # quick: the memory row is sampled during torchdeck's timed run (2 ranks, cache auto) instead of a run of its own
    sampled = []

    def engine():
        poll, peak = pss_sampler() if quick else (None, None)
        res = C.run_engine(cfg, root, on_poll=poll)
        if quick:
            sampled.append({"ranks": RANKS, "cache": "auto", "node_pss_mb": peak["pss_mb"]})
        evs = res["events"]
        ready = min(e["t"] for e in evs if e["kind"] == "rank_ready" and e["rank"] == 0)
        data_t = next(e["t"] for e in evs if e["kind"] == "log" and "train samples" in e.get("message", ""))
        marks = C.step_marks(evs)
        return {"samples_per_s": C.throughput(marks, per_step, s["warm"]), "data_s": data_t - ready,
                "wall_s": marks[-1][1] - res["t_launch"]}

    def plain(batched=False, pin=False):
        def go():
            out = C.run_script("bench.baselines.plain_cifar", [str(data_root), "--ranks", str(RANKS), "--steps",
                                                               str(s["steps"]), "--batch-size", str(s["batch"])]
                               + (["--batched"] if batched else []) + (["--pin"] if pin else []), forked=quick)
            marks = [tuple(m) for m in out["marks"]]
            return {"samples_per_s": C.throughput(marks, per_step, s["warm"]), "data_s": out["t_data"] - out["t_ready"],
                    "wall_s": marks[-1][1] - out["t_launch"]}
        return go

    fns = [engine, plain()]
    if not quick:  # quick: torchdeck and the plain script only (batch fetch: proven by engine_vs_plain)
        fns += [plain(batched=True), plain(pin=True)]
    got = C.alternate(reps, *fns)
    eng, pl, pb, pp = got + [[]] * (4 - len(got))
    med = lambda rs, k: C.median([r[k] for r in rs])
    e_tp, p_tp, b_tp = med(eng, "samples_per_s"), med(pl, "samples_per_s"), med(pb, "samples_per_s")
    pp_tp = med(pp, "samples_per_s")
    ratio = e_tp / p_tp if e_tp and p_tp else None
    paired = C.median([a["samples_per_s"] / b["samples_per_s"] for a, b in zip(eng, pl)])
    rows = [["plain DDP, float TensorDataset", p_tp, med(pl, "data_s"), med(pl, "wall_s"), 1.0]]
    if pb:
        rows += [["plain DDP, float tensors + batch fetch", b_tp, med(pb, "data_s"), med(pb, "wall_s"),
                  b_tp / p_tp if b_tp and p_tp else None],
                 ["plain DDP, float tensors, ranks bound to cores (--pin)", pp_tp, med(pp, "data_s"), med(pp, "wall_s"),
                  pp_tp / p_tp if pp_tp and p_tp else None]]
    rows.append(["torchdeck ddp, cifar10 (uint8, shared)", e_tp, med(eng, "data_s"), med(eng, "wall_s"), ratio])
    text = C.table(f"{NAME}: {s['train']} train CIFAR-10-shaped images, {RANKS} ranks gloo, cnn, batch "
                   f"{s['batch']}/rank, steps {s['warm']}..{s['steps']} timed, median of {reps}",
                   ["script", "samples/s (global)", "group formed to data (torchdeck: + model) s", "launch to last step s",
                    "vs plain"], rows)
    mem = sampled[:1] if quick else \
        [memory(root, data_root, n, cache, s["mem_steps"]) for n in s["mem_ranks"] for cache in ("auto", "none")]
    text += C.table(f"{NAME}: memory of the node's ranks while training (sum of PSS; the set is "
                    f"{(s['train'] + s['val']) * 3072 / 2 ** 20:.0f} MiB of uint8)",
                    ["ranks", "data.cache", "node PSS MiB"],
                    [[m["ranks"], m["cache"], m["node_pss_mb"]] for m in mem])
    text += (f"\ntorchdeck/plain {C.fmt(ratio)} (paired {C.fmt(paired)}; target >= {TARGET}: "
             f"{C.verdict(ratio, TARGET)}); torchdeck/plain bound to cores the same way "
             f"{C.fmt(e_tp / pp_tp if e_tp and pp_tp else None)}")
    if quick:
        text += ("\nquick: torchdeck and the plain script only, memory sampled during torchdeck's timed run "
                 "(batch fetch, --pin and the memory runs: full run)\n" + C.FORKED_NOTE)
    return {"name": NAME, "text": text, "sizes": s, "reps": reps, "engine": eng, "plain": pl, "plain_batched": pb, "plain_pinned": pp,
            "memory": mem, "ratio": ratio, "ratio_paired": paired,
            "targets": [{"what": "cifar-shaped engine/plain throughput", "value": ratio, "target": f">= {TARGET}",
                         "verdict": C.verdict(ratio, TARGET)}]}
