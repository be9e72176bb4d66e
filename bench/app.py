"""5. The app: time to first screen, and how it keeps up with a busy run.

- import: `import app.main` in a fresh interpreter (and a bare interpreter for reference);
  torch must not be imported.
- first screen: `torchdeck` started in a real pseudo-terminal (140x45); seconds from process
  start until the screen is painted. Target <= 0.5 s.
- live: the app showing the Monitor screen of a run fed by 8 simulated ranks x 50 step
  events/s (bench.fake_run); latency from an event reaching events.jsonl until its step number
  is written to the terminal (p95 <= 250 ms), and the app's CPU use over the window (< 15 %).
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from bench import common as C
from bench.ptyterm import PtyProcess, first_screen, visible

NAME = "app"
STEP_RE = re.compile(r"(?<![\d,.])(\d{3}),?(\d{3})(?![\d,])")


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(C.ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def import_time() -> dict:
    code = ("import sys,time;t=time.perf_counter();import torchdeck.app.main;"
            "print(time.perf_counter()-t, 'torch' in sys.modules)")
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), cwd=str(C.ROOT))
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-1500:])
    secs, torch_loaded = out.stdout.split()
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    bare = time.perf_counter() - t0
    return {"import_s": float(secs), "process_wall_s": wall, "bare_python_s": bare,
            "torch_imported": torch_loaded == "True"}


def _torchdeck_argv() -> list[str]:
    script = Path(sys.executable).parent / "torchdeck"
    return [str(script)] if script.exists() else [sys.executable, "-m", "torchdeck.cli"]


def live(seconds: float, ranks: int = 8, rate: float = 50.0, warm_s: float = 4.0,
         monitor: list[str] | None = None, paint_chars: int = 300) -> dict:
    """monitor: argv of the watching program, RUN_DIR appended (default: the app's Monitor screen)."""
    import psutil

    from bench import fake_run
    from torchdeck.engine.events import read_all

    root = C.tmpdir(NAME)
    rd = fake_run.create(root, ranks)
    (rd.events_path).touch()
    app = PtyProcess((monitor or [sys.executable, "-m", "bench.app_monitor"]) + [str(rd.path)], env=_env(), cwd=str(C.ROOT))
    seen: dict[int, float] = {}
    feeder = None
    cpu0 = cpu1 = None
    try:
        # let the app start and paint before the run begins
        t_end_start = time.monotonic() + 30
        painted, shown = 0, ""
        while time.monotonic() < t_end_start and painted < paint_chars:
            got = app.read(0.5)
            if got:
                shown = (shown + visible(got[1]))[-3000:]
                painted += sum(1 for c in got[1].decode("utf-8", "ignore") if not c.isspace())
            elif app.proc.poll() is not None:
                raise RuntimeError(f"the monitor exited before painting: {' '.join(shown.split())[-1500:]}")
        feeder = subprocess.Popen([sys.executable, "-m", "bench.fake_run", str(rd.path), "--ranks", str(ranks),
                                   "--rate", str(rate), "--seconds", str(seconds + warm_s)],
                                  env=_env(), cwd=str(C.ROOT), stdout=subprocess.PIPE, text=True)
        proc = psutil.Process(app.proc.pid)
        t_feed = time.monotonic()
        t_cpu0 = t_cpu1 = None
        tail = ""
        while feeder.poll() is None or time.monotonic() - t_feed < seconds + warm_s + 1:
            if t_cpu0 is None and time.monotonic() - t_feed >= warm_s:
                t_cpu0, cpu0 = time.monotonic(), proc.cpu_times()
            got = app.read(0.05)
            if got is None:
                if app.proc.poll() is not None:
                    raise RuntimeError(f"the monitor exited during the live run (code {app.proc.returncode})")
                if feeder.poll() is not None:
                    break
                continue
            t, data = got
            text = tail + visible(data)
            tail = text[-8:]  # a number split across two reads
            for a, b in STEP_RE.findall(text):
                seen.setdefault(int(a + b), t)
            if t_cpu0 is not None and t_cpu1 is None and time.monotonic() - t_cpu0 >= seconds:
                t_cpu1, cpu1 = time.monotonic(), proc.cpu_times()
        if t_cpu1 is None and cpu0 is not None:
            t_cpu1, cpu1 = time.monotonic(), proc.cpu_times()
    finally:
        if feeder is not None:
            feeder.wait(60)
        app.close()
    written = {e["step"]: e["t"] for e in read_all(rd.events_path)
               if e.get("kind") == "step" and isinstance(e.get("step"), int)}
    lat, missing = reflect_latencies(written, seen, ranks, warm_s, tail_s=1.0)
    cpu = None
    if cpu0 is not None and cpu1 is not None and t_cpu1 > t_cpu0:
        cpu = ((cpu1.user + cpu1.system) - (cpu0.user + cpu0.system)) / (t_cpu1 - t_cpu0)
    pct = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] if lat else None
    return {"events": len(written), "events_timed": len(lat), "never_reflected": missing, "latency_p50_s": pct(0.5),
            "latency_p95_s": pct(0.95), "latency_max_s": lat[-1] if lat else None,
            "cpu_fraction_of_core": cpu, "window_s": seconds}


def reflect_latencies(written: dict, seen: dict, ranks: int, warm_s: float, tail_s: float):
    """For each step event (after warm-up, and not in the last tail_s of the feed): seconds from
    reaching the file until the screen first shows that rank at that step or a later one (the app
    shows the latest value, so a newer step reflects the older event too)."""
    import bisect

    from bench.fake_run import BASE

    if not written:
        return [], 0
    t_first, t_last = min(written.values()), max(written.values())
    by_rank: dict[int, list[tuple[int, float]]] = {}
    for step, t in seen.items():
        if step in written:
            by_rank.setdefault((step - BASE) % 8, []).append((step, t))
    suffix: dict[int, tuple[list[int], list[float]]] = {}
    for r, xs in by_rank.items():
        xs.sort()
        steps = [x[0] for x in xs]
        mins, m = [], float("inf")
        for _, t in reversed(xs):
            m = min(m, t)
            mins.append(m)
        suffix[r] = (steps, mins[::-1])
    lat, missing = [], 0
    for step, t in written.items():
        if t < t_first + warm_s or t > t_last - tail_s:
            continue
        steps, mins = suffix.get((step - BASE) % 8, ([], []))
        i = bisect.bisect_left(steps, step)
        if i == len(steps):
            missing += 1
        else:
            lat.append(mins[i] - t)
    lat.sort()
    return lat, missing


def run(quick: bool = False, reps: int = 3) -> dict:
    if importlib.util.find_spec("torchdeck.app.main") is None:
        return {"name": NAME, "skipped": "app.main is not there yet", "targets": [],
                "text": "\n### app\nNOT RUN: app.main is not importable in this checkout."}
    reps = min(reps, 5)
    imp = [import_time() for _ in range(reps)]
    fs = [first_screen(_torchdeck_argv(), env=_env(), cwd=str(C.ROOT)) for _ in range(reps)]
    window, warm = (1.5, 0.5) if quick else (20.0, 4.0)
    attach = None
    if importlib.util.find_spec("torchdeck.app.monitor") is None:
        lv = {"skipped": "app.monitor is not there yet"}
        # the headless watcher does the same job in a terminal: measured so the numbers exist
        attach = live(window, warm_s=warm, monitor=_torchdeck_argv() + ["attach"], paint_chars=20)
    else:
        lv = live(window, warm_s=warm)
    first = C.median([r["first_paint_s"] for r in fs])
    med = lambda xs, k: C.median([r[k] for r in xs])
    rows = [
        ["bare `python -c pass`", med(imp, "bare_python_s"), "-"],
        ["`import app.main` (in-process)", med(imp, "import_s"), "-"],
        ["process with `import app.main`", med(imp, "process_wall_s"), "-"],
        ["`torchdeck`: first paint in a pty", first, "<= 0.5 s"],
        ["`torchdeck`: screen settled", med(fs, "settled_s"), "-"],
    ]
    text = C.table(f"app start-up, median of {reps} (torch imported by app.main: "
                   f"{any(r['torch_imported'] for r in imp)})", ["what", "seconds", "target"], rows)
    if attach is not None:
        text += C.table(f"`torchdeck attach` (headless progress, not the app) on the same feed, "
                        f"{attach['window_s']:.0f} s window",
                        ["events written", "events timed", "latency p50 ms", "latency p95 ms", "CPU % of one core"],
                        [[attach["events"], attach["events_timed"], _ms(attach["latency_p50_s"]),
                          _ms(attach["latency_p95_s"]), (attach["cpu_fraction_of_core"] or 0) * 100]])
    if "skipped" in lv:
        text += f"\napp live: NOT RUN: {lv['skipped']}"
        lv = dict.fromkeys(["events", "events_timed", "never_reflected", "latency_p50_s", "latency_p95_s",
                            "latency_max_s", "cpu_fraction_of_core"], None) | {"window_s": 0, **lv}
    else:
        cpu = lv["cpu_fraction_of_core"]
        text += C.table(f"app live: 8 simulated ranks x 50 step events/s, {lv['window_s']:.0f} s window",
                        ["events written", "events timed", "never shown", "latency p50 ms", "latency p95 ms",
                         "latency max ms", "app CPU % of one core"],
                        [[lv["events"], lv["events_timed"], lv["never_reflected"], _ms(lv["latency_p50_s"]),
                          _ms(lv["latency_p95_s"]), _ms(lv["latency_max_s"]), None if cpu is None else cpu * 100]])
    targets = [
        {"what": "first screen s", "value": first, "target": "<= 0.5", "verdict": C.verdict(first, 0.5, False)},
        {"what": "event-to-screen latency p95 s", "value": lv["latency_p95_s"], "target": "<= 0.25",
         "verdict": C.verdict(lv["latency_p95_s"], 0.25, False)},
        {"what": "app CPU fraction of one core", "value": lv["cpu_fraction_of_core"], "target": "< 0.15",
         "verdict": C.verdict(lv["cpu_fraction_of_core"], 0.15, False)},
        {"what": "app.main imports torch", "value": any(r["torch_imported"] for r in imp), "target": "False",
         "verdict": "met" if not any(r["torch_imported"] for r in imp) else "MISSED"},
    ]
    for r in fs:
        r.pop("text", None)
    return {"name": NAME, "text": text, "import": imp, "first_screen": fs, "live": lv, "attach": attach,
            "targets": targets}


def _ms(v):
    return None if v is None else v * 1000
