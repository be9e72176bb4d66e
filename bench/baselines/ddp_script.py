"""A plain torchrun-style DDP training script, as a user writes it: nothing of torchdeck in it
unless --log-every-step (then one `torchdeck.log` call per step).

    torchrun --nproc-per-node 2 bench/baselines/ddp_script.py --out result.json
    torchdeck launch --nproc-per-node 2 bench/baselines/ddp_script.py --out result.json [--log-every-step]

2 ranks (whatever WORLD_SIZE the launcher sets), gloo, init_process_group from the environment,
DistributedSampler, the CIFAR-10 tutorial CNN on an in-memory synthetic set (random 3x32x32
images, 10 classes). Rank 0 writes its own timings to --out (or $DDP_SCRIPT_OUT) as JSON, so
every launcher's numbers come from the script itself: time.time() at the end of its first step
(t_first_step), at its first line (t_start), at the end of step --warm and of the last step (steps/s between them), its
threads and the launcher's environment it saw, and the CPU its parent (the launcher's process that
started the ranks: torchrun's agent, torchdeck's supervisor) used between those two steps.
"""
from __future__ import annotations

import time

T_START = time.time()  # the script starts (before torch is imported): the launcher's part ends here

import argparse
import json
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def parent_cpu_s() -> float | None:
    """CPU seconds the process that started this rank has used so far, all its threads, by the
    scheduler (/proc/PID/task/TID/schedstat): torchrun's agent, or torchdeck's supervisor. None
    where /proc does not say."""
    ppid = os.getppid()
    try:
        tids = os.listdir(f"/proc/{ppid}/task")
    except OSError:
        return None
    total = 0
    for tid in tids:
        try:
            with open(f"/proc/{ppid}/task/{tid}/schedstat") as fh:
                total += int(fh.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return total / 1e9


def cnn() -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(3, 6, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(16 * 5 * 5, 120), nn.ReLU(),
        nn.Linear(120, 84), nn.ReLU(),
        nn.Linear(84, 10),
    )


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--warm", type=int, default=50, help="steps/s is timed from this step's end")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--train-size", type=int, default=8192)
    ap.add_argument("--out", default=os.environ.get("DDP_SCRIPT_OUT", ""))
    ap.add_argument("--log-every-step", action="store_true", help="torchdeck.log({'loss': ...}) every step")
    a = ap.parse_args(argv)
    log = None
    if a.log_every_step:
        import torchdeck

        log = torchdeck.log

    dist.init_process_group("gloo")  # RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from the launcher
    rank = dist.get_rank()
    g = torch.Generator().manual_seed(0)
    train = TensorDataset(torch.randn(a.train_size, 3, 32, 32, generator=g),
                          torch.randint(0, 10, (a.train_size,), generator=g))
    torch.manual_seed(0)
    model = DDP(cnn())
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sampler = DistributedSampler(train, shuffle=True, seed=0, drop_last=True)
    loader = DataLoader(train, batch_size=a.batch_size, sampler=sampler, drop_last=True)
    t_first = t_warm = cpu_warm = None
    step, epoch = 0, 0
    model.train()
    while step < a.steps:
        sampler.set_epoch(epoch)
        for inputs, labels in loader:
            optimizer.zero_grad()
            loss = criterion(model(inputs), labels)
            loss.backward()
            optimizer.step()
            if log is not None:
                log({"loss": loss.item()}, samples=len(inputs))
            step += 1
            if step == 1:
                t_first = time.time()
            if step == a.warm:
                t_warm = time.time()
                cpu_warm = parent_cpu_s() if rank == 0 else None
            if step == a.steps:
                break
        epoch += 1
    t_end = time.time()
    cpu_end = parent_cpu_s() if rank == 0 else None
    if rank == 0:
        print(f"step {step} loss {loss.item():.4f}", flush=True)
        if a.out:
            with open(a.out, "w") as fh:
                json.dump({"t_start": T_START, "t_first_step": t_first, "t_warm": t_warm, "t_end": t_end, "warm": a.warm,
                           "steps": step, "steps_per_s": (step - a.warm) / (t_end - t_warm),
                           "samples_per_s": (step - a.warm) * a.batch_size * dist.get_world_size()
                           / (t_end - t_warm),
                           "world_size": dist.get_world_size(), "threads": torch.get_num_threads(),
                           "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
                           "under_torchdeck": bool(os.environ.get("TORCHDECK_EVENTS_FD")),
                           "logged": log is not None, "parent_pid": os.getppid(),
                           "parent_cpu_s": cpu_end - cpu_warm if cpu_end is not None and cpu_warm is not None
                           else None}, fh)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
