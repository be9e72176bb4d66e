"""3. What watching costs a run: torchdeck cpu runs timed over whole epochs, (a) with step
events only at epoch ends and nobody watching, (b) at the default log_every_n_steps, and
(c) at the default with a watcher process tailing the events and sampling GPU/host at the
app's rates (bench.watcher, using app.sources). Target: (b) and (c) cost < 1 % of (a).

Two measurements of the same thing. The throughput difference is the direct one, but a run's
throughput varies by a few percent from one run to the next on a shared machine, more than the
1 % it has to resolve. So the cost is also accounted: CPU seconds the supervisor and the watcher
take inside the timed window (read from /proc every 50 ms) plus the rank's own time spent
emitting events (emit calls timed here, times the events in the window), over the CPU time the
training had (window x threads). On a machine whose cores the ranks keep busy, a CPU second
taken by a watcher is a second taken from training. The verdict is on the accounted cost; the
throughput difference is printed beside it with its spread."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from bench import common as C

NAME = "monitoring_cost"
TARGET = 0.01
NEVER = 10 ** 9


def sizes(quick: bool) -> dict:
    # quick: the first epoch warms up, the second is the timed window (one window proves the accounting)
    return dict(train=256, batch=32, epochs=2) if quick else dict(train=8192, batch=64, epochs=6)


def emit_cost_s(n: int = 2000) -> float:
    """Seconds one step event costs the rank's training thread: the real PipeReporter on the
    rank's own pipe, read by the supervisor's EventReader into its EventWriter, as in a run."""
    import multiprocessing as mp
    import os
    import queue
    import tempfile

    from torchdeck.engine import events
    from torchdeck.engine.launch.ranks import EventReader
    from torchdeck.engine.supervisor import EventWriter
    from torchdeck.engine.worker import PipeReporter

    with tempfile.TemporaryDirectory() as d:
        writer = EventWriter(Path(d) / "events.jsonl", queue.Queue())
        writer.start()
        r, w = mp.get_context("spawn").Pipe(duplex=False)
        reader = EventReader([os.dup(r.fileno())], writer.q.put)
        r.close()
        reader.start()
        emit = PipeReporter(w, 0)
        fields = dict(epoch=3, step=1230, total_steps=9000, loss=0.4213, accuracy=0.875, samples_per_s=11234.5,
                      data_wait_s=0.0123, compute_s=0.0567, lr=0.05)
        for _ in range(50):
            emit("step", **fields)
        t0 = time.perf_counter()
        for _ in range(n):
            emit("step", **fields)
        spent = time.perf_counter() - t0
        w.close()
        reader.stop()
        writer.stop()
        writer.close()
        assert len(events.read_all(Path(d) / "events.jsonl")) == n + 50
    return spent / n


def _cpu_s(pid: int | None) -> float | None:
    import psutil

    try:
        t = psutil.Process(pid).cpu_times()
        return t.user + t.system
    except (psutil.Error, TypeError, ValueError):
        return None


def _at(samples: list[tuple[float, float]], t: float) -> float | None:
    """CPU seconds at time t, interpolated between the 50 ms samples around it."""
    samples = [s for s in samples if s[1] is not None]
    if not samples:
        return None
    before = [s for s in samples if s[0] <= t]
    after = [s for s in samples if s[0] >= t]
    if not before:
        return after[0][1]
    if not after:
        return before[-1][1]
    (t0, c0), (t1, c1) = before[-1], after[0]
    return c0 if t1 == t0 else c0 + (c1 - c0) * (t - t0) / (t1 - t0)


def _run(s: dict, root: Path, log_every: int, watcher: bool) -> dict:
    spe = s["train"] // s["batch"]
    cfg = C.engine_config(data={"train_size": s["train"], "val_size": 256},
                          train={"batch_size": s["batch"], "epochs": s["epochs"], "max_steps": 0,
                                 "log_every_n_steps": log_every})
    w: dict = {}
    cpu: dict[str, list] = {"supervisor": [], "watcher": []}

    def poll(run):
        if watcher and "proc" not in w:
            env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(C.ROOT), os.environ.get("PYTHONPATH", "")]))
            w["proc"] = subprocess.Popen([sys.executable, "-m", "bench.watcher", str(run.path)],
                                         stdout=subprocess.PIPE, text=True, env=env, cwd=str(C.ROOT))
        now = time.time()
        cpu["supervisor"].append((now, _cpu_s(run.supervisor_pid())))
        if "proc" in w:
            cpu["watcher"].append((now, _cpu_s(w["proc"].pid)))

    res = C.run_engine(cfg, root, on_poll=poll)
    marks = [m for m in C.step_marks(res["events"]) if m[0] % spe == 0]  # epoch ends: in every variant
    timed = [m for m in marks if m[0] >= spe]
    t0, t1 = (timed[0][1], timed[-1][1]) if len(timed) >= 2 else (None, None)
    ready = next((e for e in res["events"] if e.get("kind") == "rank_ready"), {})
    out = {"samples_per_s": C.throughput(marks, s["batch"], spe),
           "step_events": sum(1 for e in res["events"] if e.get("kind") == "step"),
           "window_s": (t1 - t0) if t0 else None, "threads": ready.get("threads"),
           "events_in_window": sum(1 for e in res["events"] if t0 and t0 < e.get("t", 0) <= t1)}
    for who, samples in cpu.items():
        a, b = (_at(samples, t0), _at(samples, t1)) if t0 else (None, None)
        out[f"{who}_cpu_s"] = (b - a) if a is not None and b is not None else None
    if "proc" in w:
        stdout, _ = w["proc"].communicate(timeout=60)
        out["watcher"] = json.loads(stdout.strip().splitlines()[-1]) if stdout.strip() else None
    return out


def accounted(r: dict, emit_s: float) -> float | None:
    """CPU taken from training in the window, as a fraction of the training's CPU time."""
    if not r.get("window_s"):
        return None
    taken = (r.get("supervisor_cpu_s") or 0.0) + (r.get("watcher_cpu_s") or 0.0) + r["events_in_window"] * emit_s
    return taken / (r["window_s"] * (r.get("threads") or os.cpu_count() or 1))


def run(quick: bool = False, reps: int = 3) -> dict:
    s = sizes(quick)
    root = C.tmpdir(NAME)
    emit_s = emit_cost_s(500 if quick else 5000)
    variants = [("epoch-end events only, no watcher", NEVER, False),
                ("default log_every_n_steps (10)", 10, False),
                ("default + watcher (tail 0.2 s, samplers 1 s)", 10, True)]
    if quick:  # the baseline and the watched run prove the accounting and the watcher; the default
        # without a watcher is the same run with fewer parts
        variants = [variants[0], variants[2]]
    res = {v[0]: [] for v in variants}
    for i in range(reps):
        order = variants[i % len(variants):] + variants[:i % len(variants)]
        for label, every, watch in order:
            res[label].append(_run(s, root, every, watch))
    base_label = variants[0][0]
    base_acc = C.median([accounted(r, emit_s) for r in res[base_label]])
    rows, costs, measured = [], {}, {}
    for label, _, _ in variants:
        rs = res[label]
        acc = C.median([accounted(r, emit_s) for r in rs])
        cost = acc - base_acc if acc is not None and base_acc is not None else None
        pairs = [1 - a["samples_per_s"] / b["samples_per_s"] for a, b in zip(rs, res[base_label])
                 if a["samples_per_s"] and b["samples_per_s"]]
        costs[label] = cost
        measured[label] = C.median(pairs)
        spread = f"{min(pairs) * 100:+.1f}..{max(pairs) * 100:+.1f} %" if pairs and label != base_label else "-"
        rows.append([label, C.median([r["samples_per_s"] for r in rs]), C.median([r["step_events"] for r in rs]),
                     C.median([r["supervisor_cpu_s"] for r in rs]), C.median([r.get("watcher_cpu_s") for r in rs]),
                     C.median([r["window_s"] for r in rs]),
                     None if acc is None else f"{acc * 100:.3f} %",
                     None if cost is None else f"{cost * 100:+.3f} %",
                     "-" if label == base_label or measured[label] is None else f"{measured[label] * 100:+.1f} %",
                     spread])
    watcher_info = next((r.get("watcher") for r in res[variants[-1][0]] if r.get("watcher")), None)
    text = C.table(f"monitoring_cost: cpu cnn, {s['epochs']} epochs x {s['train'] // s['batch']} steps, "
                   f"epochs 2..{s['epochs']} timed, median of {reps}",
                   ["variant", "samples/s", "step events", "supervisor CPU s", "watcher CPU s", "window s",
                    "CPU taken", "cost (accounted)", "cost (throughput)", "throughput spread"], rows)
    text += (f"\none step event costs the rank {emit_s * 1e6:.1f} us (PipeReporter into its own pipe, drained "
             f"by the EventWriter); watcher: {watcher_info}")
    if quick:
        text += "\nquick: no watcher and default + watcher only (default without a watcher: full run)"
    targets = [{"what": f"monitoring cost (accounted): {label}", "value": costs[label], "target": f"< {TARGET:.0%}",
                "verdict": C.verdict(costs[label], TARGET, higher_is_better=False)} for label, _, _ in variants[1:]]
    return {"name": NAME, "text": text, "sizes": s, "reps": reps, "runs": res, "costs": costs,
            "throughput_costs": measured, "emit_cost_s": emit_s, "watcher": watcher_info, "targets": targets}
