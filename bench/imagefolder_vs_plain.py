"""8. A user's own image folder (PNGs this benchmark writes, not the built-in set): torchdeck ddp
(2 ranks, gloo, data.cache auto) against a hand-written mp.spawn DDP script that decodes the
folder once into tensors, and against the tutorial script (ImageFolder, decoded every epoch by one
DataLoader worker per rank). Same CNN, batch, optimizer, epochs, evaluation after every epoch.

Timed end to end, as a user waits: from just before the run (or script) is started to the end of
its last evaluation; samples/s = epochs x train images / that time. Beside it: the time from the
process group being formed (torchdeck's rank_ready, the scripts' t_ready; the scripts import
torchvision, and with it torch._dynamo, before that point, torchdeck after) to the end, and the
training throughput after warm-up (step marks).
Targets: torchdeck >= 1.00x the decode-once script, validation accuracy within 1 point of it."""
from __future__ import annotations

from bench import common as C
from bench.imagefolder_data import shared_folder

NAME = "imagefolder_vs_plain"
TARGET = 1.00
RANKS = 2


def sizes(quick: bool) -> dict:
    return dict(train=256, val=64, epochs=1, tutorial_epochs=1, batch=32, warm=2) if quick else \
        dict(train=2000, val=500, epochs=10, tutorial_epochs=2, batch=32, warm=20)


def _result(t_launch: float, t_ready: float, t_end: float, samples: int, val_acc, marks, per_step, warm) -> dict:
    wall = max(t_end - t_launch, 1e-9)
    return {"wall_s": wall, "samples_per_s": samples / wall, "job_s": t_end - t_ready, "val_acc": val_acc,
            "train_samples_per_s": C.throughput(marks, per_step, warm)}


def run(quick: bool = False, reps: int = 3) -> dict:
    s = sizes(quick)
    folder = shared_folder(s["train"], s["val"], 32)
    root = C.tmpdir(NAME)
    per_step = s["batch"] * RANKS

    def engine(cache="auto"):
        def go():
            cfg = C.engine_config(strategy="ddp", devices=RANKS, backend="gloo",
                                  data={"dataset": "imagefolder", "root": str(folder), "image_size": 32,
                                        "cache": cache},
                                  train={"batch_size": s["batch"], "epochs": s["epochs"], "max_steps": 0,
                                         "eval_every_epoch": True})
            res = C.run_engine(cfg, root)
            evs = res["events"]
            ready = min(e["t"] for e in evs if e["kind"] == "rank_ready" and e["rank"] == 0)
            ends = [e for e in evs if e["kind"] == "epoch_end"]
            return _result(res["t_launch"], ready, ends[-1]["t"], s["epochs"] * s["train"], ends[-1]["val_acc"],
                           C.step_marks(evs), per_step, s["warm"])
        return go

    def script(mode, epochs, batched=False):
        def go():
            out = C.run_script("bench.baselines.plain_imagefolder",
                               [str(folder), "--mode", mode, "--epochs", str(epochs), "--ranks", str(RANKS),
                                "--batch-size", str(s["batch"])] + (["--batched"] if batched else []), forked=quick)
            return _result(out["t_launch"], out["t_ready"], out["t_end"], epochs * out["train_samples"],
                           out["val_acc"], [tuple(m) for m in out["marks"]], per_step, s["warm"])
        return go

    if quick:  # torchdeck against the decode-once script only: loader_start's quick run streams the
        # folder both ways (torchdeck cache none, the tutorial script), engine_vs_plain fetches batches
        (eng, once), batched, tutorial, streamed = C.alternate(reps, engine(), script("decode-once", s["epochs"])), [], [], []
    else:
        eng, once, batched = C.alternate(reps, engine(), script("decode-once", s["epochs"]),
                                         script("decode-once", s["epochs"], batched=True))
        tutorial = [script("tutorial", s["tutorial_epochs"])()]  # minutes per epoch: once, fewer epochs
        streamed = [engine("none")()]
    med = lambda rs, k: C.median([r[k] for r in rs])
    base = med(once, "samples_per_s")
    ratio = med(eng, "samples_per_s") / base if base and med(eng, "samples_per_s") else None
    paired = C.median([a["samples_per_s"] / b["samples_per_s"] for a, b in zip(eng, once)])
    acc_gap = abs(med(eng, "val_acc") - med(once, "val_acc")) if med(once, "val_acc") is not None else None

    def row(label, rs, epochs):
        sps = med(rs, "samples_per_s")
        return [label, epochs, med(rs, "wall_s"), sps, med(rs, "job_s"), med(rs, "train_samples_per_s"),
                med(rs, "val_acc"), sps / base if sps and base else None]

    rows = [row(label, rs, epochs) for label, rs, epochs in (
        ("tutorial (decode every epoch, 1 worker/rank)", tutorial, s["tutorial_epochs"]),
        ("plain DDP, decode once", once, s["epochs"]),
        ("plain DDP, decode once + batch fetch", batched, s["epochs"]),
        ("torchdeck ddp, data.cache none (streamed)", streamed, s["epochs"]),
        ("torchdeck ddp, data.cache auto", eng, s["epochs"])) if rs]
    text = C.table(f"{NAME}: {s['train']} train / {s['val']} val 32x32 PNGs, {RANKS} ranks gloo, cnn, batch "
                   f"{s['batch']}/rank, median of {reps} (tutorial and streamed: 1 run)",
                   ["script", "epochs", "wall s", "samples/s", "from ready s", "train samples/s", "val acc",
                    "vs decode-once"],
                   rows)
    text += (f"\ntorchdeck/decode-once {C.fmt(ratio)} (paired {C.fmt(paired)}; target >= {TARGET}: "
             f"{C.verdict(ratio, TARGET)}); val accuracy gap {C.fmt(acc_gap)} (target <= 0.01: "
             f"{C.verdict(acc_gap, 0.01, higher_is_better=False)})")
    if quick:
        text += "\nquick: torchdeck cache auto and the decode-once script only (the others: full run)\n" + C.FORKED_NOTE
    return {"name": NAME, "text": text, "sizes": s, "reps": reps, "engine": eng, "decode_once": once,
            "decode_once_batched": batched, "tutorial": tutorial, "streamed": streamed,
            "ratio": ratio, "ratio_paired": paired, "acc_gap": acc_gap,
            "targets": [
                {"what": "imagefolder engine/decode-once throughput, end to end", "value": ratio, "target": f">= {TARGET}",
                 "verdict": C.verdict(ratio, TARGET)},
                {"what": "imagefolder val accuracy gap", "value": acc_gap, "target": "<= 0.01",
                 "verdict": C.verdict(acc_gap, 0.01, higher_is_better=False)}]}
