"""A run directory fed by simulated ranks, for timing the app without training anything:
N ranks x R step events per second appended to events.jsonl (flushed every tick, so the time
in each event is the time it reached the file). Step numbers are 6-digit and unique across
ranks (100000 + 8k + rank) so a watcher of the screen can tell which event it is seeing.

    python -m bench.fake_run RUN_DIR --ranks 8 --rate 50 --seconds 25
"""
from __future__ import annotations

import argparse
import os
import socket
import time
from pathlib import Path

from torchdeck.engine import events
from torchdeck.engine.runs.layout import RunDir

BASE = 100_000
TOTAL = 9_999_999


def create(root: Path, ranks: int) -> RunDir:
    from torchdeck.engine.config import from_dict

    cfg = from_dict({"name": "bench-fake", "strategy": "ddp", "accelerator": "cpu", "devices": ranks,
                     "backend": "gloo"})
    return RunDir.create(cfg, root)


def feed(rd: RunDir, ranks: int, rate: float, seconds: float, tick: float = 0.02) -> int:
    rd.pid_path.write_text(str(os.getpid()))
    host = socket.gethostname()
    n = 0
    with open(rd.events_path, "a") as fh:
        def put(ev):
            fh.write(events.dumps(ev) + "\n")

        put(events.make("run_started", run=rd.name, strategy="ddp", world_size=ranks, nproc_per_node=ranks,
                        node_rank=0, num_nodes=1, global_batch=64 * ranks, devices=["cpu"] * ranks,
                        master_addr="127.0.0.1", master_port=29500, pid=os.getpid(), host=host,
                        total_steps=TOTAL))
        for r in range(ranks):
            put(events.make("rank_ready", rank=r, local_rank=r, device="cpu", pid=os.getpid(), host=host, threads=1))
        fh.flush()
        t0 = time.monotonic()
        k = 0
        while True:
            el = time.monotonic() - t0
            if el >= seconds:
                break
            due = int(el * rate) + 1
            while k < due:
                for r in range(ranks):
                    put(events.make("step", rank=r, epoch=0, step=BASE + 8 * k + r, total_steps=TOTAL,
                                    loss=2.0 / (1 + k * 0.01), accuracy=0.5, samples_per_s=640.0,
                                    data_wait_s=0.001, compute_s=0.019, lr=0.05))
                    n += 1
                k += 1
            fh.flush()
            time.sleep(tick)
    rd.write_final("finished", None, [0] * ranks, seconds)
    return n


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("run_dir")
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--rate", type=float, default=50.0)
    ap.add_argument("--seconds", type=float, default=25.0)
    a = ap.parse_args(argv)
    print(feed(RunDir(Path(a.run_dir)), a.ranks, a.rate, a.seconds), flush=True)


if __name__ == "__main__":
    main()
