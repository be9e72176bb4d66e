"""The plain single-GPU script: ResNet-18 on 32x32 synthetic images with the usual speed knobs.

    python -m bench.baselines.plain_gpu --steps 100 --batch-size 256 [--bf16] [--channels-last] [--compile]

--device cpu runs the same script without a GPU (the test suite does, so the script is known to
work before a GPU machine is found; its numbers mean nothing there).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import time


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--train-size", type=int, default=10240)
    ap.add_argument("--mark-every", type=int, default=10)
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--channels-last", action="store_true")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--device", default="cuda:0")
    a = ap.parse_args(argv)

    import torch
    import torch.nn.functional as F
    from torch.utils.data import DataLoader

    from torchdeck.engine.data import DataInfo, synthetic
    from torchdeck.engine.models import resnet18

    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.manual_seed(0)
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    train, _ = synthetic(a.train_size, 0, 10, 32)
    model = resnet18(DataInfo(3, 10, 32, "synthetic")).to(dev)
    if a.channels_last:
        model = model.to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=5e-4)
    fwd = torch.compile(model) if a.compile else model
    loader = DataLoader(train, batch_size=a.batch_size, shuffle=True, drop_last=True, pin_memory=cuda)
    amp = (lambda: torch.autocast(dev.type, dtype=torch.bfloat16)) if a.bf16 else contextlib.nullcontext
    t_ready = time.time()
    marks, step = [], 0
    while step < a.steps:
        for x, y in loader:
            x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
            if a.channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            with amp():
                loss = F.cross_entropy(fwd(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
            if step % a.mark_every == 0 or step == a.steps:
                if cuda:
                    torch.cuda.synchronize()
                marks.append((step, time.time()))
            if step == a.steps:
                break
    print(json.dumps({"t_ready": t_ready, "marks": marks, "loss": loss.item(),
                      "device": torch.cuda.get_device_name(dev) if cuda else str(dev)}))


if __name__ == "__main__":
    main()
