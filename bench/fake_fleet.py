"""A fake fleet (issue 31 item 4): N nodes x R ranks on loopback, speaking the real node protocol
into a real node 0, no torch.

- node 0: one process playing node 0's supervisor with its real parts: engine.nodes.link.Receiver
  on a loopback port, the supervisor's EventWriter writing RUN_DIR/events.jsonl (and its view),
  its own R ranks' step events put into the writer's queue as its rank reader would, and the real
  NodeSampler (NVML, psutil) once a second.
- nodes 1..N-1: one process each, an engine.nodes.link.Sender sending its R ranks' synthetic step
  events (bench.fake_run.step_event) at --rate per rank and one node_sample a second
  (bench.fake_run.node_sample: 8 fake GPUs), then a bye.
The run's secret goes to every process in its environment (TORCHDECK_NODE_SECRET), as on a
real job. Every sender says how many events it sent; node 0 says how many it wrote and how much
CPU it used while the fleet streamed: lost = sent - written (node 1.. events in the file).

    python -m bench --only fleet                        (32 nodes x 8 ranks x 10 events/s, 60 s)
    python -m bench.fake_fleet RUN_ROOT --nodes 32 --ranks 8 --rate 10 --seconds 60

For the views' benchmarks: start_fleet(run_root, ...) -> Fleet (its run directory is
Fleet.run.path, live while it streams); Fleet.wait() -> the figures.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import subprocess
import sys
import time
from pathlib import Path

from bench import common as C

NAME = "fleet"
CPU_TARGET = 25.0  # % of one core, node 0's supervisor
SECRET_ENV = "TORCHDECK_NODE_SECRET"
TICK_S = 0.1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Fleet:
    """A fake fleet streaming into a run directory: node 0's process and the other nodes'."""

    def __init__(self, run, node0: subprocess.Popen, nodes: list, params: dict):
        self.run, self.node0, self.nodes, self.params = run, node0, nodes, params

    def wait(self, timeout: float | None = None) -> dict:
        """Until every node is done and node 0 has written everything: the figures."""
        deadline = time.monotonic() + (timeout or self.params["seconds"] + 120)
        sent = dropped = 0
        for p in self.nodes:
            out, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            r = json.loads(out.strip().splitlines()[-1])
            sent, dropped = sent + r["sent"], dropped + r["dropped"]
        out, err = self.node0.communicate(timeout=max(1.0, deadline - time.monotonic()))
        try:
            n0 = json.loads(out.strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise RuntimeError(f"node 0 said nothing: {err[-2000:]}") from None
        from torchdeck.engine import events

        remote = own = samples = 0
        for ev in events.iter_events(self.run.events_path):
            node = ev.get("node_rank")
            if ev.get("kind") == "node_sample":
                samples += 1
                remote += node != 0
            elif isinstance(node, int) and node > 0 and ev.get("kind") == "step":
                remote += 1
            elif ev.get("kind") == "step":
                own += 1
        return dict(self.params, sent=sent, dropped_by_senders=dropped, written_remote=remote, lost=sent - remote,
                    written_own_steps=own, node_samples=samples, **n0)

    def stop(self) -> None:
        for p in [*self.nodes, self.node0]:
            if p.poll() is None:
                p.kill()
                p.wait(5)


def start_fleet(run_root: Path, nodes: int = 32, ranks: int = 8, rate: float = 10.0, seconds: float = 60.0,
                lead_s: float = 3.0) -> Fleet:
    """Start node 0 into a new run directory under run_root, then nodes 1..nodes-1; they stream
    from lead_s seconds on (the processes' start-up out of the figures) for `seconds`."""
    import secrets

    from bench.fake_run import create

    run = create(Path(run_root), ranks)
    port = _free_port()
    env = dict(os.environ, **{SECRET_ENV: secrets.token_hex(32)},
               PYTHONPATH=os.pathsep.join([str(C.ROOT), os.environ.get("PYTHONPATH", "")]))
    start_at = time.time() + lead_s + nodes * 0.05
    common = ["--nodes", str(nodes), "--ranks", str(ranks), "--rate", str(rate), "--seconds", str(seconds),
              "--port", str(port), "--start-at", repr(start_at)]
    me = [sys.executable, "-m", "bench.fake_fleet"]
    node0 = subprocess.Popen(me + ["--node0", str(run.path)] + common, env=env, cwd=C.ROOT, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while not (run.path / "node0.listening").exists():  # the port is bound: the nodes may connect
        if node0.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"node 0 did not start: {node0.stderr.read()[-2000:]}")
        time.sleep(0.05)
    procs = [subprocess.Popen(me + ["--node", str(k)] + common, env=env, cwd=C.ROOT, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
             for k in range(1, nodes)]
    return Fleet(run, node0, procs, {"nodes": nodes, "ranks": ranks, "rate": rate, "seconds": seconds})


# ----------------------------------------------------------------------------- the processes


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def node0_main(a) -> None:
    """Node 0's supervisor, its real parts: receiver, writer, own ranks' events, sampler."""
    import queue

    from bench.fake_run import started, step_event
    from torchdeck.engine import events
    from torchdeck.engine.nodes.link import Receiver
    from torchdeck.engine.nodes.sampler import NodeSampler
    from torchdeck.engine.supervisor import EventWriter

    run_dir = Path(a.node0)
    world = a.nodes * a.ranks
    writer = EventWriter(run_dir / "events.jsonl", queue.Queue())
    writer.start()
    for ev in started(run_dir.name, world, a.ranks, a.nodes, os.getpid(), socket.gethostname()):
        writer.q.put(events.dumps(ev))
    said = []
    receiver = Receiver("127.0.0.1", a.port, os.environ.pop(SECRET_ENV), writer.q.put,
                        log=lambda level, m: said.append(m), num_nodes=a.nodes)
    receiver.start()
    sampler = NodeSampler(writer.q.put, 0, socket.gethostname())
    sampler.start()
    (run_dir / "node0.listening").touch()
    time.sleep(max(0.0, a.start_at - time.time()))
    cpu0, t0 = _cpu_s(), time.monotonic()
    k = 0
    end = time.time() + a.seconds
    while time.time() < end:  # its own ranks, as its rank reader hands their lines on
        k += 1
        for r in range(a.ranks):
            writer.q.put(events.dumps(step_event(r, k, world, a.ranks, a.nodes)))
        time.sleep(max(0.0, 1.0 / a.rate - 0.0005))
    all_done = receiver.wait_done(30)
    cpu1, t1 = _cpu_s(), time.monotonic()
    sampler.stop()
    receiver.stop()
    writer.stop()
    writer.close()
    print(json.dumps({"node0_cpu_s": round(cpu1 - cpu0, 3), "node0_wall_s": round(t1 - t0, 3),
                      "node0_cpu_percent": round(100 * (cpu1 - cpu0) / (t1 - t0), 2), "received": receiver.received,
                      "batches": receiver.batches, "rejected_lines": receiver.rejected_lines,
                      "refused": receiver.refused, "nodes_heard": len(receiver.nodes), "all_said_bye": all_done,
                      "written": writer.count}), flush=True)


def node_main(a) -> None:
    """Node k's supervisor as node 0 sees it: a Sender with its ranks' steps and its samples."""
    from bench.fake_run import node_sample, step_event
    from torchdeck.engine import events
    from torchdeck.engine.nodes.link import Sender

    node, world = a.node, a.nodes * a.ranks
    sender = Sender("127.0.0.1", a.port, os.environ.pop(SECRET_ENV), node, f"gpu-node-{node:02d}")
    sender.start()
    time.sleep(max(0.0, a.start_at - time.time()))
    sent, k, ticks = 0, 0, 0
    t0 = time.time()
    end = t0 + a.seconds
    next_sample = t0 + 1.0
    per_tick = a.rate * TICK_S  # events per rank per tick
    owed = 0.0
    while time.time() < end:
        ticks += 1
        owed += per_tick
        while owed >= 1:
            owed -= 1
            k += 1
            for r in range(node * a.ranks, (node + 1) * a.ranks):
                ev = step_event(r, k, world, a.ranks, a.nodes)
                ev.pop("node_rank", None)  # as a rank sends it: the sender tags it
                ev.pop("host", None)
                sender.send(events.dumps(ev))
                sent += 1
        if time.time() >= next_sample:
            ev = node_sample(node, int(next_sample - t0), a.nodes)
            sender.send(events.dumps(ev))
            sent += 1
            next_sample += 1.0
        time.sleep(max(0.0, t0 + ticks * TICK_S - time.time()))
    sender.close(timeout=30)
    print(json.dumps({"node": node, "sent": sent, "dropped": sender.dropped}), flush=True)


def _args(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench.fake_fleet")
    ap.add_argument("root", nargs="?", help="where to create the run directory (the standalone use)")
    ap.add_argument("--node0", help=argparse.SUPPRESS)
    ap.add_argument("--node", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--nodes", type=int, default=32)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--rate", type=float, default=10.0, help="step events per second per rank")
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--start-at", type=float, default=0.0, help=argparse.SUPPRESS)
    return ap.parse_args(argv)


# ----------------------------------------------------------------------------- python -m bench


def measure(nodes: int, ranks: int, rate: float, seconds: float) -> dict:
    root = C.tmpdir(NAME)
    fleet = start_fleet(root, nodes, ranks, rate, seconds)
    try:
        res = fleet.wait()
    finally:
        fleet.stop()
    res["run_dir"] = str(fleet.run.path)
    res["load_avg"] = os.getloadavg()
    return res


def run(quick: bool = False, reps: int = 1) -> dict:
    shape = (4, 8, 10.0, 5.0) if quick else (32, 8, 10.0, 60.0)
    res = measure(*shape)
    nodes, ranks, rate, seconds = shape
    rows = [[f"{nodes} x {ranks}", rate, seconds, res["sent"], res["written_remote"], res["lost"],
             res["node_samples"], res["node0_cpu_percent"]]]
    text = C.table(f"fleet: {nodes} fake nodes x {ranks} ranks x {rate:g} step events/s into a real node 0 "
                   f"(Receiver + EventWriter + its own ranks + NodeSampler), {seconds:g} s",
                   ["nodes x ranks", "events/s/rank", "s", "sent by nodes 1..", "written", "lost",
                    "node_samples", "node 0 CPU % of a core"], rows)
    text += (f"\nnode 0 received {res['received']} lines in {res['batches']} batches, wrote {res['written']} events "
             f"in all; all nodes said bye: {res['all_said_bye']}; load {', '.join(f'{x:.1f}' for x in res['load_avg'])}")
    # the views on a second stream of the same shape, so that they do not weigh on node 0's figures
    from bench import fleet_views

    views = fleet_views.measure(*shape)
    views_text, views_targets = fleet_views.report(views)
    return {"name": NAME, "text": text + views_text, "result": res, "views": views,
            "targets": [{"what": "events lost", "value": res["lost"], "target": "0",
                         "verdict": C.verdict(res["lost"], 0, higher_is_better=False)},
                        {"what": "node 0 supervisor CPU, % of a core", "value": res["node0_cpu_percent"],
                         "target": f"< {CPU_TARGET:g}",
                         "verdict": C.verdict(res["node0_cpu_percent"], CPU_TARGET, higher_is_better=False)}]
            + views_targets}


def main(argv=None) -> None:
    a = _args(argv)
    if a.node0:
        node0_main(a)
    elif a.node:
        node_main(a)
    else:
        if not a.root:
            sys.exit("usage: python -m bench.fake_fleet RUN_ROOT [--nodes N --ranks R --rate X --seconds S]")
        fleet = start_fleet(Path(a.root), a.nodes, a.ranks, a.rate, a.seconds)
        print(f"streaming into {fleet.run.path}", flush=True)
        try:
            print(json.dumps(fleet.wait(), indent=1))
        finally:
            fleet.stop()


if __name__ == "__main__":
    main()
