"""The supervisor's CPU per rank event on a script run's path (issue 29): rank processes send
`torchdeck.log`-shaped step events through the real channel (engine.launch.channel.Channel, one
pipe per rank, at a steady rate as a training loop does), and this process runs the supervisor's
real reader (engine.launch.ranks.EventReader) and writer (engine.supervisor.EventWriter, with its
RunView and metrics.csv): everything the supervisor does per event. Its CPU is the reader's and
the writer's threads' time by the scheduler (/proc/self/task/TID/schedstat) over the run (the
senders are other processes); the process's time.process_time() less its idle polling is also
printed (tick-based on this VM: it overcharges threads that timers wake).

    python -m bench.supervisor_event_cost [--events 4000] [--rate 400] [--ranks 2] [--reps 3] [--profile]

Paced, not flooded: at a training loop's rate each event arrives alone and wakes the reader and
the writer by itself; a flood would be read many lines per wake-up and measure a cheaper path.

    python -m bench.supervisor_event_cost --real [--seconds 15] [--reps 2]

A real `torchdeck launch --nproc-per-node 2` run instead: each rank busy-steps (10 ms of pure
Python, both cores taken, as training does) and calls torchdeck.log after every step, with
TORCHDECK_LOG_EVERY_S at its default (coalesced), at 0 (every call an event), and without
log() at all (what is left: the supervisor's and the CLI's own polling), alternating. Rank 0
reads the CPU each thread of the supervisor, and the CLI following the run, spent over the
middle of the run from /proc/PID/task/TID/schedstat (the scheduler's own nanoseconds: on this
VM tick-based time.process_time() overcharges threads woken by timers), and counts the step
events written meanwhile.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SENDER = r"""
import os, sys, time
from torchdeck.engine.launch.channel import Channel
fd, rank, n, every = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
os.environ["RANK"] = str(rank)
ch = Channel(fd)
sys.stdin.readline()  # go
t0 = time.monotonic()
for i in range(n):
    ch.send("step", step=i + 1, epoch=None, loss=2.302585 - i * 1e-6, metrics={}, steps_per_s=None,
            samples_per_s=6400.0 + i % 7, tokens_per_s=None)
    nxt = t0 + (i + 1) * every
    d = nxt - time.monotonic()
    if d > 0:
        time.sleep(d)
os.close(fd)
"""


PROBE = r"""
import json, os, sys, time
import torchdeck
secs, out, mode = float(sys.argv[1]), sys.argv[2], sys.argv[3]
rank = int(os.environ.get("RANK", "0"))
sup = os.getppid()


def sched(pid):
    got = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return got
    for tid in tids:
        try:
            got[tid] = int(open(f"/proc/{pid}/task/{tid}/schedstat").read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return got


def step():
    x = 0
    for i in range(20000):
        x += i * i
    return x


t0 = time.monotonic()
marks, n = {}, 0
cli = int(open(out + ".cli").read())
while time.monotonic() - t0 < secs:
    step()
    n += 1
    if mode != "none":
        torchdeck.log({"loss": 1.0 / n}, samples=64)
    el = time.monotonic() - t0
    if rank == 0 and "a" not in marks and el >= secs * 0.2:
        marks["a"] = (time.time(), time.monotonic(), n, sched(sup), sched(cli))
    if rank == 0 and "b" not in marks and el >= secs * 0.9:
        marks["b"] = (time.time(), time.monotonic(), n, sched(sup), sched(cli))
if rank == 0:
    json.dump({"marks": marks, "sup": sup, "steps": n}, open(out, "w"))
"""


def real(seconds: float, mode: str, root: Path) -> dict:
    """One `torchdeck launch` run of PROBE; mode: 'coalesced' (log() as shipped), 'every' (an
    event per call), 'none' (no log())."""
    import json

    from torchdeck.engine import events as ev_mod

    script = root / "probe_ranks.py"
    script.write_text(PROBE)
    out = root / f"probe-{mode}-{time.monotonic_ns()}.json"
    env = dict(os.environ, TORCHDECK_RUNS=str(root / "runs"))
    if mode == "every":
        env["TORCHDECK_LOG_EVERY_S"] = "0"
    exe = Path(sys.executable).with_name("torchdeck")
    cmd = [str(exe), "launch", "--nproc-per-node", "2", str(script), str(seconds), str(out), mode]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    Path(str(out) + ".cli").write_text(str(p.pid))
    rc = p.wait(seconds + 120)
    r = json.loads(out.read_text())
    (ta, ma, na, sa, ca), (tb, mb, nb, sb, cb) = r["marks"]["a"], r["marks"]["b"]
    wall = mb - ma
    sup_pid = str(r["sup"])

    def used(x, y):
        return {tid: (y[tid] - x.get(tid, 0)) / 1e9 for tid in y}

    sup = used(sa, sb)
    runs = sorted((root / "runs").iterdir(), key=lambda d: d.stat().st_mtime)
    evs = ev_mod.read_all(runs[-1] / "events.jsonl")
    steps = sum(1 for e in evs if e.get("kind") == "step" and ta <= e.get("t", 0) <= tb)
    return {"mode": mode, "rc": rc, "wall_s": wall, "rank0_steps_per_s": (nb - na) / wall,
            "step_events": steps, "events_per_s": steps / wall,
            "supervisor_ms_per_s": sum(sup.values()) / wall * 1e3,
            "supervisor_main_ms_per_s": sup.get(sup_pid, 0.0) / wall * 1e3,
            "supervisor_threads": len(sup), "cli_ms_per_s": sum(used(ca, cb).values()) / wall * 1e3}


def main_real(seconds: float, reps: int) -> int:
    root = Path(tempfile.mkdtemp(prefix="torchdeck-bench-evcost-real-"))
    print(f"load before {', '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    res = {"none": [], "coalesced": [], "every": []}
    modes = list(res)
    for i in range(reps):
        for j in range(len(modes)):
            m = modes[(i + j) % len(modes)]
            r = real(seconds, m, root)
            res[m].append(r)
            print(f"{m:9s} rc {r['rc']}: {r['events_per_s']:6.1f} step events/s, supervisor {r['supervisor_ms_per_s']:.2f} "
                  f"ms/s of CPU (main thread {r['supervisor_main_ms_per_s']:.2f}, {r['supervisor_threads']} threads), "
                  f"CLI {r['cli_ms_per_s']:.2f} ms/s; rank 0 {r['rank0_steps_per_s']:.1f} steps/s", flush=True)
    med = lambda xs: sorted(xs)[len(xs) // 2]
    base = med([r["supervisor_ms_per_s"] for r in res["none"]])
    base_cli = med([r["cli_ms_per_s"] for r in res["none"]])
    for m in ("coalesced", "every"):
        sup = med([r["supervisor_ms_per_s"] for r in res[m]])
        cli = med([r["cli_ms_per_s"] for r in res[m]])
        eps = med([r["events_per_s"] for r in res[m]])
        print(f"{m}: {eps:.1f} events/s; supervisor {sup:.2f} ms/s ({(sup - base) / eps * 1e3:.0f} us per event over "
              f"the no-log run's {base:.2f} ms/s), CLI {cli:.2f} ms/s ({(cli - base_cli) / eps * 1e3:.0f} us per event); "
              f"supervisor + CLI {(sup + cli) / 10:.2f} % of one core ({(sup + cli - base - base_cli) / 10:.2f} % more "
              f"than without log())")
    print(f"load after {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


def _sched(tids) -> float:
    """CPU seconds of these threads of this process, by the scheduler (/proc/.../schedstat)."""
    total = 0
    for tid in tids:
        try:
            total += int(open(f"/proc/self/task/{tid}/schedstat").read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return total / 1e9


def _cpu_for(seconds: float, fn=None) -> float:
    c0 = time.process_time()
    if fn is None:
        time.sleep(seconds)
    else:
        fn()
    return time.process_time() - c0


def measure(events: int, rate: float, ranks: int, profile: bool = False) -> dict:
    from torchdeck.engine import events as ev_mod
    from torchdeck.engine.launch.ranks import EventReader
    from torchdeck.engine.metrics import MetricsSink
    from torchdeck.engine.supervisor import EventWriter

    tmp = Path(tempfile.mkdtemp(prefix="torchdeck-bench-evcost-"))
    import queue

    writer = EventWriter(tmp / "events.jsonl", queue.Queue())
    writer.metrics = MetricsSink(tmp / "metrics.csv")
    writer.start()
    writer.write(ev_mod.make("run_started", run="bench", strategy="script", world_size=ranks, nproc_per_node=ranks,
                             node_rank=0, num_nodes=1, run_kind="script", pid=os.getpid()))
    per_rank = events // ranks
    every = ranks / rate
    procs, fds = [], []
    for r in range(ranks):
        rd, wr = os.pipe()
        fds.append(rd)
        procs.append(subprocess.Popen([sys.executable, "-c", SENDER, str(wr), str(r), str(per_rank), str(every)],
                                      stdin=subprocess.PIPE, pass_fds=(wr,), text=True))
        os.close(wr)
    if hasattr(writer, "take"):  # as the supervisor wires them (a checkout before: through the queue)
        reader = EventReader(fds, writer.take, host="bench", flush=writer.flush_taken)
    else:
        reader = EventReader(fds, writer.q.put, host="bench")
    reader.start()
    time.sleep(0.5)  # the senders start their interpreters (their CPU is not ours; let it settle)
    wall = per_rank * every
    idle = _cpu_for(min(wall, 2.0)) * (wall / min(wall, 2.0))  # the threads' polling, no events

    prof = None
    if profile:
        import cProfile
        import threading

        prof = cProfile.Profile()
        threading.setprofile(None)
        # profile the two threads: restart is not possible, so wrap their per-event entry points
        for obj, name in ((reader, "_hand_on"), (writer, "_watch"), (writer.metrics, "add_line")):
            orig = getattr(obj, name)

            def wrapped(*a, _o=orig):
                return prof.runcall(_o, *a)
            setattr(obj, name, wrapped)

    total = per_rank * ranks
    threads = (reader.native_id, writer.native_id)
    s0 = _sched(threads)
    c0, t0 = time.process_time(), time.monotonic()
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    while writer.count < total + 0 and time.monotonic() - t0 < wall * 3 + 30:
        time.sleep(0.05)
    took = time.monotonic() - t0
    cpu = time.process_time() - c0
    sched = _sched(threads) - s0
    for p in procs:
        p.wait(30)
    reader.stop()
    writer.stop()
    writer.close()
    lines = sum(1 for _ in open(tmp / "events.jsonl"))
    rows = sum(1 for _ in open(tmp / "metrics.csv")) - 1
    busy = max(0.0, cpu - idle * took / wall)
    out = {"events": total, "written": writer.count, "lines": lines, "csv_rows": rows, "wall_s": took,
           "cpu_s": cpu, "idle_cpu_s": idle * took / wall, "us_per_event": busy / total * 1e6,
           "core_pct_at_rate": busy / took * 100, "sched_us_per_event": sched / total * 1e6,
           "sched_core_pct": sched / took * 100}
    if prof is not None:
        import io
        import pstats

        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(25)
        out["profile"] = s.getvalue()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.supervisor_event_cost")
    ap.add_argument("--events", type=int, default=4000)
    ap.add_argument("--rate", type=float, default=400.0, help="events/s, all ranks together")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--profile", action="store_true", help="cProfile of the per-event entry points")
    ap.add_argument("--real", action="store_true", help="account a real torchdeck launch run instead")
    ap.add_argument("--seconds", type=float, default=15.0, help="--real: each run's length")
    a = ap.parse_args(argv)
    if a.real:
        return main_real(a.seconds, a.reps)
    per = []
    for i in range(a.reps):
        r = measure(a.events, a.rate, a.ranks, profile=a.profile)
        per.append(r["sched_us_per_event"])
        print(f"rep {i + 1}: {r['events']} events at {a.rate:g}/s in {r['wall_s']:.2f} s, written {r['written']} "
              f"(file {r['lines']} lines, metrics.csv {r['csv_rows']} rows); reader + writer threads "
              f"{r['sched_us_per_event']:.0f} us/event by schedstat, {r['sched_core_pct']:.2f} % of a core "
              f"(process_time: {r['us_per_event']:.0f} us/event less idle polling)", flush=True)
        if r.get("profile"):
            print(r["profile"])
    per.sort()
    print(f"supervisor CPU per event: median {per[len(per) // 2]:.0f} us (min {per[0]:.0f}, max {per[-1]:.0f}), "
          f"load {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
