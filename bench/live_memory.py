"""Issue 37 item 3: the Monitor's memory while it watches a live run for a long time.

bench/fake_run.py writes a live run (step events of every rank, node samples where several nodes)
with its time compressed (--speed: the events' own times run SPEED times faster than the clock);
the real app shows the Monitor of it in an 80x24 pty (bench/app_monitor.py), and its RSS is
polled every second. Reported: RSS at 1, 5, 10 and 30 minutes of the run's time, and how long
after the writer ended the Monitor said FINISHED (it kept up where that is short).

    python -m bench.live_memory                                        # 8 ranks x 50/s, 30 min at 6x
    LIVE_MEMORY="32x8x10" LIVE_MINUTES=10 LIVE_SPEED=1 python -m bench.live_memory
        # 32 nodes x 8 ranks x 10 step events/s (the fleet benchmark's rate), 10 minutes, real time
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from bench import common as C

NAME = "live_memory"
MARKS_MIN = (1, 5, 10, 30)


def _rss_mb(pid: int) -> float:
    import psutil

    try:
        return psutil.Process(pid).memory_info().rss / 2**20
    except psutil.Error:
        return 0.0


def watch(nodes: int, ranks: int, rate: float, minutes: float, speed: float) -> dict:
    """One live run watched from start to end: [(run minutes, RSS MB, events MB)], catch-up seconds."""
    from bench.fake_run import create
    from bench.ptyterm import PtyProcess, visible

    root = C.tmpdir("live-memory")
    rd = create(root, ranks * nodes)
    env = dict(os.environ, TORCHDECK_RUNS=str(root))
    writer = subprocess.Popen([sys.executable, "-m", "bench.fake_run", str(rd.path), "--nodes", str(nodes), "--ranks",
                               str(ranks), "--rate", str(rate), "--seconds", str(minutes * 60), "--speed", str(speed)],
                              cwd=str(C.ROOT), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    mon = PtyProcess([sys.executable, "-m", "bench.app_monitor", str(rd.path)], env, cols=80, rows=24, cwd=str(C.ROOT))
    samples, seen, ended, done = [], "", None, None
    try:
        t0 = time.monotonic()
        next_sample = t0
        deadline = t0 + minutes * 60 / speed + 600
        while time.monotonic() < deadline:
            got = mon.read(0.1)
            if got is not None:
                seen = (seen + visible(got[1]))[-4000:]
            now = time.monotonic()
            if ended is None and writer.poll() is not None:
                ended = now
            if now >= next_sample:
                size = rd.events_path.stat().st_size if rd.events_path.exists() else 0
                samples.append((min(minutes, (now - t0) * speed / 60), _rss_mb(mon.proc.pid), size / 2**20))
                next_sample += 1.0
            if ended is not None and "FINISHED" in seen:
                done = now
                break
            if mon.proc.poll() is not None:
                raise RuntimeError(f"the Monitor exited {mon.proc.returncode}: {' '.join(seen.split())[-400:]}")
    finally:
        mon.close()
        if writer.poll() is None:
            writer.kill()
        writer.wait()
        shutil.rmtree(root, ignore_errors=True)
    if writer.returncode != 0:
        raise RuntimeError(f"fake_run ended {writer.returncode}: {writer.stderr.read()[-1500:]}")
    return {"samples": samples, "catch_up_s": None if done is None else done - ended,
            "step_events": int(writer.stdout.read().strip() or 0)}


def at(samples, minute: float):
    """RSS of the first sample at or after `minute` of the run's time."""
    return next((rss for m, rss, _ in samples if m >= minute), None)


def run(quick: bool = False, reps: int = 1) -> dict:
    spec = os.environ.get("LIVE_MEMORY", "1x8x50")  # nodes x ranks x step events/s a rank
    nodes, ranks, rate = (float(x) for x in spec.split("x"))
    minutes = 2.0 if quick else float(os.environ.get("LIVE_MINUTES", "30"))
    speed = float(os.environ.get("LIVE_SPEED", "6"))
    load = [os.getloadavg()]
    got = watch(int(nodes), int(ranks), rate, minutes, speed)
    load.append(os.getloadavg())
    s = got["samples"]
    marks = [m for m in MARKS_MIN if m <= minutes]
    rows = [[f"{m} min", f"{at(s, m):.0f}"] for m in marks] + [["peak", f"{max(r for _, r, _ in s):.0f}"]]
    title = (f"live_memory: the Monitor watching a live run of {int(nodes)} node(s) x {int(ranks)} ranks x {rate:g} "
             f"step events/s, {minutes:g} min at {speed:g}x ({got['step_events']} step events, "
             f"{s[-1][2]:.0f} MB of events)")
    text = C.table(title, ["run time", "app RSS (MB)"], rows)
    text += (f"\nMonitor said FINISHED {got['catch_up_s']:.1f} s after the writer ended" if got["catch_up_s"] is not None
             else "\nMonitor never said FINISHED")
    text += "\nload average before/after: " + "; ".join(", ".join(f"{x:.1f}" for x in l) for l in load)
    res = {"name": NAME, "spec": spec, "minutes": minutes, "speed": speed, "load": load, **got, "text": text}
    lo, hi = at(s, min(5, minutes)), at(s, minutes)
    res["targets"] = [{"what": f"app RSS at {minutes:g} min / at {min(5, minutes):g} min", "value": hi / lo,
                       "target": "<= 1.10", "verdict": C.verdict(hi / lo, 1.10, higher_is_better=False)}]
    return res


if __name__ == "__main__":
    ap = argparse.ArgumentParser(prog="python -m bench.live_memory")
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    r = run(quick=a.quick)
    print(r["text"])
    print("samples (run min, RSS MB, events MB):", [(round(m, 2), round(x), round(e)) for m, x, e in r["samples"][::10]])
