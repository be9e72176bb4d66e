"""A plain PyTorch DDP script, as you would run it under torchrun; the README's tour launches it
with `torchdeck launch --nproc-per-node 2 examples/train.py --epochs 3` (CPU, gloo, a few seconds).

The one torchdeck line is `torchdeck.log(...)`: without it the run still shows each rank's steps.
"""
import argparse

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import torchdeck


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps-per-epoch", type=int, default=20)
    args = parser.parse_args()

    dist.init_process_group("gloo")  # RANK, WORLD_SIZE, MASTER_ADDR... come from the launcher
    rank = dist.get_rank()
    torch.manual_seed(rank)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    w = torch.randn(16, 1, generator=torch.Generator().manual_seed(0))  # the same target on every rank
    step = 0
    for epoch in range(args.epochs):
        for _ in range(args.steps_per_epoch):
            x = torch.randn(64, 16)
            loss = torch.nn.functional.mse_loss(model(x), x @ w)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            torchdeck.log({"loss": loss.item()}, step=step, samples=len(x))
        print(f"epoch {epoch + 1}: loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
