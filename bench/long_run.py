"""Issue 37: a run of hours read back. Run directories of 1 and 4 hours (and 24 in the full run)
for 8 ranks, made of synthetic step events at today's rate (10 step events a second a rank:
quickstart's pace, a step event every 10 steps), written as the supervisor writes them
(events.dumps of the same fields and full-precision floats as a real quickstart run's events).
The run's view checkpoint (view.ckpt.json) is the supervisor's writer's own (make_run writes through
engine.supervisor.writer.EventWriter), and what it cost is reported.
For each: `torchdeck attach DIR` of the finished run, its time to exit and its peak RSS
(/usr/bin/time, or psutil polling where it is missing), and the file's bytes per step event and
per hour per rank, with what smaller step events would save (issue 37 item 4).

    python -m bench --only long_run                 # 1, 4 and 24 hours
    LONG_RUN_HOURS=1,4 LONG_RUN_PARTS=attach,monitor python -m bench --only long_run   # some sizes and parts
        # parts: attach, monitor, metrics_csv, metrics_tensorboard (all by default)
    LONG_RUN_BEFORE=/tmp/old python -m bench --only long_run --reps 1
        # also the code in /tmp/old (`git archive <commit> | tar -x -C /tmp/old`), alternating

Not in the smoke test's list: even quick mode writes and reads a run of minutes.
"""
from __future__ import annotations

import gzip
import importlib.util
import json
import os
import queue
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

from bench import common as C

NAME = "long_run"
RANKS = 8
RATE = 10  # step events a second a rank
STEPS_PER_EVENT = 10  # the loop reports every 10 steps
EPOCH_S = 600  # an epoch every 10 minutes: epoch_end from every rank and a checkpoint
T0 = 1_795_800_000.0
TARGET_S, TARGET_MB = 2.0, 300  # the goal for 24 hours x 8 ranks (needs its view checkpoint)
WHAT = {"attach": "attach to exit", "monitor": "Monitor to FINISHED", "metrics_csv": "metrics --csv",
        "metrics_tensorboard": "metrics --tensorboard"}
CHECKPOINT_COST: list = []  # make_run's writer.checkpoint(): what one view checkpoint costs the supervisor
PARTS = [p for p in os.environ.get("LONG_RUN_PARTS", ",".join(WHAT)).split(",") if p in WHAT]


def _step(rank: int, k: int, rng: random.Random, total: int) -> dict:
    """Rank `rank`'s k-th step event, the fields of a real quickstart run's (engine/loop.py)."""
    from torchdeck.engine import events

    sps = 1900.0 + 40 * rng.random()
    compute = 0.32 + 0.02 * rng.random()
    ev = events.make("step", rank=rank, epoch=k * STEPS_PER_EVENT // (EPOCH_S * RATE * STEPS_PER_EVENT),
                     step=(k + 1) * STEPS_PER_EVENT, total_steps=total,
                     loss=2.3 / (1 + k * 1e-4) + 0.05 * rng.random(), accuracy=min(1.0, 0.1 + k * 1e-5 + 0.01 * rng.random()),
                     metrics={}, samples_per_s=sps, tokens_per_s=None, mfu=None,
                     data_wait_s=0.004 + 0.001 * rng.random(), compute_s=compute, lr=0.05,
                     comm_s=0.1 + 0.1 * rng.random(), pause=False, device_mem_mb=1060.17578125 + rank,
                     peak_mem_mb=1081.36328125 + rank, data_wait=0.01 + 0.005 * rng.random(),
                     comm_wait=0.3 + 0.3 * rng.random())
    ev["t"] = T0 + 30.0 + k / RATE + rank * 1.3e-4 + 1e-7 * rng.random()
    return ev


def make_run(root: Path, hours: float, ranks: int = RANKS, seed: int = 0):
    """A finished run of `hours` at RATE step events a second a rank; returns (RunDir, step events)."""
    from torchdeck.engine import events
    from torchdeck.engine.runs.view import checkpoint as view_checkpoint
    from torchdeck.engine.supervisor.writer import EventWriter
    from bench.fake_run import create

    rd = create(root, ranks)
    rng = random.Random(seed)
    ticks = int(hours * 3600 * RATE)
    total = ticks * STEPS_PER_EVENT
    n = 0
    writer = EventWriter(rd.events_path, queue.Queue())  # the supervisor's writer: its view checkpoint too
    try:
        def put(ev, t):
            ev["t"] = t
            writer.write(ev)

        put(events.make("run_started", run=rd.name, strategy="ddp", world_size=ranks, nproc_per_node=ranks,
                        node_rank=0, num_nodes=1, global_batch=64 * ranks, devices=["cpu"] * ranks,
                        master_addr="127.0.0.1", master_port=29500, pid=4100, host="vm", threads_per_rank=1,
                        total_steps=total, epochs=max(1, int(hours * 3600 // EPOCH_S)), steps_per_epoch=None), T0)
        put(events.make("log", rank=None, level="info", message=f"supervisor 4100: ddp x{ranks} on node 0"), T0 + 0.1)
        for r in range(ranks):
            for i, phase in enumerate(("rendezvous", "data", "model", "steps")):
                put(events.make("phase", rank=r, phase=phase), T0 + 1 + i + r * 0.01)
            put(events.make("rank_ready", rank=r, local_rank=r, device="cpu", pid=4200 + r, host="vm", threads=1,
                            cpus=str(r)), T0 + 5 + r * 0.01)
        per_epoch = EPOCH_S * RATE
        for k in range(ticks):
            for r in range(ranks):
                writer.take(events.dumps(_step(r, k, rng, total)))
            n += ranks
            if k % 256 == 0:
                writer.flush_taken()
            if (k + 1) % per_epoch == 0:
                t, epoch = T0 + 30.0 + k / RATE + 0.01, (k + 1) // per_epoch
                for r in range(ranks):
                    put(events.make("epoch_end", rank=r, epoch=epoch - 1, step=(k + 1) * STEPS_PER_EVENT,
                                    train_loss=1.0 / epoch + 0.3, train_acc=0.5 + 0.4 * (1 - 1 / epoch),
                                    val_loss=1.1 / epoch + 0.2, val_acc=0.5 + 0.39 * (1 - 1 / epoch),
                                    train_metrics={}, val_metrics={}), t + r * 1e-4)
                put(events.make("checkpoint", rank=0, epoch=epoch, step=(k + 1) * STEPS_PER_EVENT, batches_done=0,
                                path=str(rd.checkpoint_dir / f"ckpt-{(k + 1) * STEPS_PER_EVENT:08d}.pt")), t + 0.01)
        end = T0 + 31.0 + ticks / RATE
        for r in range(ranks):
            put(events.make("rank_exited", rank=r, exitcode=0, signal=None), end + r * 1e-4)
        rd.write_final("finished", None, [0] * ranks, round(end - T0, 2), emit=lambda ev: put(ev, end + 0.01))
        writer.flush_taken()
        t0 = time.perf_counter()
        with_checkpoint = writer.checkpoint()
        CHECKPOINT_COST.append({"s": time.perf_counter() - t0, "ok": with_checkpoint,
                                "bytes": view_checkpoint.path_of(rd.events_path).stat().st_size if with_checkpoint else 0})
    finally:
        writer.close()
    return rd, n


def _attach(rd, code_root: Path) -> dict:
    """`torchdeck attach DIR` of the finished run from the code in `code_root`: seconds to exit, peak RSS."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(code_root)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    cmd = [sys.executable, "-m", "torchdeck.cli.main", "attach", str(rd.path)]
    timer = shutil.which("time") or ("/usr/bin/time" if os.path.exists("/usr/bin/time") else None)
    if timer:
        out = rd.path.parent / "time.txt"
        t0 = time.perf_counter()
        p = subprocess.run([timer, "-f", "%M", "-o", str(out), *cmd], env=env, cwd=str(code_root),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wall = time.perf_counter() - t0
        rss_mb = int(out.read_text().strip().splitlines()[-1]) / 1024
    else:
        import psutil

        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, cwd=str(code_root), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        ps, peak = psutil.Process(proc.pid), 0
        while proc.poll() is None:
            try:
                peak = max(peak, ps.memory_info().rss)
            except psutil.Error:
                pass
            time.sleep(0.02)
        wall = time.perf_counter() - t0
        p = subprocess.CompletedProcess(cmd, proc.returncode, proc.stdout.read(), proc.stderr.read())
        rss_mb = peak / 2**20
    if p.returncode != 0 or "run finished" not in p.stdout:
        raise RuntimeError(f"attach {rd.path} ended {p.returncode}:\n{p.stdout[-1500:]}\n{p.stderr[-1500:]}")
    return {"s": wall, "rss_mb": rss_mb}


def _env(code_root: Path, root: Path) -> dict:
    env = dict(os.environ, TORCHDECK_RUNS=str(root), TORCHDECK_PRESETS=str(root / "presets"))
    env["PYTHONPATH"] = os.pathsep.join([str(code_root)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def _rss_mb(proc) -> float:
    import psutil

    try:
        ps = psutil.Process(proc.pid)
        return sum(p.memory_info().rss for p in [ps] + ps.children(recursive=True)) / 2**20
    except psutil.Error:
        return 0.0


def _monitor(rd, code_root: Path, timeout: float = 1800) -> dict:
    """The app's Monitor opening the finished run in an 80x24 pty (bench/app_monitor.py, the same
    screen the Runs list opens): seconds until its header says FINISHED (the whole file read and
    painted) and the app's RSS then, polled every 0.1 s for the peak."""
    from bench.ptyterm import PtyProcess, visible

    p = PtyProcess([sys.executable, "-m", "bench.app_monitor", str(rd.path)], _env(code_root, rd.path.parent),
                   cols=80, rows=24, cwd=str(code_root))
    seen, peak, last_rss = "", 0.0, 0.0
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = p.read(0.1)
            last_rss = _rss_mb(p.proc)
            peak = max(peak, last_rss)
            if got is None:
                if p.proc.poll() is not None:
                    break
                continue
            t, data = got
            seen = (seen + visible(data))[-4000:]
            if "FINISHED" in seen:
                return {"s": t - p.t_start, "rss_mb": peak, "rss_then_mb": last_rss}
    finally:
        p.close()
    raise RuntimeError(f"the Monitor of {rd.path} never said FINISHED; saw {' '.join(seen.split())[-400:]}")


def _metrics_csv(rd, code_root: Path) -> dict:
    """`torchdeck metrics DIR --csv FILE` of the finished run: seconds and peak RSS."""
    return _metrics(rd, code_root, "--csv", rd.path.parent / "metrics-out.csv")


def _metrics_tensorboard(rd, code_root: Path) -> dict:
    """`torchdeck metrics DIR --tensorboard OUT` (a new folder each time): seconds and peak RSS."""
    return _metrics(rd, code_root, "--tensorboard", rd.path.parent / "metrics-out-tb")


def _metrics(rd, code_root: Path, flag: str, out: Path) -> dict:
    cmd = [sys.executable, "-m", "torchdeck.cli.main", "metrics", str(rd.path), flag, str(out)]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=_env(code_root, rd.path.parent), cwd=str(code_root),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = 0.0
    while proc.poll() is None:
        peak = max(peak, _rss_mb(proc))
        time.sleep(0.05)
    wall = time.perf_counter() - t0
    err = proc.stderr.read()
    if out.is_dir():
        shutil.rmtree(out)
    else:
        out.unlink(missing_ok=True)
    if proc.returncode != 0:
        raise RuntimeError(f"metrics {rd.path} ended {proc.returncode}: {err[-1500:]}")
    return {"s": wall, "rss_mb": peak}


_KEYS = {"kind": "k", "rank": "r", "epoch": "e", "step": "s", "total_steps": "n", "loss": "l", "accuracy": "a",
         "metrics": "m", "samples_per_s": "sps", "tokens_per_s": "tps", "data_wait_s": "dw", "compute_s": "cs",
         "comm_s": "cm", "device_mem_mb": "mem", "peak_mem_mb": "pk", "data_wait": "dwf", "comm_wait": "cwf"}


def _round(v):
    return float(f"{v:.6g}") if isinstance(v, float) else v


def step_bytes(path: Path, sample: int = 20_000) -> dict:
    """Bytes per step event as written, and what each smaller form would take (the same events):
    no nulls/empty/false fields, floats to 6 significant digits (`t` to the millisecond), short
    keys, all three; and gzip."""
    from torchdeck.engine import events

    raw, lines = 0, []
    with open(path, "rb") as fh:
        for line in fh:
            if b'"kind":"step"' in line:
                lines.append(line)
                if len(lines) >= sample:
                    break
    evs = [json.loads(x) for x in lines]
    raw = sum(len(x) for x in lines) / len(lines)

    def size(f):
        return sum(len(events.dumps(f(e))) + 1 for e in evs) / len(evs)

    drop = lambda e: {k: v for k, v in e.items() if v is not None and v != {} and v is not False}
    rnd = lambda e: {k: round(v, 3) if k == "t" else _round(v) for k, v in e.items()}  # t: to the millisecond
    short = lambda e: {_KEYS.get(k, k): v for k, v in e.items()}
    blob = b"".join(lines)
    return {"raw": raw, "no_nulls": size(drop), "rounded": size(rnd), "short_keys": size(short),
            "no_nulls_rounded": size(lambda e: rnd(drop(e))), "all_three": size(lambda e: short(rnd(drop(e)))),
            "gzip": len(gzip.compress(blob, 6)) / len(lines)}


def run(quick: bool = False, reps: int = 3) -> dict:
    hours = [1 / 60] if quick else [float(h) for h in os.environ.get("LONG_RUN_HOURS", "1,4,24").split(",")]
    before = os.environ.get("LONG_RUN_BEFORE")
    trees = [("after", C.ROOT)] + ([("before", Path(before))] if before else [])
    load = [os.getloadavg()]
    rows, res = [], {"name": NAME, "sizes": {}, "load": load}
    for h in hours:
        root = C.tmpdir("long-run")
        try:
            t0 = time.perf_counter()
            rd, n = make_run(root, h)
            made_s = time.perf_counter() - t0
            size = rd.events_path.stat().st_size
            entry = {"hours": h, "ranks": RANKS, "step_events": n, "bytes": size, "make_s": made_s,
                     "checkpoint": CHECKPOINT_COST[-1]}
            print(f"  long_run {h:g} h: view checkpoint {CHECKPOINT_COST[-1]['bytes'] / 1e3:.0f} kB written by the "
                  f"supervisor's writer in {CHECKPOINT_COST[-1]['s'] * 1e3:.0f} ms", flush=True)
            # the code before this change holds ~3.7 KB a step event: 24 hours x 8 ranks would need ~25 GB
            use = [(k, p) for k, p in trees if k == "after" or n < 3_000_000]
            n_reps = reps if h <= 1 else min(reps, 2) if h <= 4 else 1  # a day's run: one read each
            label = f"{h:g} h" if h >= 1 else f"{h * 60:g} min"
            for what, fn in (("attach", _attach), ("monitor", _monitor), ("metrics_csv", _metrics_csv),
                             ("metrics_tensorboard", _metrics_tensorboard)):
                if what not in PARTS:
                    continue
                if what == "metrics_tensorboard" and importlib.util.find_spec("tensorboard") is None:
                    print("  long_run: metrics --tensorboard skipped: the tensorboard package is not installed "
                          "(pip install -e '.[test]')", flush=True)
                    continue
                got = C.alternate(n_reps, *[(lambda p=p: fn(rd, p)) for _, p in use])
                for (k, _), ms in zip(use, got):
                    e = entry.setdefault(k, {})[what] = {"s": C.median([m["s"] for m in ms]),
                                                        "rss_mb": max(m["rss_mb"] for m in ms), "runs": ms}
                    rows.append([label, WHAT[what], k, n, f"{size / 2**20:.0f} MiB", e["s"], f"{e['rss_mb']:.0f}"])
                    print(f"  long_run {label} {what} {k}: {e['s']:.2f} s, {e['rss_mb']:.0f} MB", flush=True)
            if h == hours[0]:
                b = res["bytes"] = step_bytes(rd.events_path)
                b["per_hour_per_rank_mb"] = b["raw"] * RATE * 3600 / 1e6
            res["sizes"][f"{h:g}"] = entry
        finally:
            shutil.rmtree(root, ignore_errors=True)
        load.append(os.getloadavg())
    b = res["bytes"]
    text = C.table(f"long_run: a finished {RANKS}-rank run ({RATE} step events/s a rank) read back",
                   ["run", "what", "code", "step events", "events.jsonl", "seconds", "peak RSS (MB)"], rows)
    text += C.table("long_run: bytes per step event (the same events in smaller forms)",
                    ["as written", "no nulls", "6 digits", "both (same keys)", "short keys", "all three", "gzip -6",
                     "MB/hour/rank"],
                    [[f"{b['raw']:.0f}", f"{b['no_nulls']:.0f}", f"{b['rounded']:.0f}", f"{b['no_nulls_rounded']:.0f}",
                      f"{b['short_keys']:.0f}", f"{b['all_three']:.0f}", f"{b['gzip']:.0f}",
                      f"{b['per_hour_per_rank_mb']:.1f}"]])
    text += "\nview checkpoint (view.ckpt.json) per size: " + "; ".join(
        f"{h} h {e['checkpoint']['bytes'] / 1e3:.0f} kB in {e['checkpoint']['s'] * 1e3:.0f} ms"
        for h, e in res["sizes"].items())
    text += "\nload average before/after each size: " + "; ".join(", ".join(f"{x:.1f}" for x in l) for l in load)
    big = res["sizes"].get("24", {}).get("after", {})
    res["targets"] = []
    for what, m in big.items():
        if not what.startswith("metrics_"):  # the issue asks metrics export to stream (memory), not to be fast
            res["targets"].append({"what": f"{WHAT[what]} of 24 h x 8 ranks (s)", "value": m["s"],
                                   "target": f"<= {TARGET_S}", "verdict": C.verdict(m["s"], TARGET_S, higher_is_better=False)})
        res["targets"].append({"what": f"{WHAT[what]} of 24 h x 8 ranks peak RSS (MB)", "value": m["rss_mb"],
                               "target": f"<= {TARGET_MB}", "verdict": C.verdict(m["rss_mb"], TARGET_MB, higher_is_better=False)})
    res["text"] = text
    return res
