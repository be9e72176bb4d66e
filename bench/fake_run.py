"""A run directory fed by simulated ranks, for timing the app without training anything:
N ranks x R step events per second appended to events.jsonl (flushed every tick, so the time
in each event is the time it reached the file). Step numbers are 6-digit and unique across
ranks (100000 + max(8, world) * k + rank) so a watcher of the screen can tell which event it
is seeing.

With --nodes N (issue 31) the run is N nodes of --ranks ranks each, as node 0's events.jsonl
holds it: the other nodes' rank events tagged with node_rank and host, and one node_sample a
second per node (8 synthetic GPUs and the host). The fleet is not even, so the views have
something to point at: node STRAGGLER_NODE trains at 80 % of the pace with its GPUs at ~60 %,
rank SLOW_RANK at 55 %, two ranks wait for data, one GPU runs hot. Pure files, no torch.

    python -m bench.fake_run RUN_DIR --ranks 8 --rate 50 --seconds 25
    python -m bench.fake_run RUN_DIR --nodes 32 --ranks 8 --rate 10 --seconds 60
    python -m bench.fake_run RUN_DIR --ranks 8 --rate 50 --seconds 1800 --speed 6   # 30 min in 5
"""
from __future__ import annotations

import argparse
import os
import socket
import time
from pathlib import Path

from torchdeck.engine import events
from torchdeck.engine.rundir.layout import RunDir

BASE = 100_000
TOTAL = 9_999_999
STRAGGLER_NODE = 17  # its ranks at 80 % of the pace, its GPUs at ~60 % (a node with a slow link)
SLOW_RANK = 203  # 55 % of the pace: the one straggler
WAITING = {44: 0.31, 45: 0.22, 130: 0.12}  # rank -> share of its step time waiting for data
HOT = (5, 3)  # node, GPU index: 84 °C


def create(root: Path, ranks: int) -> RunDir:
    from torchdeck.engine.config import from_dict

    cfg = from_dict({"name": "bench-fake", "strategy": "ddp", "accelerator": "cpu", "devices": ranks,
                     "backend": "gloo"})
    return RunDir.create(cfg, root)


def host_of(node: int) -> str:
    return f"gpu-node-{node:02d}"


def rank_pace(rank: int, per_node: int, nodes: int) -> float:
    """A rank's share of the full pace (1.0: 640 samples/s)."""
    if nodes > 1 and rank == SLOW_RANK % (nodes * per_node):
        return 0.55
    if nodes > 1 and rank // per_node == STRAGGLER_NODE % nodes:
        return 0.8
    return 1.0 - 0.002 * (rank % 7) if nodes > 1 else 1.0


def step_event(rank: int, k: int, world: int, per_node: int, nodes: int, t: float | None = None,
               step: int | None = None, total: int = TOTAL) -> dict:
    """Rank `rank`'s k-th step event (its step number unique across ranks unless given)."""
    wait = WAITING.get(rank, 0.01 + 0.005 * (rank % 5)) if nodes > 1 else 0.05
    ev = events.make("step", rank=rank, epoch=0, step=BASE + max(8, world) * k + rank if step is None else step, total_steps=total,
                     loss=2.0 / (1 + k * 0.01) + (0.001 * (rank % 13) if nodes > 1 else 0.0), accuracy=0.5,
                     samples_per_s=round(640.0 * rank_pace(rank, per_node, nodes), 1),
                     data_wait_s=round(0.02 * wait / (1 - wait), 5), compute_s=0.019, lr=0.05)
    if nodes > 1:  # of compute_s, the all-reduce: the others wait for the slowest rank there
        ev["comm_s"] = round(0.019 * (0.02 if rank == SLOW_RANK % world else 0.25 + 0.01 * (rank % 3)), 5)
    node = rank // per_node
    if node:  # another node's event, as node 0's supervisor writes it
        ev.update(node_rank=node, host=host_of(node))
    if t is not None:
        ev["t"] = t
    return ev


def gpu_sample(node: int, index: int, k: int, nodes: int) -> dict:
    """GPU `index` of `node` at its k-th sample: busy and even, but for the straggler node, GPU 0
    of each node (a little more memory) and the hot one."""
    slow = nodes > 1 and node == STRAGGLER_NODE % nodes
    util = (58.0 if slow else 94.0) + ((node * 8 + index + k) % 5) - 2
    used = 61_000.0 + 500 * ((node + index) % 7) + (4_000 if index == 0 else 0)
    temp = 84.0 if (node, index) == HOT else 62.0 + (node + 2 * index) % 9
    return {"index": index, "name": "NVIDIA H100 80GB HBM3", "util": util, "mem_used_mb": used,
            "mem_total_mb": 81_559.0, "temp_c": temp, "power_w": 300.0 + 4 * util, "power_limit_w": 700.0,
            "uuid": f"GPU-fake-{node:02d}-{index}", "mem_util": util * 0.6, "fan_pct": None, "pids": []}


def host_sample(node: int, k: int) -> dict:
    cpu = 22.0 + (node * 3 + k) % 11
    return {"cpu_percent": cpu, "per_cpu": [cpu] * 96, "ram_used_mb": 310_000.0 + 1_000 * (node % 5),
            "ram_total_mb": 2_063_000.0, "load1": 12.0 + node % 4}


def node_sample(node: int, k: int, nodes: int, gpus: int = 8, t: float | None = None) -> dict:
    """A node's once-a-second sample, as node 0 writes it into events.jsonl (engine/events.py)."""
    ev = events.make("node_sample", node_rank=node, host=host_of(node),
                     gpus=[gpu_sample(node, i, k, nodes) for i in range(gpus)], host_stats=host_sample(node, k))
    if t is not None:
        ev["t"] = t
    return ev


def started(name: str, world: int, per_node: int, nodes: int, pid: int, host: str, t: float | None = None,
            total: int = TOTAL) -> list[dict]:
    devices = ["cpu"] * per_node if nodes == 1 else [f"cuda:{i}" for i in range(per_node)]
    out = [events.make("run_started", run=name, strategy="ddp", world_size=world, nproc_per_node=per_node,
                       node_rank=0, num_nodes=nodes, global_batch=64 * world, devices=devices,
                       master_addr="127.0.0.1", master_port=29500, pid=pid, host=host, total_steps=total)]
    for r in range(world):
        node = r // per_node
        ev = events.make("rank_ready", rank=r, local_rank=r % per_node, device=devices[r % per_node],
                         pid=pid, host=host if node == 0 else host_of(node), threads=1)
        if node:
            ev["node_rank"] = node
        out.append(ev)
    if t is not None:
        for ev in out:
            ev["t"] = t
    return out


def fleet_events(name: str, nodes: int, per_node: int, t0: float, seconds: float, rate: float = 1.0,
                 node0_samples: bool = True, pid: int = 4100, steps_per_tick: int = 10, total: int = 3000) -> list[dict]:
    """A whole recorded fleet run with fixed times (snapshot tests): start, `rate` step events a
    second per rank (every rank at the same step, as a data-parallel run is), and a node_sample a
    second per node (node 0's too unless node0_samples is False: the Monitor on node 0 samples its
    own GPUs)."""
    world = nodes * per_node
    out = started(name, world, per_node, nodes, pid, host_of(0), t0, total)
    ticks = int(seconds * rate)
    for k in range(ticks):
        t = t0 + 2.0 + k / rate
        for r in range(world):
            out.append(step_event(r, k, world, per_node, nodes, t + 0.0001 * r, (k + 1) * steps_per_tick, total))
    for s in range(int(seconds)):
        for n in range(0 if node0_samples else 1, nodes):
            out.append(node_sample(n, s, nodes, t=t0 + 2.0 + s + 0.5))
    out.sort(key=lambda e: e["t"])
    return out


def feed(rd: RunDir, ranks: int, rate: float, seconds: float, tick: float = 0.02, nodes: int = 1,
         speed: float = 1.0) -> int:
    """`ranks` per node on `nodes` nodes, `rate` step events a second each, for `seconds`; the step
    events written (node samples not counted). `speed` > 1 compresses time: `seconds` of the run's
    own time (its events' times, from now on) are written in seconds / speed of wall time."""
    rd.pid_path.write_text(str(os.getpid()))
    host = socket.gethostname()
    world = ranks * nodes
    n = 0
    fake0 = time.time()
    when = (lambda s: None) if speed == 1 else (lambda s: fake0 + s)  # at speed 1: stamped as written
    with open(rd.events_path, "a") as fh:
        def put(ev):
            fh.write(events.dumps(ev) + "\n")

        for ev in started(rd.name, world, ranks, nodes, os.getpid(), host, when(0.0)):
            put(ev)
        fh.flush()
        t0 = time.monotonic()
        k = samples = 0
        while True:
            el = (time.monotonic() - t0) * speed
            if el >= seconds:
                break
            due = int(el * rate) + 1
            while k < due:
                for r in range(world):
                    put(step_event(r, k, world, ranks, nodes, when(k / rate)))
                    n += 1
                k += 1
            if nodes > 1:
                while samples <= int(el):
                    for node in range(nodes):
                        put(node_sample(node, samples, nodes, t=when(float(samples))))
                    samples += 1
            fh.flush()
            time.sleep(tick)
    rd.write_final("finished", None, [0] * ranks, seconds)
    return n


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("run_dir")
    ap.add_argument("--ranks", type=int, default=8, help="ranks per node")
    ap.add_argument("--nodes", type=int, default=1)
    ap.add_argument("--rate", type=float, default=50.0)
    ap.add_argument("--seconds", type=float, default=25.0, help="of the run's own time")
    ap.add_argument("--speed", type=float, default=1.0, help="run seconds written per wall second (> 1: compressed)")
    a = ap.parse_args(argv)
    print(feed(RunDir(Path(a.run_dir)), a.ranks, a.rate, a.seconds, nodes=a.nodes, speed=a.speed), flush=True)


if __name__ == "__main__":
    main()
