"""Memory per rank, estimated before launch (`torchdeck validate --memory`).

Parameters, gradients and optimizer state are counted from the real model (built on the CPU),
for the strategy's sharding and the offloads asked for.
Activations are measured: one forward of the real model at a small batch on the CPU, summing
the tensors autograd keeps for the backward pass, scaled to the batch per process. Accelerate's
`estimate-memory` covers Hub models at batch 1 without activations; this covers the user's own
model and batch. Imports torch: only the command that asks for it pays for it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

MiB = 2 ** 20
PROBE_BATCH = 4  # activations are measured at this batch, then scaled


@dataclass
class Estimate:
    params: int  # parameter count
    device_mb: dict = field(default_factory=dict)  # what each rank holds on its device, by part
    host_mb: dict = field(default_factory=dict)  # offloaded to host RAM, per rank
    note: str = ""

    @property
    def device_total_mb(self) -> float:
        return sum(self.device_mb.values())


def _data_info(cfg):
    from engine.data import DataInfo

    d = cfg.data
    fixed = {"cifar10": (3, 10, 32), "mnist": (1, 10, 28), "fashionmnist": (1, 10, 28)}
    if d.dataset == "synthetic":
        return DataInfo(3, d.num_classes, d.image_size, "synthetic")
    if d.dataset in fixed:
        c, k, s = fixed[d.dataset]
        return DataInfo(c, k, s, d.dataset)
    if d.dataset == "imagefolder":
        from pathlib import Path

        root = Path(d.root).expanduser() / "train"
        root = root if root.is_dir() else Path(d.root).expanduser()
        classes = [p for p in root.iterdir() if p.is_dir()] if root.is_dir() else []
        return DataInfo(3, max(1, len(classes)), d.image_size, "imagefolder")
    return None  # a user's data set: its shapes are known only once it is loaded


def _activation_bytes_per_sample(model, info, precision: str) -> float:
    """Bytes autograd saves for the backward pass, per sample, from one real forward on the CPU."""
    import torch

    saved = 0
    # weights saved for the backward (Linear keeps weight.t()) are the parameters, counted apart
    seen = {(p.untyped_storage().data_ptr(), p.untyped_storage().nbytes()) for p in model.parameters()}

    def pack(t):
        nonlocal saved
        if isinstance(t, torch.Tensor):
            key = (t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
            if key not in seen:  # one tensor saved by two operations is held once
                seen.add(key)
                saved += t.untyped_storage().nbytes()
        return t

    x = torch.zeros(PROBE_BATCH, info.in_channels, info.image_size, info.image_size)
    x.requires_grad_(False)
    dtype = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.bfloat16}.get(precision)  # fp16 has no CPU autocast
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
            out = model(x)
    pack(out)  # the logits, and the batch itself, when no layer kept them already
    pack(x)
    return saved / PROBE_BATCH


def _shards(cfg) -> tuple[int, int, int]:
    """How many ways parameters, gradients and optimizer state are split across the ranks."""
    w = cfg.world_size
    s = cfg.strategy
    if s == "zero":
        return 1, 1, w
    if s == "fsdp":
        return w, w, w
    if s == "deepspeed":
        stage = cfg.deepspeed.stage
        return (w if stage >= 3 else 1), (w if stage >= 2 else 1), (w if stage >= 1 else 1)
    return 1, 1, 1


def estimate(cfg) -> Estimate:
    """Per rank, in MiB. Raises nothing for a built-in model; a user model that fails to build is
    the caller's to report (the same error a rank would raise)."""
    import torch

    from engine.models import build_model

    info = _data_info(cfg)
    if info is None:
        return Estimate(0, note=f"not estimated: data.dataset {cfg.data.dataset!r} is your own; its shapes "
                                 "are known once it is loaded")
    torch.manual_seed(0)
    model = build_model(cfg, info)
    n = sum(p.numel() for p in model.parameters())
    per_sample = _activation_bytes_per_sample(model, info, cfg.train.precision)
    p_split, g_split, o_split = _shards(cfg)
    opt_per_param = {"sgd": 1 if cfg.optimizer.momentum else 0, "adam": 2, "adamw": 2}[cfg.optimizer.name]
    mixed = cfg.train.precision != "32-true"
    device = {
        "parameters": 4 * n / p_split + (2 * n / p_split if mixed and cfg.strategy == "deepspeed" else 0),
        "gradients": 4 * n / g_split,
        "optimizer state": 4 * n * opt_per_param / o_split,
        "activations": per_sample * cfg.train.batch_size,
    }
    if cfg.strategy == "ddp" and not cfg.ddp.gradient_as_bucket_view:
        device["ddp buckets"] = 4 * n  # DDP's flat all-reduce buffers, a copy of the gradients
    if cfg.strategy == "model-parallel":
        k = max(1, len(set(cfg.devices)) if isinstance(cfg.devices, list) else cfg.nproc_per_node)
        for part in ("parameters", "gradients", "optimizer state"):
            device[part] /= k  # layers balanced by parameters over the devices
    host = {}
    if cfg.strategy == "deepspeed" and cfg.deepspeed.offload_optimizer == "cpu":
        host["optimizer state"] = device.pop("optimizer state")
    if cfg.strategy == "deepspeed" and cfg.deepspeed.offload_param == "cpu":
        host["parameters"] = device.pop("parameters")
    return Estimate(n, {k: v / MiB for k, v in device.items()}, {k: v / MiB for k, v in host.items()})


def lines(cfg, hw=None) -> list[str]:
    """The estimate as `torchdeck validate --memory` prints it, with a warning when it will not fit
    the free memory of a chosen GPU (or this host's available RAM on the CPU)."""
    est = estimate(cfg)
    if est.note:
        return [f"memory: {est.note}"]
    parts = ", ".join(f"{k} {v:,.1f}" for k, v in est.device_mb.items())
    out = [f"memory per rank (MiB, estimated; {est.params:,} parameters, {cfg.train.precision}, batch "
           f"{cfg.train.batch_size}): {parts}; total {est.device_total_mb:,.1f}"]
    if est.host_mb:
        out.append("  offloaded to host RAM per rank: " + ", ".join(f"{k} {v:,.1f}" for k, v in est.host_mb.items()))
    need = est.device_total_mb
    if cfg.accelerator == "cuda":
        by_index = {g.index: g for g in (getattr(hw, "gpus", None) or [])}
        for i in (cfg.devices if isinstance(cfg.devices, list) else []):
            g = by_index.get(i)
            if g is not None and g.memory_total_mb and need > g.memory_total_mb - g.memory_used_mb:
                out.append(f"  warning: GPU {i} has {g.memory_total_mb - g.memory_used_mb:,} MiB free, a rank needs "
                           f"about {need:,.0f} MiB: lower train.batch_size, or shard (fsdp, zero, deepspeed)")
    else:
        import psutil

        avail = psutil.virtual_memory().available / MiB
        total = need * cfg.nproc_per_node
        if total > avail:
            out.append(f"  warning: {cfg.nproc_per_node} rank(s) need about {total:,.0f} MiB, this host has "
                       f"{avail:,.0f} MiB available: lower train.batch_size or devices")
    return out


def main(argv: list[str] | None = None) -> int:
    """`python -m engine.memory CONFIG.yaml`: the estimate's lines, for a caller that must not
    import torch itself (the app's Configure screen runs this in a child process)."""
    import sys

    from engine import config as cfgmod
    from engine.errors import TorchdeckError
    from engine.hardware import detect_hardware

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m engine.memory CONFIG.yaml", file=sys.stderr)
        return 2
    try:
        hw = detect_hardware()
        out = lines(cfgmod.load(args[0], hw=hw), hw)
    except (TorchdeckError, OSError) as exc:
        print(f"memory: {exc}".splitlines()[0], file=sys.stderr)
        return 2
    print("\n".join(out), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
