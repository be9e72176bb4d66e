"""Decode once: image data sets held in memory as uint8 tensors, one copy per node.

`data.cache: auto` keeps an image folder (or torchvision's CIFAR-10 / MNIST / FashionMNIST, which
are arrays already) as decoded uint8 tensors when the decoded size fits `data.cache_budget_mb`
(counted for the whole node, 0: a quarter of this host's memory); `ram` keeps it whatever the
budget; `none` decodes image files every epoch in DataLoader workers. Training then gathers
whole batches of bytes, and normalizes (and augments, `data.augment`) a batch at a time, on the
GPU when the data is there (engine/data.py: ImageTensors, BatchPrep).

The node's ranks share one copy: local rank 0 creates a file in /dev/shm, every local rank maps
it and decodes its share of the images into it, so decoding is split across the ranks and the
memory is held once. The file is unlinked as soon as every rank has it open, so nothing is left
behind whatever happens to the run.

Planning (what `torchdeck validate` and the Configure summary say) needs no torch.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")  # torchvision's
SHM_DIR = "/dev/shm"
# name: (train, val, channels, size) of torchvision's array sets
TV_SHAPES = {"cifar10": (50000, 10000, 3, 32), "mnist": (60000, 10000, 1, 28), "fashionmnist": (60000, 10000, 1, 28)}


def fmt_bytes(n: float) -> str:
    """Binary units, as data.cache_budget_mb counts them."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" or n >= 100 else f"{n:.3g} {unit}"
        n /= 1024
    return f"{n:.3g} GiB"


# ----------------------------------------------------------------------------- planning (no torch)


def total_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        import psutil

        return psutil.virtual_memory().total


def budget_bytes(cfg) -> int:
    mb = cfg.data.cache_budget_mb
    return mb * 2 ** 20 if mb > 0 else total_memory() // 4


_COUNTS: dict[tuple, int] = {}


def count_images(folder: Path) -> int:
    """Image files one level below `folder` (ImageFolder's layout), remembered per folder state."""
    try:
        classes = [e for e in os.scandir(folder) if e.is_dir()]
        key = (str(folder), tuple((e.name, e.stat().st_mtime_ns) for e in classes))
    except OSError:
        return 0
    if key not in _COUNTS:
        n = 0
        for c in classes:
            try:
                n += sum(1 for f in os.scandir(c.path) if f.name.lower().endswith(IMG_EXTENSIONS))
            except OSError:
                pass
        _COUNTS[key] = n
    return _COUNTS[key]


def decoded_size(cfg) -> tuple[int, int, int] | None:
    """(train images, val images, bytes per image) for sets the cache can hold, else None."""
    d = cfg.data
    if d.dataset in TV_SHAPES:
        tr, va, c, s = TV_SHAPES[d.dataset]
        return tr, va, c * s * s
    if d.dataset == "imagefolder" and d.root:
        base = Path(d.root).expanduser()
        if (base / "train").is_dir():
            tr, va = count_images(base / "train"), count_images(base / "val") if (base / "val").is_dir() else 0
        else:
            tr, va = count_images(base), 0
        return tr, va, 3 * d.image_size * d.image_size
    return None


def shm_room() -> int:
    try:
        st = os.statvfs(SHM_DIR)
    except OSError:
        return 0
    return st.f_bavail * st.f_frsize


@dataclass
class CachePlan:
    use: bool  # decoded once, held as uint8 tensors
    nbytes: int  # decoded size of train + val (one copy), 0 when not known
    node_bytes: int  # what the node holds: one shared copy, or one per rank
    budget: int
    shared: bool  # one copy for the node's ranks
    line: str  # what validate and the Configure summary say


def loader_workers(setting: int, in_memory: bool, local_ranks: int) -> int:
    """data.num_workers, with -1 (auto): none for an in-memory set (a batch is one gather), else
    what a user would pick for a set read from disk: the rank's share of the cores, less the one
    it trains on, at least 1 and at most 8."""
    if setting >= 0:
        return setting
    if in_memory:
        return 0
    return max(1, min(8, (os.cpu_count() or 1) // max(1, local_ranks) - 1))


def worker_start(setting: str, workers: int) -> dict:
    """DataLoader's multiprocessing_context for a rank's loader workers. A rank that
    torch.multiprocessing.spawn started has spawn as its default too, so each worker would import
    torch afresh: 2.4 s before the first batch on 2 cores (again each epoch without
    persistent_workers), ~280 MiB more per worker. Forking the rank itself is fast but not safe on
    Python 3.11: a child forked while another thread (gloo's, dropping a collective's tensors)
    creates or ends its thread state waits forever for the interpreter's thread-list lock (1 run
    in 7 to 100 hung at the first batch here). `auto` (Linux) starts them from a fork server: one
    clean process per rank that imports torch while the rank builds its model, and forks each
    worker from there. Elsewhere it leaves the platform's default."""
    if workers <= 0:
        return {}
    if setting == "auto":
        setting = "forkserver" if sys.platform.startswith("linux") else ""
    return {"multiprocessing_context": setting} if setting else {}


def start_said(method: str | None) -> str:
    """How workers start, as the rank's log, validate and the Configure summary say it."""
    return {"fork": "forked from the rank", "forkserver": "forked from a fork server", None: "started the platform's way"
            }.get(method, f"started by {method}")


# usercode installs the user's folders (from the environment) where workers unpickle their data set
SERVER_PRELOAD = ["torch", "torchdeck.engine.data", "torchdeck.engine.usercode"]
# A user's data set (package.module:callable) is often torchvision's: its workers find it imported.
# Not for an image folder (engine.data reads it without torchvision, whose import brings torch._dynamo).
USER_SET_PRELOAD = ["torchvision.datasets", "torchvision.transforms"]


def start_worker_server(start: dict, user_set: bool = False) -> None:
    """Start the fork server now (when the workers start from one), with torch and the data modules
    preloaded, off the rank's bound cores: it imports them while the rank builds its model."""
    if start.get("multiprocessing_context") != "forkserver":
        return
    import multiprocessing
    from multiprocessing import forkserver

    from . import affinity

    multiprocessing.set_forkserver_preload(SERVER_PRELOAD + (USER_SET_PRELOAD if user_set else []))
    with affinity.unbound():
        forkserver.ensure_running()


AUTO_WORKERS_ASKED = 2  # per rank, for a streamed set, where the cores are not known yet (sbatch)


def asked_workers(cfg, nproc: int) -> int:
    """Loader workers a rank will run, for asking a scheduler for CPUs before the job's host is known."""
    if cfg.data.num_workers >= 0:
        return cfg.data.num_workers
    p = plan(cfg, nproc)
    in_memory = cfg.data.dataset in ("synthetic", "text") or p.use or cfg.data.dataset in TV_SHAPES
    return 0 if in_memory else AUTO_WORKERS_ASKED


def plan(cfg, nproc: int, room: int | None = None) -> CachePlan:
    """Whether this run keeps its data decoded in memory with `nproc` ranks on the node, and the
    one line that says so."""
    d = cfg.data
    budget = budget_bytes(cfg)
    of_budget = f"cache budget {fmt_bytes(budget)}"
    size = decoded_size(cfg)
    if size is None:
        if d.dataset == "synthetic":
            n = (d.train_size + d.val_size) * 3 * d.image_size ** 2 * 4
            return CachePlan(False, n, n * nproc, budget, False,
                             f"data: synthetic, generated in memory by each rank ({fmt_bytes(n)} each)")
        if d.dataset == "text":  # engine/text.py
            where = f"the bytes of {d.root}" if d.root else "the built-in corpus (1 MiB, generated)"
            return CachePlan(False, 0, 0, budget, False, f"data: text, {where}, held in memory by each rank")
        return CachePlan(False, 0, 0, budget, False,
                         f"data: {d.dataset} as the callable returns it (data.cache is for image folders "
                         f"and torchvision sets)")
    tr, va, per = size
    n = (tr + va) * per
    room = shm_room() if room is None else room
    shareable = nproc > 1 and room >= n + (64 << 20)
    arrays = d.dataset in TV_SHAPES
    copies = f"one copy for the node's {nproc} ranks" if shareable else (
        "one copy" if nproc == 1 else f"one copy per rank, {fmt_bytes(n * nproc)} in all ({SHM_DIR} has no room)")
    node = n if shareable or nproc == 1 else n * nproc
    use = d.cache == "ram" or (d.cache == "auto" and node <= budget)
    over = f", over the {of_budget} (data.cache: ram)" if node > budget else f" ({of_budget})"
    if arrays:
        what = f"data: {d.dataset} as uint8 tensors, {fmt_bytes(n)}"
        if use:
            return CachePlan(True, n, node, budget, shareable, f"{what}, {copies}{over}")
        each = f"in each of the {nproc} ranks ({fmt_bytes(n * nproc)} for the node)" if nproc > 1 else "in memory"
        why = "data.cache: none" if d.cache == "none" else f"one shared copy would exceed the {of_budget}"
        return CachePlan(False, n, n * nproc, budget, False, f"{what}, {each}: {why}")
    images = f"{tr + va} images"
    workers = loader_workers(d.num_workers, False, nproc)
    start = start_said(worker_start(d.worker_start, workers).get("multiprocessing_context")) if workers else ""
    streamed = (f"decoded every epoch by {workers} loader worker{'s' if workers != 1 else ''} per rank"
                + (f", {start}" if start else ""))
    if use:
        return CachePlan(True, n, node, budget, shareable,
                         f"data: {images} decoded once into RAM, {fmt_bytes(n)}, {copies}{over}")
    if d.cache == "none":
        return CachePlan(False, n, 0, budget, False, f"data: {images} {streamed} (data.cache: none)")
    return CachePlan(False, n, 0, budget, False,
                     f"data: {images} would take {fmt_bytes(node)} decoded, over the {of_budget} "
                     f"(data.cache_budget_mb): {streamed}")


# ----------------------------------------------------------------------------- one copy per node


@dataclass
class NodeShare:
    """Where a rank stands among the node's ranks, for sharing one copy of the data.

    `key` names the run and node (the run directory), `barrier` waits for every rank of the run
    (all ranks build their data at the same point, so a global barrier serves)."""

    local_rank: int
    local_world: int
    key: str
    barrier: object  # callable() -> None
    agree: object = None  # callable(list of bools) -> the same list, AND-ed over every rank

    def all_agree(self, flags: list[bool]) -> list[bool]:
        """Ranks decide from what they see (free room in /dev/shm can change between them): one
        answer for all, or one would wait at a barrier the others never reach."""
        return list(self.agree(flags)) if self.agree is not None else flags

    def path(self, split: str) -> Path:
        import hashlib  # not at import: the app's first frame imports this module (via engine.config)

        digest = hashlib.sha1(f"{self.key}\0{split}".encode()).hexdigest()[:20]
        return Path(SHM_DIR) / f"torchdeck-{os.getuid()}-{digest}"


def _map(fd: int, nbytes: int):
    import mmap

    import torch

    if nbytes == 0:
        return torch.empty(0, dtype=torch.uint8)
    mm = mmap.mmap(fd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    return torch.frombuffer(mm, dtype=torch.uint8)


def shared_bytes(share: NodeShare | None, split: str, nbytes: int | None, fill) -> "torch.Tensor":
    """A uint8 tensor of nbytes every local rank sees, filled by fill(buffer, part, parts).

    nbytes None: only local rank 0 knows the size; it allocates and fills everything
    (fill(None, 0, 1) returns the bytes), the others map what it wrote. Without a share (one
    process, or no room in /dev/shm) the tensor is private and this process fills all of it."""
    import torch

    if share is None or share.local_world == 1:
        if nbytes is None:
            return fill(None, 0, 1)
        buf = torch.empty(nbytes, dtype=torch.uint8)
        fill(buf, 0, 1)
        return buf
    path = share.path(split)
    fd = -1
    try:
        if share.local_rank == 0:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
            if nbytes is None:
                data = fill(None, 0, 1)
                os.ftruncate(fd, data.numel())
                _map(fd, data.numel()).copy_(data)
                del data
            else:
                os.ftruncate(fd, nbytes)
        share.barrier()  # the file exists, sized (and filled, when only local rank 0 could)
        if share.local_rank != 0:
            fd = os.open(path, os.O_RDWR)
        share.barrier()  # everyone has it open: it needs no name any more
        if share.local_rank == 0:
            path.unlink(missing_ok=True)
        buf = _map(fd, os.fstat(fd).st_size)
    finally:
        if share.local_rank == 0 and fd < 0:
            path.unlink(missing_ok=True)
        if fd >= 0:
            os.close(fd)  # the mapping keeps the memory
    if nbytes is not None:
        fill(buf, share.local_rank, share.local_world)
        share.barrier()  # every share decoded
    return buf
