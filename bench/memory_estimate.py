"""Estimate (engine/memory.py) vs measured peak RSS growth of two training steps on the CPU, one
process: `python -m bench.memory_estimate MODEL BATCH` (resnet18 64, cnn 512, ...)."""
import resource, sys, gc
import torch
from torchdeck.engine import config as cfgmod, memory
from torchdeck.engine.models import build_model
name, batch = sys.argv[1], int(sys.argv[2])
cfg = cfgmod.from_dict({"strategy": "cpu", "model": {"name": name}, "optimizer": {"name": "adam"},
                        "train": {"batch_size": batch}})
est = memory.estimate(cfg)
torch.set_num_threads(1)
info = memory._data_info(cfg)
x = torch.randn(batch, 3, 32, 32); y = torch.randint(0, 10, (batch,))
gc.collect()
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
import psutil; rss0 = psutil.Process().memory_info().rss / 2**20
torch.manual_seed(0); model = build_model(cfg, info)
opt = torch.optim.Adam(model.parameters())
for _ in range(2):
    loss = torch.nn.functional.cross_entropy(model(x), y); loss.backward(); opt.step(); opt.zero_grad(set_to_none=False)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(f"{name} batch {batch}: estimate {est.device_total_mb:.0f} MiB ({', '.join(f'{k} {v:.0f}' for k,v in est.device_mb.items())}); "
      f"peak RSS growth {peak - max(base, rss0):.0f} MiB (baseline {max(base, rss0):.0f})")
