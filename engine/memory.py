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

from .strategies import get_strategy, nproc_per_node

MiB = 2 ** 20
PROBE_BATCH = 4  # activations are measured at this batch, then scaled


@dataclass
class Estimate:
    params: int  # parameter count
    device_mb: dict = field(default_factory=dict)  # what each rank holds on its device, by part
    host_mb: dict = field(default_factory=dict)  # offloaded to host RAM, per rank
    note: str = ""
    # Host RAM each rank holds besides the model: the data set it keeps in memory and the
    # runtime's fixed share (a process with torch loaded, measured in this one). A rank's peak RSS
    # on the CPU counts both (846-880 MiB measured for a 4.4 MiB model: issue 27).
    fixed_mb: dict = field(default_factory=dict)
    runtime_own_mb: float = 0.0  # of fixed_mb["runtime"], the pages that are the process's own (not libraries')
    node_data_mb: float = 0.0  # the data set's memory for the whole node (one shared copy, or one per rank)

    @property
    def device_total_mb(self) -> float:
        return sum(self.device_mb.values())


def _data_info(cfg):
    from .data import DataInfo

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


def _probe_batch(cfg):
    """PROBE_BATCH samples of a data set whose shapes only its samples tell (a user's callable, the
    text set): (info, the collated batch); (None, None) for the image sets, probed with zeros."""
    if _data_info(cfg) is not None:
        return None, None
    from torch.utils.data import default_collate

    from .data import build_datasets

    train, _, info = build_datasets(cfg)
    n = min(PROBE_BATCH, len(train))
    if n == 0:
        return info, None
    return info, default_collate([train[i] for i in range(n)])


def _activation_bytes_per_sample(model, info, precision: str, batch=None, loss_setting: str = "auto") -> float:
    """Bytes autograd saves for the backward pass, per sample, from one real forward on the CPU:
    of zeros shaped as the images, or of a real batch (`batch`: a tuple, or a dict passed as
    model(**batch)) with the run's loss (the model's own, for a language model)."""
    import torch

    from collections.abc import Mapping

    from .batch import batch_size, forward
    from .losses import Loss

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

    dtype = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.bfloat16}.get(precision)  # fp16 has no CPU autocast
    if batch is None:
        x = torch.zeros(PROBE_BATCH, info.in_channels, info.image_size, info.image_size)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            with torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
                out = model(x)
        pack(out)  # the logits, and the batch itself, when no layer kept them already
        pack(x)
        return saved / PROBE_BATCH
    loss = Loss(loss_setting)
    x, y = loss.split(batch)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
            out = forward(model, x)
            value, _ = loss(out, y, batch)
    pack(value)
    for t in (batch.values() if isinstance(batch, Mapping) else batch if isinstance(batch, (list, tuple)) else [batch]):
        pack(t)
    return saved / max(1, batch_size(batch))


def _runtime_mb() -> tuple[float, float]:
    """(RSS, RSS less file-backed pages) in MiB of this process with torch loaded: what any rank holds before its model
    and data (libtorch's pages, the interpreter, the allocator's arenas). (0, 0) if unreadable."""
    import psutil
    import torch  # noqa: F401  (loaded: its pages are what is measured)

    try:
        mem = psutil.Process().memory_info()
    except (psutil.Error, OSError):
        return 0.0, 0.0
    file_backed = getattr(mem, "shared", 0)  # Linux: libraries' pages, held once however many ranks map them
    return mem.rss / MiB, (mem.rss - file_backed) / MiB


def _data_mb(cfg) -> tuple[float, float]:
    """(per rank, per node) MiB of the data set held in memory (engine.cache's plan: decoded once,
    generated, or streamed from disk, which holds none)."""
    from .cache import plan

    p = plan(cfg, nproc_per_node(cfg))
    if not p.node_bytes:
        return 0.0, 0.0
    return p.nbytes / MiB, p.node_bytes / MiB


def estimate(cfg) -> Estimate:
    """Per rank, in MiB. Raises nothing for a built-in model; a user model that fails to build is
    the caller's to report (the same error a rank would raise)."""
    from .kinds import kind_of

    kind = kind_of(cfg)
    if not kind.can_estimate_memory:  # not the loop's model: quickstart's CNN would be estimated instead
        return Estimate(0, note=f"not estimated for a {kind.title}: {kind.no_memory_estimate}")
    import torch

    from .models import build_model

    rss, own = _runtime_mb()  # before the model and the data: the runtime alone
    info, batch = _data_info(cfg), None
    if info is None:  # a user's data set or the text set: a real batch of its samples (dicts too)
        info, batch = _probe_batch(cfg)
        if batch is None:
            return Estimate(0, note=f"not estimated: data.dataset {cfg.data.dataset!r} has no training samples")
    rank_data, node_data = _data_mb(cfg)
    torch.manual_seed(0)
    model = build_model(cfg, info)
    n = sum(p.numel() for p in model.parameters())
    per_sample = _activation_bytes_per_sample(model, info, cfg.train.precision, batch, cfg.train.loss)
    strategy = get_strategy(cfg.strategy)  # how it splits the parts, what it adds or offloads
    p_split, g_split, o_split = strategy.shards(cfg)
    opt_per_param = {"sgd": 1 if cfg.optimizer.momentum else 0, "adam": 2, "adamw": 2}[cfg.optimizer.name]
    device = {
        "parameters": 4 * n / p_split,
        "gradients": 4 * n / g_split,
        "optimizer state": 4 * n * opt_per_param / o_split,
        "activations": per_sample * cfg.train.batch_size,
    }
    host = strategy.memory_parts(cfg, n, device)
    fixed = {"data set": rank_data, "runtime": rss} if rss else {"data set": rank_data}
    return Estimate(n, {k: v / MiB for k, v in device.items()}, {k: v / MiB for k, v in host.items()},
                    fixed_mb=fixed, runtime_own_mb=own, node_data_mb=node_data)


def _sharding() -> list[str]:
    """The strategies that can split the model's state over the ranks (the advice when it will not fit)."""
    from .strategies import loop_names

    return [n for n in loop_names() if get_strategy(n).can_shard]


def lines(cfg, hw=None) -> list[str]:
    """The estimate as `torchdeck validate --memory` prints it, with a warning when it will not fit
    the free memory of a chosen GPU (or this host's available RAM on the CPU)."""
    est = estimate(cfg)
    if est.note:
        return [f"memory: {est.note}"]
    head = (f"memory per rank (MiB, estimated; {est.params:,} parameters, {cfg.train.precision}, batch "
            f"{cfg.train.batch_size:,}): ")
    runtime = est.fixed_mb.get("runtime")
    said_runtime = ((f"runtime: a process with torch loaded, measured here ({runtime:,.0f}, {est.runtime_own_mb:,.0f} "
                     "of it its own, the rest libraries the ranks share)") if runtime else
                    "runtime: not measured (torch's own footprint, some hundreds of MiB, is left out)")
    said_runtime += ("; not counted: the allocator's free blocks, the process group's buffers and the copies made "
                     "while the data set is built (a rank's peak can be a few hundred MiB above this)")
    if cfg.accelerator == "cuda":  # the device holds the model's parts; the host the data and the runtime
        parts = ", ".join(f"{k} {v:,.1f}" for k, v in est.device_mb.items())
        out = [f"{head}{parts}; total {est.device_total_mb:,.1f} on the GPU, plus the CUDA context "
               "(some hundreds of MiB per GPU, not measured without one: left out)"]
        out.append("  host RAM per rank: " + ", ".join(f"{k} {v:,.1f}" for k, v in est.fixed_mb.items())
                   + f"; {said_runtime}")
    else:  # one memory: a rank's peak RSS holds all of it
        both = {**est.device_mb, **est.fixed_mb}
        parts = ", ".join(f"{k} {v:,.1f}" for k, v in both.items())
        out = [f"{head}{parts}; total {sum(both.values()):,.1f}", f"  {said_runtime}"]
    if est.host_mb:
        out.append("  offloaded to host RAM per rank: " + ", ".join(f"{k} {v:,.1f}" for k, v in est.host_mb.items()))
    need = est.device_total_mb
    if cfg.accelerator == "cuda":
        by_index = {g.index: g for g in (getattr(hw, "gpus", None) or [])}
        for i in (cfg.devices if isinstance(cfg.devices, list) else []):
            g = by_index.get(i)
            if g is not None and g.memory_total_mb and need > g.memory_total_mb - g.memory_used_mb:
                out.append(f"  warning: GPU {i} has {g.memory_total_mb - g.memory_used_mb:,} MiB free, a rank needs "
                           f"about {need:,.0f} MiB: lower train.batch_size, or shard ({', '.join(_sharding())})")
    else:
        import psutil

        avail = psutil.virtual_memory().available / MiB
        # the node: each rank's model and own runtime pages, the data as the node holds it, and
        # the shared libraries once
        runtime = est.fixed_mb.get("runtime", 0.0)
        total = ((need + est.runtime_own_mb) * nproc_per_node(cfg) + est.node_data_mb
                 + (runtime - est.runtime_own_mb))
        if total > avail:
            out.append(f"  warning: {nproc_per_node(cfg)} rank(s) need about {total:,.0f} MiB, this host has "
                       f"{avail:,.0f} MiB available: lower train.batch_size or devices")
    return out


def main(argv: list[str] | None = None) -> int:
    """`python -m torchdeck.engine.memory CONFIG.yaml`: the estimate's lines, for a caller that must not
    import torch itself (the app's Configure screen runs this in a child process)."""
    import sys

    from . import preflight
    from .errors import TorchdeckError
    from .hardware import detect_hardware

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m torchdeck.engine.memory CONFIG.yaml", file=sys.stderr)
        return 2
    try:
        hw = detect_hardware()
        out = lines(preflight.load(args[0], hw=hw), hw)
    except (TorchdeckError, OSError) as exc:
        print(f"memory: {exc}".splitlines()[0], file=sys.stderr)
        return 2
    print("\n".join(out), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
