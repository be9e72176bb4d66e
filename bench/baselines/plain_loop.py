"""The classic tutorial training script, as a user would write it without torchdeck.

Same model (the tutorial CNN), same synthetic data (engine.data, so generation is identical),
same batch, SGD with momentum, same number of steps. It records the wall time at the steps where
torchdeck emits step events, so both are timed over the same steady-state window.

With --batched it is the tuned version a careful user would write: the in-memory data set hands
the DataLoader whole batches (one gather per tensor) instead of one sample at a time, as torchdeck
does for in-memory sets; torchdeck against this one is the framework's own overhead.

    python -m bench.baselines.plain_loop --steps 200 --batch-size 64 [--batched]
"""
from __future__ import annotations

import argparse
import json
import time


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--train-size", type=int, default=8192)
    ap.add_argument("--val-size", type=int, default=2048)
    ap.add_argument("--mark-every", type=int, default=10)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--batched", action="store_true", help="fetch whole batches from the tensors")
    a = ap.parse_args(argv)

    import torch
    import torch.nn as nn
    from torch.utils.data import DataLoader

    from torchdeck.engine.data import DataInfo, synthetic
    from torchdeck.engine.models import cnn

    torch.manual_seed(0)
    train, _val = synthetic(a.train_size, a.val_size, 10, 32)
    model = cnn(DataInfo(3, 10, 32, "synthetic"))
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9)
    if a.batched:
        from bench.baselines.batch_fetch import loader as batch_loader

        loader = batch_loader(train, a.batch_size, shuffle=True)
    else:
        loader = DataLoader(train, batch_size=a.batch_size, shuffle=True, drop_last=True)
    t_ready = time.time()

    marks, step, running_loss = [], 0, 0.0
    model.train()
    while step < a.steps:
        for inputs, labels in loader:
            optimizer.zero_grad()
            outputs = model(inputs)
            loss = criterion(outputs, labels)
            loss.backward()
            optimizer.step()
            running_loss += loss.item()
            step += 1
            if step % a.mark_every == 0 or step == a.steps:
                marks.append((step, time.time()))
            if step == a.steps:
                break
    print(json.dumps({"t_ready": t_ready, "marks": marks, "threads": torch.get_num_threads(),
                      "final_loss": running_loss / max(step, 1)}))


if __name__ == "__main__":
    main()
