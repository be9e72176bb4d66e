"""7. The GPU path (needs CUDA; without it the benchmark says plainly that it did not run).

ResNet-18 on 32x32 synthetic images, one GPU: fp32, bf16, bf16 + channels_last, + torch.compile,
torchdeck (strategy gpu) against the same plain script; with 2+ GPUs also DDP against one GPU
(target overhead <= 3 % per GPU) and DataParallel against DDP.
Note: torchdeck's step events read a loss from the GPU (a sync) every log_every_n_steps; the
plain script syncs at the same steps to take its marks, so both pay the same."""
from __future__ import annotations

import sys
import time

from bench import common as C

NAME = "gpu"
VARIANTS = [  # label, engine train overrides, plain script flags
    ("fp32", {"precision": "32-true"}, []),
    ("bf16", {"precision": "bf16-mixed"}, ["--bf16"]),
    ("bf16 + channels_last", {"precision": "bf16-mixed", "channels_last": True}, ["--bf16", "--channels-last"]),
    ("bf16 + channels_last + compile", {"precision": "bf16-mixed", "channels_last": True, "compile": True},
     ["--bf16", "--channels-last", "--compile"]),
]


def _cfg(s, strategy="gpu", devices=(0,), batch=None, **train):
    return C.engine_config(strategy=strategy, accelerator="cuda", devices=list(devices),
                           backend="nccl" if strategy == "ddp" else "auto",
                           model={"name": "resnet18", "small_stem": True},
                           data={"train_size": s["train"], "val_size": 0, "pin_memory": True},
                           optimizer={"name": "sgd", "lr": 0.1, "momentum": 0.9, "nesterov": True,
                                      "weight_decay": 5e-4},
                           train={"batch_size": batch or s["batch"], "max_steps": s["steps"], **train})


def said(what: str, fn):
    """Each run's number as it comes (stderr): a lease that ends mid-benchmark keeps what it measured."""
    def run_and_say():
        t0 = time.monotonic()
        r = fn()
        wait = f", data wait {r['data_wait']:.0%}" if r.get("data_wait") is not None else ""
        print(f"gpu: {what}: {C.fmt(r.get('samples_per_s'))} images/s{wait} ({time.monotonic() - t0:.0f} s)",
              file=sys.stderr, flush=True)
        return r
    return run_and_say


def run(quick: bool = False, reps: int = 3) -> dict:
    import torch

    if not torch.cuda.is_available():
        return {"name": NAME, "skipped": "no CUDA device on this machine", "targets": [],
                "text": f"\n### gpu\nNOT RUN: no CUDA device on this machine (torch {torch.__version__})."}
    s = dict(steps=40, warm=20, batch=128, train=8192) if quick else dict(steps=200, warm=50, batch=256, train=25600)
    reps = min(reps, 3)
    root = C.tmpdir(NAME)
    rows, out = [], {"device": torch.cuda.get_device_name(0), "gpus": torch.cuda.device_count()}
    for label, train, flags in VARIANTS:
        cfg = _cfg(s, **train)
        eng, pl = C.alternate(
            reps, said(f"{label}, torchdeck", lambda: C.engine_result(C.run_engine(cfg, root), s["batch"], s["warm"])),
            said(f"{label}, plain", lambda: C.script_result(C.run_script("bench.baselines.plain_gpu", [
                "--steps", str(s["steps"]), "--batch-size", str(s["batch"]), "--train-size", str(s["train"]),
                *flags]), s["batch"], s["warm"])))
        e, p = C.median([r["samples_per_s"] for r in eng]), C.median([r["samples_per_s"] for r in pl])
        rows.append([label, p, e, e / p if e and p else None])
        out[label] = {"engine": eng, "plain": pl}
    text = C.table(f"gpu: ResNet-18 32x32, batch {s['batch']}, {out['device']}, median of {reps}",
                   ["variant", "plain images/s", "torchdeck images/s", "ratio"], rows)
    targets = []
    n = torch.cuda.device_count()
    if n >= 2:
        single = C.median([C.engine_result(C.run_engine(_cfg(s, precision="bf16-mixed"), root), s["batch"],
                                           s["warm"])["samples_per_s"] for _ in range(reps)])
        ddp = C.median([C.engine_result(C.run_engine(_cfg(s, "ddp", range(n), precision="bf16-mixed"), root),
                                        s["batch"] * n, s["warm"])["samples_per_s"] for _ in range(reps)])
        dp = C.median([C.engine_result(C.run_engine(_cfg(s, "dp", range(n), batch=s["batch"] * n,
                                                         precision="bf16-mixed"), root),
                                       s["batch"] * n, s["warm"])["samples_per_s"] for _ in range(reps)])
        overhead = 1 - ddp / (single * n) if ddp and single else None
        text += C.table(f"multi-GPU: {n} GPUs, bf16, batch {s['batch']} per GPU",
                        ["setup", "images/s", "per GPU vs one GPU"],
                        [["one GPU", single, 1.0], [f"DDP x{n}", ddp, ddp / n / single],
                         [f"DataParallel x{n}", dp, dp / n / single]])
        targets.append({"what": "DDP overhead per GPU", "value": overhead, "target": "<= 3 %",
                        "verdict": C.verdict(overhead, 0.03, higher_is_better=False)})
        out.update(single=single, ddp=ddp, dp=dp)
    else:
        text += f"\nDDP vs one GPU and DataParallel vs DDP: NOT RUN (needs 2+ GPUs, this machine has {n})."
    return {"name": NAME, "text": text, "rows": rows, "results": out, "targets": targets}
