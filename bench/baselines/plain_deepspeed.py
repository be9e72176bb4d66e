"""A hand-written DeepSpeed script in the style of the tutorial our users learn from (seed 004):
`deepspeed.init_distributed`, `deepspeed.initialize(model=, model_parameters=, config=)`, then
`engine(inputs)`, `engine.backward(loss)`, `engine.step()`. Ranks are started with mp.spawn (the
tutorial's `deepspeed` launcher only starts processes; throughput is timed inside them).

`--data loader` (the best plain way): a DataLoader with DistributedSampler, threads per rank =
cores / ranks; `--batched` fetches whole batches from the in-memory set as torchdeck does;
`--data training_data` is the tutorial as written (DeepSpeed builds the loader). Rank 0 records the
wall time at the steps where torchdeck emits step events.

    python -m bench.baselines.plain_deepspeed --ranks 2 --steps 200 --batch-size 64 --stage 2
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
    import torch.nn as nn
    from torch.utils.data import DataLoader, DistributedSampler

    from torchdeck.engine.data import DataInfo, synthetic
    from torchdeck.engine.models import cnn

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // a.ranks))
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(a.ranks))
    from torchdeck.engine.strategies.deepspeed import pin_ninja, skip_shm_op

    pin_ninja()  # the ninja torchdeck's ranks build with: a JIT-built op is built once for both
    # as torchdeck's ranks do: the op serves DeepSpeed inference only (the steps are the same either
    # way), and its g++ build would cost this script's first start a CPU-minute that torchdeck's is spared
    skip_shm_op()
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    train, _val = synthetic(a.train_size, a.val_size, 10, 32)
    model = cnn(DataInfo(3, 10, 32, "synthetic"))
    criterion = nn.CrossEntropyLoss()
    ds_config = {
        "train_batch_size": a.batch_size * a.ranks, "train_micro_batch_size_per_gpu": a.batch_size,
        "gradient_accumulation_steps": 1, "steps_per_print": 2 ** 31 - 1,
        "optimizer": {"type": "SGD", "params": {"lr": a.lr, "momentum": 0.9}},
        "zero_optimization": {"stage": a.stage}, "zero_allow_untested_optimizer": True,
    }
    params = [p for p in model.parameters() if p.requires_grad]
    if a.data == "training_data":
        engine, _, loader, _ = deepspeed.initialize(model=model, model_parameters=params, config=ds_config,
                                                    training_data=train)
        sampler = getattr(loader, "data_sampler", None)
    else:
        sampler = DistributedSampler(train, shuffle=True, seed=0, drop_last=True)
        if a.batched:
            from bench.baselines.batch_fetch import loader as batch_loader

            loader = batch_loader(train, a.batch_size, sampler=sampler)
        else:
            loader = DataLoader(train, batch_size=a.batch_size, sampler=sampler, drop_last=True)
        engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=params, config=ds_config)
    t_ready = time.time()
    marks, step, epoch = [], 0, 0
    engine.train()
    while step < a.steps:
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)
        for inputs, labels in loader:
            loss = criterion(engine(inputs), labels)
            engine.backward(loss)
            engine.step()
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
    torch.distributed.destroy_process_group()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--train-size", type=int, default=8192)
    ap.add_argument("--val-size", type=int, default=2048)
    ap.add_argument("--mark-every", type=int, default=10)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--stage", type=int, default=2)
    ap.add_argument("--data", choices=("loader", "training_data"), default="loader")
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
