"""Hand-written mp.spawn DDP scripts (gloo) training the tutorial CNN on a folder of images.

`--mode decode-once`: what a careful user writes for a set that fits in memory: every rank decodes
the folder once into a normalized float tensor, then trains from a TensorDataset (`--batched`
fetches whole batches, bench/baselines/batch_fetch.py).
`--mode tutorial`: the PyTorch tutorial way: ImageFolder with ToTensor/Normalize, decoded again
every epoch by one DataLoader worker per rank. Started by mp.spawn, a rank starts its workers by
spawn too (each imports torch); `--worker-start fork` is what a user who knows it writes.

Both evaluate on val/ after every epoch (sharded over the ranks, summed). Rank 0 prints a JSON
line: t_ready (group formed, before any decoding), t_end (after the last evaluation), marks,
val_acc.

    python -m bench.baselines.plain_imagefolder ROOT --mode decode-once --epochs 10 --batch-size 32
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import tempfile
import time

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def decode_all(folder: str):
    import torch
    import torchvision.datasets as tvd
    import torchvision.transforms as T

    tf = T.Compose([T.ToTensor(), T.Normalize(MEAN, STD)])
    ds = tvd.ImageFolder(folder)
    xs = torch.stack([tf(ds.loader(path)) for path, _ in ds.samples])
    return torch.utils.data.TensorDataset(xs, torch.tensor(ds.targets))


def worker(rank, a, port, out_path):
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    import torchvision.datasets as tvd
    import torchvision.transforms as T
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler, Subset

    from torchdeck.engine.data import DataInfo
    from torchdeck.engine.models import cnn

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // a.ranks))
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=a.ranks)
    t_ready = time.time()
    train_dir, val_dir = os.path.join(a.root, "train"), os.path.join(a.root, "val")
    workers = {}
    if a.mode == "decode-once":
        train, val = decode_all(train_dir), decode_all(val_dir)
    else:
        tf = T.Compose([T.ToTensor(), T.Normalize(MEAN, STD)])
        train, val = tvd.ImageFolder(train_dir, transform=tf), tvd.ImageFolder(val_dir, transform=tf)
        workers = {"num_workers": 1}
        if a.worker_start:
            workers["multiprocessing_context"] = a.worker_start
    torch.manual_seed(0)
    model = DDP(cnn(DataInfo(3, 10, a.size, "folder")))
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9)
    sampler = DistributedSampler(train, shuffle=True, seed=0, drop_last=True)
    if a.batched:
        from bench.baselines.batch_fetch import loader as batch_loader

        loader = batch_loader(train, a.batch_size, sampler=sampler)
    else:
        loader = DataLoader(train, batch_size=a.batch_size, sampler=sampler, drop_last=True, **workers)
    val_loader = DataLoader(Subset(val, range(rank, len(val), a.ranks)), batch_size=a.batch_size, **workers)
    marks, step, acc = [], 0, None
    for epoch in range(a.epochs):
        model.train()
        sampler.set_epoch(epoch)
        for inputs, labels in loader:
            optimizer.zero_grad()
            criterion(model(inputs), labels).backward()
            optimizer.step()
            step += 1
            if step % a.mark_every == 0:
                marks.append((step, time.time()))
        model.eval()
        sums = torch.zeros(2)
        with torch.no_grad():
            for inputs, labels in val_loader:
                sums += torch.tensor([(model(inputs).argmax(1) == labels).sum().item(), len(labels)])
        dist.all_reduce(sums)
        acc = (sums[0] / sums[1]).item()
    t_end = time.time()
    if rank == 0:
        with open(out_path, "w") as fh:
            json.dump({"t_ready": t_ready, "t_end": t_end, "marks": marks, "val_acc": acc, "steps": step,
                       "train_samples": len(train)}, fh)
    dist.destroy_process_group()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("--mode", choices=("decode-once", "tutorial"), default="decode-once")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--mark-every", type=int, default=10)
    ap.add_argument("--batched", action="store_true")
    ap.add_argument("--worker-start", choices=("fork", "spawn", "forkserver"), help="tutorial: DataLoader's "
                    "multiprocessing_context (default: the rank's, spawn under mp.spawn)")
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
