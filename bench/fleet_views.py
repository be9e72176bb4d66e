"""The views of a fleet (issue 31 item 3), part of `python -m bench --only fleet`: while
bench.fake_fleet streams N fake nodes x R ranks into a real node 0, two watchers look at its run
directory, each in a real pseudo-terminal:

- the Monitor (the app, bench.app_monitor, 140x45): event-to-screen latency, from each step
  event's own time (taken where the rank made it, before the node link carried it to node 0) until
  the screen first shows that rank at that step or a later one; and, as the Monitor's own share,
  from the moment the line reached events.jsonl (a tail here, polling every 10 ms). The pty's
  output is kept as a screen (bench.ptyterm.Screen), read at the end of each frame: only events of
  ranks on screen when they came are timed (at 256 ranks: the ones worth a look, the median, the
  slowest, the most data wait); an event is reflected when a frame shows its rank at that step or
  later (the screen shows the newest); one whose rank left the screen first is counted apart.
  Target p95 <= 250 ms. Its CPU over the window.
- `torchdeck attach` (headless, on a terminal so that it redraws in place, 80x24): redraws per
  second, counted by the cursor-up-and-clear sequence each redraw starts with, on average and in
  the busiest second. Target <= 4/s.

Step numbers are bench.fake_run's (BASE + max(8, world) * k + rank: unique, the rank in them);
the Monitor shows them as `105067/9999999`.
"""
from __future__ import annotations

import bisect
import json
import os
import re
import sys
import threading
import time
from pathlib import Path

from bench import common as C
from bench.ptyterm import SYNC_QUERY, SYNC_YES, PtyProcess, Screen

SHOWN = re.compile(r"(?<![\d,.])(\d{6})/9999999")  # a rank's step in the Monitor's rows
REDRAW = re.compile(rb"\x1b\[\d+F\x1b\[J")  # the headless block moving up over itself
LINE_STEP = re.compile(rb'"kind":"step".*?"step":(\d+)')
WARM_S, TAIL_S = 4.0, 1.0  # left out of the window: start-up, and the end of the stream


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(C.ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


class Watcher(threading.Thread):
    """A program in a pty, its output read as it comes into a model of the screen (what a terminal
    would show, frame by frame: the program's synchronized updates, offered as a modern terminal
    offers them), and what each frame showed: {rank: step} for the Monitor's step cells."""

    def __init__(self, argv: list[str], cols: int, rows: int, world: int = 8):
        super().__init__(daemon=True)
        self.pty = PtyProcess(argv, env=_env(), cols=cols, rows=rows, cwd=str(C.ROOT))
        self.screen = Screen(cols, rows)
        self.stride = max(8, world)
        self.frames: list[tuple[float, dict[int, int]]] = []  # (time, {rank: step shown}), when it changed
        self.redraws: list[float] = []
        self.bytes = 0
        self._ending = threading.Event()

    def shown(self) -> dict[int, int]:
        from bench.fake_run import BASE

        out: dict[int, int] = {}
        for line in self.screen.text():
            for m in SHOWN.finditer(line):
                step = int(m.group(1))
                r = (step - BASE) % self.stride
                out[r] = max(out.get(r, 0), step)
        return out

    def run(self) -> None:
        while not self._ending.is_set():
            got = self.pty.read(0.05)
            if got is None:
                if self.pty.proc.poll() is not None:
                    return
                continue
            t, data = got
            self.bytes += len(data)
            if SYNC_QUERY in data:
                os.write(self.pty.master, SYNC_YES)
            self.redraws += [t] * len(REDRAW.findall(data))
            if self.screen.feed(data):
                now = self.shown()
                if not self.frames or self.frames[-1][1] != now:
                    self.frames.append((t, now))

    def cpu_s(self) -> float | None:
        import psutil

        try:
            c = psutil.Process(self.pty.proc.pid).cpu_times()
            return c.user + c.system
        except psutil.Error:
            return None

    def finish(self) -> None:
        """Stop reading, and end the program whatever happens (an app left running would weigh on
        every later measurement)."""
        self._ending.set()
        try:
            self.join(5)
        finally:
            self.pty.close()


class Tail(threading.Thread):
    """When each step line reached events.jsonl (step -> time), polling every 10 ms."""

    def __init__(self, path: Path):
        super().__init__(daemon=True)
        self.path, self.arrived = path, {}
        self._ending = threading.Event()

    def run(self) -> None:
        pos, rest = 0, b""
        while not self._ending.wait(0.01):
            try:
                with open(self.path, "rb") as fh:
                    fh.seek(pos)
                    data = fh.read()
            except OSError:
                continue
            if not data:
                continue
            t = time.time()
            pos += len(data)
            lines = (rest + data).split(b"\n")
            rest = lines.pop()
            for line in lines:
                m = LINE_STEP.search(line)
                if m:
                    self.arrived.setdefault(int(m.group(1)), t)

    def finish(self) -> None:
        self._ending.set()
        self.join(5)


def latencies(written: dict[int, float], frames: list[tuple[float, dict[int, int]]], world: int,
              lo: float, hi: float) -> tuple[list, int, int]:
    """Seconds from each step event (written: step -> time, within [lo, hi]) until a frame first
    showed its rank at that step or later, for the events of ranks on screen when they came (the
    frame before shows the rank). The ranks worth a look change as their paces do: an event whose
    rank left the screen before it was shown is not timed, only counted (left); one whose rank
    stayed on screen to the end without it is counted as never reflected (missing)."""
    from bench.fake_run import BASE

    stride = max(8, world)
    times = [t for t, _ in frames]
    lat, missing, left = [], 0, 0
    for step, t in written.items():
        if not lo <= t <= hi:
            continue
        r = (step - BASE) % stride
        j = bisect.bisect_right(times, t) - 1
        if j < 0 or r not in frames[j][1]:
            continue  # not on screen when it came
        for ft, shown in frames[j + 1:]:
            if r not in shown:
                left += 1
                break
            if shown[r] >= step:
                lat.append(ft - t)
                break
        else:
            missing += 1
    lat.sort()
    return lat, missing, left


def _q(xs: list, q: float):
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else None


def measure(nodes: int, ranks: int, rate: float, seconds: float) -> dict:
    from bench.fake_fleet import start_fleet
    from torchdeck.engine import events

    root = C.tmpdir("fleet_views")
    fleet = start_fleet(root, nodes, ranks, rate, seconds)
    run = fleet.run
    tail = Tail(run.events_path)
    tail.start()
    torchdeck = str(Path(sys.executable).parent / "torchdeck")
    world = nodes * ranks
    mon = Watcher([sys.executable, "-m", "bench.app_monitor", str(run.path)], 140, 45, world)
    cli = [torchdeck] if os.path.exists(torchdeck) else [sys.executable, "-m", "torchdeck.cli"]
    att = Watcher(cli + ["attach", str(run.path)], 80, 24)
    mon.start()
    att.start()
    cpu = {}
    warm, tail_s = min(WARM_S, seconds / 3), min(TAIL_S, seconds / 10)  # --quick streams for 5 s
    try:
        first = None
        deadline = time.monotonic() + seconds + 60
        while time.monotonic() < deadline:  # the window opens WARM_S after the first step
            if first is None:
                for ev in events.iter_events(run.events_path):
                    if ev.get("kind") == "step":
                        first = time.time()
                        break
            if first is not None and time.time() >= first + warm:
                break
            time.sleep(0.2)
        cpu0, t0 = mon.cpu_s(), time.time()
        res = fleet.wait()
        cpu1, t1 = mon.cpu_s(), time.time()
        if cpu0 is not None and cpu1 is not None and t1 > t0:
            cpu = {"monitor_cpu_percent": round(100 * (cpu1 - cpu0) / (t1 - t0), 1)}
        time.sleep(1.0)  # the last frames
    finally:
        for done in (fleet.stop, mon.finish, att.finish, tail.finish):
            try:
                done()
            except Exception:  # noqa: BLE001 - the others must still end
                pass
    written = {e["step"]: e["t"] for e in events.iter_events(run.events_path)
               if e.get("kind") == "step" and isinstance(e.get("step"), int) and isinstance(e.get("t"), (int, float))}
    ts = sorted(written.values())
    lo, hi = (ts[0] + warm, ts[-1] - tail_s) if ts else (0.0, 0.0)
    lat, missing, left = latencies(written, mon.frames, world, lo, hi)
    arrived = {s: t for s, t in tail.arrived.items() if s in written}
    lat_file, _, _ = latencies({s: t for s, t in arrived.items() if lo <= written[s] <= hi}, mon.frames, world, lo, hi)
    shown_ranks = sorted({r for _, shown in mon.frames for r in shown})
    draws = [t for t in att.redraws if lo <= t <= hi]
    span = max(1e-9, hi - lo)
    busiest = max((sum(1 for x in draws if a <= x < a + 1.0) for a in draws), default=0)
    return {"nodes": nodes, "ranks": ranks, "rate": rate, "seconds": seconds, "window_s": round(span, 1),
            "lost": res.get("lost"), "events": len(written), "monitor_events_timed": len(lat),
            "monitor_never_reflected": missing, "monitor_left_screen": left, "monitor_frames": len(mon.frames), "monitor_ranks_shown": shown_ranks,
            "monitor_p50_s": _q(lat, 0.5), "monitor_p95_s": _q(lat, 0.95), "monitor_max_s": lat[-1] if lat else None,
            "monitor_file_p50_s": _q(lat_file, 0.5), "monitor_file_p95_s": _q(lat_file, 0.95), **cpu,
            "attach_redraws": len(draws), "attach_redraws_per_s": round(len(draws) / span, 2),
            "attach_busiest_second": busiest, "load_avg": os.getloadavg(), "run_dir": str(run.path)}


def _ms(v):
    return None if v is None else round(v * 1000)


def report(res: dict) -> tuple[str, list[dict]]:
    text = C.table(f"fleet views: the Monitor (140x45) and `torchdeck attach` (80x24 terminal) on {res['nodes']} "
                   f"fake nodes x {res['ranks']} ranks x {res['rate']:g} step events/s, {res['window_s']:g} s window",
                   ["events timed", "ranks shown", "event-to-screen p50 ms", "p95 ms", "max ms",
                    "file-to-screen p50 ms", "p95 ms", "Monitor CPU %", "attach redraws/s", "busiest second"],
                   [[res["monitor_events_timed"], len(res["monitor_ranks_shown"]), _ms(res["monitor_p50_s"]),
                     _ms(res["monitor_p95_s"]), _ms(res["monitor_max_s"]), _ms(res["monitor_file_p50_s"]),
                     _ms(res["monitor_file_p95_s"]), res.get("monitor_cpu_percent"), res["attach_redraws_per_s"],
                     res["attach_busiest_second"]]])
    text += (f"\nranks the Monitor showed: {res['monitor_ranks_shown']}; never reflected: "
             f"{res['monitor_never_reflected']}; events whose rank left the screen first: "
             f"{res.get('monitor_left_screen')}; frames: {res.get('monitor_frames')}; load {', '.join(f'{x:.1f}' for x in res['load_avg'])}")
    targets = [{"what": f"Monitor event-to-screen p95 s ({res['nodes']}x{res['ranks']} fleet)", "value": res["monitor_p95_s"], "target": "<= 0.25",
                "verdict": C.verdict(res["monitor_p95_s"], 0.25, False)},
               {"what": "headless attach redraws per second (busiest second)", "value": res["attach_busiest_second"],
                "target": "<= 4", "verdict": C.verdict(res["attach_busiest_second"], 4, False)}]
    return text, targets


def main(argv=None) -> None:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m bench.fleet_views")
    ap.add_argument("--nodes", type=int, default=32)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--rate", type=float, default=10.0)
    ap.add_argument("--seconds", type=float, default=60.0)
    a = ap.parse_args(argv)
    res = measure(a.nodes, a.ranks, a.rate, a.seconds)
    print(report(res)[0])
    print(json.dumps(res, default=str))


if __name__ == "__main__":
    main()
