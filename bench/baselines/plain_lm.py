"""The lm-cpu workload in a hand-written DDP loop (mp.spawn, gloo, DistributedSampler), as a user
would write it without torchdeck: the same GPT, the same text windows (torchdeck.engine.text's
built-in corpus), AdamW, a warm-up + cosine LambdaLR, gradient clipping, threads per rank =
cores / ranks. Rank 0 records the wall time every --mark-every steps (where torchdeck emits step
events).

    python -m bench.baselines.plain_lm --ranks 2 --steps 300 --batch-size 16
"""
from __future__ import annotations

import argparse
import json
import math
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
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler

    from torchdeck.engine.models import GPT
    from torchdeck.engine.text import VOCAB_SIZE, text_datasets

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // a.ranks))
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=a.ranks)
    torch.manual_seed(0)
    train, _val, _info = text_datasets("", a.block_size)
    model = DDP(GPT(VOCAB_SIZE, a.block_size, a.n_layer, a.n_head, a.n_embd))
    optimizer = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.99), weight_decay=0.0)
    total, warm, floor = a.steps, a.warmup, a.min_lr / a.lr

    def factor(step):
        if step < warm:
            return (step + 1) / warm
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, total - warm)))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    sampler = DistributedSampler(train, shuffle=True, seed=0, drop_last=True)
    loader = DataLoader(train, batch_size=a.batch_size, sampler=sampler, drop_last=True)
    t_ready = time.time()
    marks, step, epoch = [], 0, 0
    model.train()
    while step < a.steps:
        sampler.set_epoch(epoch)
        for batch in loader:
            loss = model(**batch).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), a.grad_clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            scheduler.step()
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
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--block-size", type=int, default=64)
    ap.add_argument("--n-layer", type=int, default=4)
    ap.add_argument("--n-head", type=int, default=4)
    ap.add_argument("--n-embd", type=int, default=128)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--min-lr", type=float, default=3e-4)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--grad-clip", type=float, default=1.0)
    ap.add_argument("--mark-every", type=int, default=10)
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
