"""A stand-in for the app watching a run: tails events.jsonl and samples GPU/host like the
Monitor screen does, in its own process, until the run's status.json appears.

Uses the app's own sources (app.sources.nvml.GPUSource, app.sources.host.HostSource, with the
ranks' pids as the Monitor passes them). Prints one JSON line at the end: events read, samples
taken, the first sampler error if any (a watcher that stopped sampling measures nothing), and
its own CPU seconds and wall time, so the cost of watching can be accounted, not only inferred
from noisy throughput differences.

    python -m bench.watcher RUN_DIR [--tail-s 0.2] [--sample-s 1.0]
"""
from __future__ import annotations

import argparse
import json
import threading
import time
from pathlib import Path


def _sampler(get_pids, every: float, stop: threading.Event, counts: dict) -> None:
    from torchdeck.app.sources.host import HostSource
    from torchdeck.app.sources.nvml import GPUSource

    gpu, host = GPUSource(), HostSource()
    counts["gpu_status"] = gpu.status()[1] or "ok"
    while not stop.is_set():
        t0 = time.monotonic()
        try:
            gpu.sample()
            host.sample(get_pids())
            counts["samples"] = counts.get("samples", 0) + 1
        except Exception as exc:  # reported, and the loop goes on as the Monitor's would
            counts.setdefault("sampler_error", f"{type(exc).__name__}: {exc}")
        stop.wait(max(0.0, every - (time.monotonic() - t0)))


def watch(run_dir: Path, tail_s: float, sample_s: float, timeout: float = 900) -> dict:
    from torchdeck.engine.runs.follow import EventTail

    t0, c0 = time.monotonic(), time.process_time()
    tail = EventTail(run_dir / "events.jsonl")
    pids: dict[int, int | None] = {}  # pid -> rank, as the Monitor hands them to HostSource
    counts: dict = {"events": 0}
    stop = threading.Event()
    th = threading.Thread(target=_sampler, args=(lambda: dict(pids), sample_s, stop, counts), daemon=True)
    th.start()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for ev in tail.poll():
            counts["events"] += 1
            if ev.get("kind") in ("rank_ready", "run_started") and ev.get("pid"):
                pids[int(ev["pid"])] = ev.get("rank")  # run_started: the supervisor, rank None
        if (run_dir / "status.json").exists():
            break
        time.sleep(tail_s)
    stop.set()
    th.join(5)
    counts["ranks_sampled"] = len(pids)
    counts["cpu_s"] = round(time.process_time() - c0, 4)
    counts["wall_s"] = round(time.monotonic() - t0, 3)
    return counts


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("run_dir")
    ap.add_argument("--tail-s", type=float, default=0.2)
    ap.add_argument("--sample-s", type=float, default=1.0)
    a = ap.parse_args(argv)
    print(json.dumps(watch(Path(a.run_dir), a.tail_s, a.sample_s)), flush=True)


if __name__ == "__main__":
    main()
