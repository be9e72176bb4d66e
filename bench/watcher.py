"""A stand-in for the app watching a run: tails events.jsonl and samples GPU/host like the
Monitor screen does, in its own process, until the run's status.json appears.

Uses the app's own sources (app.sources.nvml.GPUSource, app.sources.host.HostSource) when they
are importable; otherwise psutil/NVML directly at the same rates (reported as 'fallback').

    python -m bench.watcher RUN_DIR [--tail-s 0.2] [--sample-s 1.0]
"""
from __future__ import annotations

import argparse
import json
import threading
import time
from pathlib import Path


def _sampler(get_pids, every: float, stop: threading.Event, counts: dict) -> None:
    try:
        from app.sources.host import HostSource
        from app.sources.nvml import GPUSource

        gpu, host = GPUSource(), HostSource()
        sample_gpu, sample_host = gpu.sample, lambda: host.sample(get_pids())
        counts["sources"] = "app.sources"
    except ImportError:
        import psutil

        counts["sources"] = "fallback (psutil + NVML direct)"
        try:
            import pynvml

            pynvml.nvmlInit()
            handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
            sample_gpu = lambda: [(pynvml.nvmlDeviceGetUtilizationRates(h), pynvml.nvmlDeviceGetMemoryInfo(h))
                                  for h in handles]
        except Exception:
            sample_gpu = lambda: []
        procs: dict[int, psutil.Process] = {}

        def sample_host():
            out = [psutil.cpu_percent(), psutil.virtual_memory()]
            for pid in get_pids():
                try:
                    p = procs.setdefault(pid, psutil.Process(pid))
                    out.append((p.cpu_percent(), p.memory_info().rss))
                except psutil.Error:
                    pass
            return out
    while not stop.is_set():
        t0 = time.monotonic()
        sample_gpu()
        sample_host()
        counts["samples"] = counts.get("samples", 0) + 1
        stop.wait(max(0.0, every - (time.monotonic() - t0)))


def watch(run_dir: Path, tail_s: float, sample_s: float, timeout: float = 900) -> dict:
    from engine.events import Tail

    tail = Tail(run_dir / "events.jsonl")
    pids: list[int] = []
    counts: dict = {"events": 0}
    stop = threading.Event()
    th = threading.Thread(target=_sampler, args=(lambda: list(pids), sample_s, stop, counts), daemon=True)
    th.start()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for ev in tail.poll():
            counts["events"] += 1
            if ev.get("kind") == "rank_ready":
                pids.append(ev.get("pid"))
        if (run_dir / "status.json").exists():
            break
        time.sleep(tail_s)
    stop.set()
    th.join(5)
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
