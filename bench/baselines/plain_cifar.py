"""A hand-written mp.spawn DDP script (gloo) on CIFAR-10's python files, keeping the set as tensors
the way a careful user does: every rank unpickles the five train batches once, converts them to a
normalized float tensor and trains from a TensorDataset (`--batched` fetches whole batches;
`--pin` binds each rank to cores of its own, as torchdeck's train.cpu_affinity auto does).
Rank 0 prints a JSON line: t_ready (group formed, before the data), t_data (set in memory), marks.

    python -m bench.baselines.plain_cifar ROOT --steps 200 --batch-size 64
"""
from __future__ import annotations

import argparse
import json
import os
import pickle
import socket
import tempfile
import time

MEAN, STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def load_train(root: str):
    import numpy as np
    import torch

    data, labels = [], []
    for i in range(1, 6):
        with open(os.path.join(root, "cifar-10-batches-py", f"data_batch_{i}"), "rb") as fh:
            entry = pickle.load(fh, encoding="latin1")
        data.append(entry["data"])
        labels += entry["labels"]
    x = torch.from_numpy(np.concatenate(data).reshape(-1, 3, 32, 32)).float().div_(255)
    x = x.sub_(torch.tensor(MEAN).view(1, 3, 1, 1)).div_(torch.tensor(STD).view(1, 3, 1, 1))
    return torch.utils.data.TensorDataset(x, torch.tensor(labels))


def worker(rank, a, port, out_path):
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler

    from torchdeck.engine.data import DataInfo
    from torchdeck.engine.models import cnn

    threads = max(1, (os.cpu_count() or 1) // a.ranks)
    if a.pin:  # what torchdeck's train.cpu_affinity auto does: rank r on its own cores
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, cpus[rank * threads:(rank + 1) * threads])
    torch.set_num_threads(threads)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=a.ranks)
    t_ready = time.time()
    train = load_train(a.root)
    t_data = time.time()
    torch.manual_seed(0)
    model = DDP(cnn(DataInfo(3, 10, 32, "cifar10")))
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9)
    sampler = DistributedSampler(train, shuffle=True, seed=0, drop_last=True)
    if a.batched:
        from bench.baselines.batch_fetch import loader as batch_loader

        loader = batch_loader(train, a.batch_size, sampler=sampler)
    else:
        loader = DataLoader(train, batch_size=a.batch_size, sampler=sampler, drop_last=True)
    marks, step, epoch = [], 0, 0
    while step < a.steps:
        sampler.set_epoch(epoch)
        for inputs, labels in loader:
            optimizer.zero_grad()
            criterion(model(inputs), labels).backward()
            optimizer.step()
            step += 1
            if step % a.mark_every == 0 or step == a.steps:
                marks.append((step, time.time()))
            if step == a.steps:
                break
        epoch += 1
    if rank == 0:
        with open(out_path, "w") as fh:
            json.dump({"t_ready": t_ready, "t_data": t_data, "marks": marks}, fh)
    dist.destroy_process_group()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--mark-every", type=int, default=10)
    ap.add_argument("--batched", action="store_true")
    ap.add_argument("--pin", action="store_true", help="bind rank r to its own cores (before its group forms)")
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
