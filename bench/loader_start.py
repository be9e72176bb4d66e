"""14. How loader workers start, on a set read from disk every epoch (data.cache none): the PNG
folder of imagefolder_vs_plain, 2 ranks gloo, one DataLoader worker per rank. A rank started by
torch.multiprocessing.spawn starts its workers by spawn too, and each imports torch afresh;
torchdeck's data.worker_start auto starts them from a fork server (Linux) that imports torch once
per rank; fork forks the rank itself (quickest, but it can hang on Python 3.11, README).

Rows, alternating: torchdeck with auto (fork server), fork and spawn (what it did before), the
tutorial's hand-written mp.spawn DDP script as written (its workers spawn, train and val loaders,
every epoch) and the same script with multiprocessing_context="fork" (the quickest plain script
for a streamed set). Timed end to end as a user waits: from the launch to the end of the last
evaluation, and from the launch to the first step (first batch included). No target (issue 17
asks for the defaults a user would pick): the ratios say what each way of starting costs."""
from __future__ import annotations

from bench import common as C
from bench.imagefolder_data import shared_folder

NAME = "loader_start"
RANKS = 2


def run(quick: bool = False, reps: int = 3) -> dict:
    s = dict(train=256, val=64, epochs=1, batch=32) if quick else dict(train=2000, val=500, epochs=3, batch=32)
    folder = shared_folder(s["train"], s["val"], 32)  # imagefolder_vs_plain's, when it ran first
    root = C.tmpdir(NAME)
    samples = s["epochs"] * s["train"]

    def engine(start):
        def go():
            cfg = C.engine_config(strategy="ddp", devices=RANKS, backend="gloo",
                                  data={"dataset": "imagefolder", "root": str(folder), "image_size": 32,
                                        "cache": "none", "num_workers": 1, "worker_start": start},
                                  train={"batch_size": s["batch"], "epochs": s["epochs"], "max_steps": 0,
                                         "eval_every_epoch": True, "log_every_n_steps": 1})
            res = C.run_engine(cfg, root)
            evs, t0 = res["events"], res["t_launch"]
            end = [e for e in evs if e["kind"] == "epoch_end"][-1]
            wall = end["t"] - t0
            return {"wall_s": wall, "first_step_s": C.step_marks(evs)[0][1] - t0, "samples_per_s": samples / wall,
                    "val_acc": end["val_acc"]}
        return go

    def script(start):
        def go():
            out = C.run_script("bench.baselines.plain_imagefolder",
                               [str(folder), "--mode", "tutorial", "--epochs", str(s["epochs"]), "--ranks",
                                str(RANKS), "--batch-size", str(s["batch"]), "--mark-every", "1"]
                               + (["--worker-start", start] if start else []), forked=quick)
            wall = out["t_end"] - out["t_launch"]
            return {"wall_s": wall, "first_step_s": out["marks"][0][1] - out["t_launch"],
                    "samples_per_s": samples / wall, "val_acc": out["val_acc"]}
        return go

    runs = {"auto": engine("auto"), "plain_fork": script("fork")}
    if not quick:  # the suite's smoke run keeps the pair the ratio needs: the spawned-worker runs import
        # torch afresh per worker (slow, ~10 s each here), and fork can hang on Python 3.11 (README)
        runs.update(spawn=engine("spawn"), plain=script(None), fork=engine("fork"))
    got = dict(zip(runs, C.alternate(reps, *runs.values())))
    auto, spawn, plain, plain_fork, fork = (got.get(k, []) for k in ("auto", "spawn", "plain", "plain_fork", "fork"))
    med = lambda rs, k: C.median([r[k] for r in rs])
    base = med(plain_fork, "samples_per_s")
    ratio = med(auto, "samples_per_s") / base if base else None
    paired = C.median([a["samples_per_s"] / b["samples_per_s"] for a, b in zip(auto, plain_fork)])
    rows = [[label, med(rs, "first_step_s"), med(rs, "wall_s"), med(rs, "samples_per_s"), med(rs, "val_acc"),
             med(rs, "samples_per_s") / base if base else None,
             " ".join(f"{r['wall_s']:.1f}" for r in rs)]
            for label, rs in (("plain mp.spawn DDP, workers as written (spawn)", plain),
                              ("plain mp.spawn DDP, workers forked", plain_fork),
                              ("torchdeck ddp, data.worker_start spawn", spawn),
                              ("torchdeck ddp, data.worker_start fork", fork),
                              ("torchdeck ddp, data.worker_start auto (fork server)", auto)) if rs]
    text = C.table(f"{NAME}: {s['train']} train / {s['val']} val 32x32 PNGs read every epoch (cache none), "
                   f"{RANKS} ranks gloo, 1 loader worker/rank, {s['epochs']} epochs, median of {reps}",
                   ["what", "first step s", "wall s", "samples/s", "val acc", "vs plain forked", "runs wall s"], rows)
    text += f"\ntorchdeck auto/plain forked {C.fmt(ratio)} (paired {C.fmt(paired)}; no target)"
    if quick:
        text += "\nquick: torchdeck auto and the plain script with forked workers only (the others: full run)\n" + C.FORKED_NOTE
    return {"name": NAME, "text": text, "sizes": s, "reps": reps, "auto": auto, "fork": fork, "spawn": spawn,
            "plain": plain, "plain_fork": plain_fork, "ratio": ratio, "paired": paired, "targets": []}
