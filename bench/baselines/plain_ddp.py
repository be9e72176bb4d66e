"""A hand-written DDP script (mp.spawn, gloo), as a user would write it without torchdeck.

`--threads per-rank` sets torch threads to cores / ranks (what torchrun's OMP_NUM_THREADS does);
`--threads all` is the naive script that lets every rank use every core; `--batched` fetches whole
batches from the in-memory set (bench/baselines/batch_fetch.py). Rank 0 records the wall
time at the steps where torchdeck emits step events.

    python -m bench.baselines.plain_ddp --ranks 2 --steps 200 --batch-size 64 --threads per-rank
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import tempfile
import time


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(rank, a, port, out_path):
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler

    from torchdeck.engine.data import DataInfo, synthetic
    from torchdeck.engine.models import cnn

    if a.threads == "per-rank":
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // a.ranks))
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=a.ranks)
    torch.manual_seed(0)
    train, _val = synthetic(a.train_size, a.val_size, 10, 32)
    model = DDP(cnn(DataInfo(3, 10, 32, "synthetic")))
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9)
    sampler = DistributedSampler(train, shuffle=True, seed=0, drop_last=True)
    if a.batched:
        from bench.baselines.batch_fetch import loader as batch_loader

        loader = batch_loader(train, a.batch_size, sampler=sampler)
    else:
        loader = DataLoader(train, batch_size=a.batch_size, sampler=sampler, drop_last=True)
    t_ready = time.time()
    marks, step, epoch = [], 0, 0
    model.train()
    while step < a.steps:
        sampler.set_epoch(epoch)
        for inputs, labels in loader:
            optimizer.zero_grad()
            loss = criterion(model(inputs), labels)
            loss.backward()
            optimizer.step()
            step += 1
            if step % a.mark_every == 0 or step == a.steps:
                marks.append((step, time.time()))
                if rank == 0:
                    print(f"step {step} loss {loss.item():.4f}", flush=True)
            if step == a.steps:
                break
        epoch += 1
    if rank == 0:
        with open(out_path, "w") as fh:
            json.dump({"t_ready": t_ready, "marks": marks, "threads": torch.get_num_threads()}, fh)
    dist.destroy_process_group()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--train-size", type=int, default=8192)
    ap.add_argument("--val-size", type=int, default=2048)
    ap.add_argument("--mark-every", type=int, default=10)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--threads", choices=("per-rank", "all"), default="per-rank")
    ap.add_argument("--batched", action="store_true", help="fetch whole batches (bench/baselines/batch_fetch.py)")
    a = ap.parse_args(argv)

    from bench.baselines import start_ranks  # mp.spawn (a --quick run: forked)

    fd, out_path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        start_ranks(worker, (a, _free_port(), out_path), a.ranks)
        with open(out_path) as fh:
            print(json.dumps(json.load(fh)))
    finally:
        os.unlink(out_path)


if __name__ == "__main__":
    main()
