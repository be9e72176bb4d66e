"""What this host has, read through NVML (engine.nvml's session) without importing torch.

Validation, the CLI and the app's device picker all need the GPU count fast; torch takes
seconds to import and may not even see the driver the same way. A missing or failing NVML
(no driver, a container, a Mac) is normal: every function here answers "no GPU, because ..."
instead of raising.

NVML indices are the physical ones and ignore CUDA_VISIBLE_DEVICES; torchdeck maps devices by
that real index, so when the variable is set we say so (`visible_devices_warning`).

Whether torch has MPI is read the same way, without importing torch: a build with MPI links an
MPI library into its shared libraries (`mpi_available`).
"""
from __future__ import annotations

import os
import struct
import sys
from dataclasses import dataclass, field

from . import nvml
from .nvml import NVML


@dataclass
class Hardware:
    """What this host has, as far as validation needs to know. None: unknown, not checked."""

    gpu_count: int | None = None
    mpi_available: bool | None = None
    cpu_count: int = field(default_factory=lambda: os.cpu_count() or 1)
    gpus: list | None = None  # GPUInfo per GPU, read at launch (devices: free:N); None: not read
    notes: list = field(default_factory=list)  # what was decided from this host (which GPUs free:N picked, why)


@dataclass
class GPUInfo:
    index: int
    name: str
    memory_total_mb: int
    memory_used_mb: int
    busy: bool  # another process holds a compute context on it
    processes: list = field(default_factory=list)  # [(pid, used_mb)], host PIDs


_nvml = NVML()  # this process's NVML session: started on first use, kept


def nvml_status() -> tuple[bool, str]:
    """(True, "") when NVML works, else (False, why) in words a user can act on."""
    return _nvml.status()


def _gpu_count() -> int:
    return _nvml.count if _nvml.status()[0] else 0


def list_gpus() -> list[GPUInfo]:
    """Every GPU by its real index; a field NVML cannot read becomes 0 (its name "n/a") rather
    than an error."""
    out = []
    for i, h in _nvml.handles():
        name = _nvml.read_text("nvmlDeviceGetName", h) or "n/a"
        mem = _nvml.read("nvmlDeviceGetMemoryInfo", h)
        total = int(nvml.number(getattr(mem, "total", None), nvml.MiB) or 0)
        used = int(nvml.number(getattr(mem, "used", None), nvml.MiB) or 0)
        procs = []
        for p in _nvml.read("nvmlDeviceGetComputeRunningProcesses", h) or []:
            pid, mem_b = getattr(p, "pid", None), getattr(p, "usedGpuMemory", None)
            if isinstance(pid, int):
                procs.append((pid, mem_b // nvml.MiB if isinstance(mem_b, int) else 0))
        out.append(GPUInfo(i, name, total, used, bool(procs), procs))
    return out


def _owner(pid: int) -> str:
    """Who runs a process, for the message that says who uses a GPU ("pid 4242 (alice: python)")."""
    try:
        import psutil

        p = psutil.Process(pid)
        return f"pid {pid} ({p.username()}: {p.name()})"
    except Exception:  # gone, another PID namespace, no psutil
        return f"pid {pid}"


def pick_free_gpus(gpus: list[GPUInfo], n: int) -> tuple[list[int] | None, str]:
    """`devices: free:N`: the N GPUs with no other process on them, least memory used first (then
    lowest index). Returns (indices, why they were picked), or (None, who uses what) when fewer
    than N are free."""
    free = sorted((g for g in gpus if not g.processes), key=lambda g: (g.memory_used_mb, g.index))
    used = [g for g in gpus if g.processes]
    taken = "; ".join(f"GPU {g.index} ({g.name}): " + ", ".join(
        f"{_owner(pid)} {mb} MiB" if mb else _owner(pid) for pid, mb in g.processes) for g in used)
    if len(free) < n:
        ok, why = nvml_status() if not gpus else (True, "")
        have = (f"only {len(free)} of {len(gpus)} GPU(s) free (no other process on them)"
                + (f": GPU {', '.join(str(g.index) for g in free)}" if free else "")) if ok else f"no GPUs seen: {why}"
        return None, (f"free:{n}: {have}" + (f"; in use: {taken}" if taken else "")
                      + "; wait for them, or list GPUs by index (devices: 0,1)")
    picked = sorted(g.index for g in free[:n])
    why = (f"devices free:{n}: GPU {', '.join(map(str, picked))} (no other process, least memory used: "
           + ", ".join(f"GPU {g.index} {g.memory_used_mb} MiB" for g in free[:n]) + ")"
           + (f"; passed over {taken}" if taken else ""))
    return picked, why


def resolve_free_gpus(cfg, hw: Hardware, problems: list) -> None:
    """devices: free:N becomes the N GPUs NVML shows least used and without other processes,
    when this host's GPUs were read (hw.gpus); too few: a problem naming who uses what."""
    from .config import free_gpus_asked

    n = free_gpus_asked(cfg.devices)
    if cfg.accelerator != "cuda" or n is None or hw.gpus is None:
        return
    picked, why = pick_free_gpus(hw.gpus, n)
    if picked is None:
        problems.append(("devices", why))
        return
    cfg.devices = picked
    hw.notes.append(why)


def visible_devices_warning() -> str | None:
    """CUDA_VISIBLE_DEVICES renumbers GPUs for torch but not for NVML or torchdeck."""
    val = os.environ.get("CUDA_VISIBLE_DEVICES")
    if val is None:
        return None
    return (f"CUDA_VISIBLE_DEVICES={val!r} is set; torchdeck uses real GPU indices as NVML "
            f"reports them: `devices: 6,7` means physical GPUs 6 and 7, whatever that variable says")


# ----------------------------------------------------------------------------- torch's build, unimported

_PT_LOAD, _PT_DYNAMIC = 1, 2
_DT_NULL, _DT_NEEDED, _DT_STRTAB = 0, 1, 5
_links_cache: dict[str, bool | None] = {}


def elf_needed(path) -> list[str] | None:
    """The libraries an ELF shared object was linked against (its DT_NEEDED entries), read from
    its headers in a few small reads whatever the file's size; None when it is not ELF."""
    try:
        with open(path, "rb") as f:
            def at(offset: int, size: int) -> bytes:
                f.seek(offset)
                return f.read(size)

            head = at(0, 64)
            if len(head) < 52 or head[:4] != b"\x7fELF" or head[4] not in (1, 2) or head[5] not in (1, 2):
                return None
            is64, e = head[4] == 2, "<" if head[5] == 1 else ">"
            if is64:
                phoff, = struct.unpack_from(e + "Q", head, 32)
                phentsize, phnum = struct.unpack_from(e + "HH", head, 54)
            else:
                phoff, = struct.unpack_from(e + "I", head, 28)
                phentsize, phnum = struct.unpack_from(e + "HH", head, 42)
            loads, dynamic = [], None  # (vaddr, offset, filesz) of each loaded segment
            table = at(phoff, phentsize * phnum)
            for i in range(phnum):
                if is64:
                    ptype, _, off, vaddr, _, filesz = struct.unpack_from(e + "IIQQQQ", table, i * phentsize)
                else:
                    ptype, off, vaddr, _, filesz = struct.unpack_from(e + "IIIII", table, i * phentsize)
                if ptype == _PT_LOAD:
                    loads.append((vaddr, off, filesz))
                elif ptype == _PT_DYNAMIC:
                    dynamic = (off, filesz)
            if dynamic is None:
                return []  # statically linked: needs nothing
            entry = struct.Struct(e + ("qQ" if is64 else "iI"))
            raw = at(dynamic[0], dynamic[1])
            needed, strtab = [], None
            for i in range(len(raw) // entry.size):
                tag, val = entry.unpack_from(raw, i * entry.size)
                if tag == _DT_NULL:
                    break
                if tag == _DT_NEEDED:
                    needed.append(val)
                elif tag == _DT_STRTAB:
                    strtab = next((val - va + off for va, off, size in loads if va <= val < va + size), None)
            if strtab is None:
                return None
            names = []
            for name_at in needed:
                chunk = at(strtab + name_at, 256)
                names.append(chunk.split(b"\0", 1)[0].decode("utf-8", "replace"))
            return names
    except (OSError, struct.error):
        return None


def torch_links(prefix: str) -> bool | None:
    """Whether one of the installed torch's shared libraries links a library named prefix*
    (libmpi: built with MPI; libnccl: with NCCL). Found without importing torch (seconds)
    and cached; None when torch or its libraries are not where a pip/conda install puts them."""
    if prefix in _links_cache:
        return _links_cache[prefix]
    import importlib.util

    answer = None
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        libs = []
        for folder in spec.submodule_search_locations:
            lib = os.path.join(folder, "lib")
            try:
                libs += [os.path.join(lib, n) for n in os.listdir(lib) if ".so" in n]
            except OSError:
                pass
        read = [n for n in map(elf_needed, sorted(libs)) if n is not None]
        if read and any(os.path.basename(p).startswith("libtorch_cpu") for p in libs):
            answer = any(name.startswith(prefix) for names in read for name in names)
    _links_cache[prefix] = answer
    return answer


def mpi_available() -> bool | None:
    """Whether `backend: mpi` can work with this torch (as torch.distributed.is_mpi_available()
    answers), or None when we cannot tell: then the rank finds out."""
    answer = torch_links("libmpi")  # Open MPI, MPICH and Intel MPI all name it libmpi*
    if answer is None and "torch.distributed" in sys.modules:  # already paid for: ask it
        answer = bool(sys.modules["torch.distributed"].is_mpi_available())
    return answer


def detect_hardware() -> Hardware:
    """The host as validation sees it; never raises."""
    return Hardware(gpu_count=_gpu_count(), mpi_available=mpi_available(), cpu_count=os.cpu_count() or 1,
                    gpus=list_gpus())


def env_report() -> list[str]:
    """A paste-able description of this host, for bug reports."""
    import importlib.metadata as md
    import platform

    def version(dist):
        try:
            return md.version(dist)
        except md.PackageNotFoundError:
            return "not installed"

    lines = [
        f"- torchdeck: {version('torchdeck')}",
        f"- python: {platform.python_version()} ({sys.executable})",
        f"- platform: {platform.platform()}",
        f"- textual: {version('textual')}",
        f"- deepspeed: {version('deepspeed')}",  # strategy deepspeed needs it (torchdeck[deepspeed])
    ]
    try:
        import torch
        import torch.distributed as dist

        cuda = torch.cuda.is_available()
        lines += [
            f"- torch: {torch.__version__} (CUDA build: {torch.version.cuda or 'none'})",
            f"- CUDA available: {cuda}" + (f", {torch.cuda.device_count()} device(s) visible to torch" if cuda else ""),
            f"- distributed: {dist.is_available()}; gloo {dist.is_gloo_available()}, "
            f"nccl {dist.is_nccl_available()}, mpi {dist.is_mpi_available()}",
        ]
        if cuda and dist.is_nccl_available():
            try:
                lines.append(f"- NCCL version: {'.'.join(map(str, torch.cuda.nccl.version()))}")
            except Exception:
                pass
    except Exception as exc:
        lines.append(f"- torch: cannot import ({type(exc).__name__}: {exc})")
    ok, why = nvml_status()
    if ok:
        gpus = list_gpus()
        lines.append(f"- GPUs (NVML): {len(gpus)}")
        for g in gpus:
            lines.append(f"  - {g.index}: {g.name}, {g.memory_used_mb}/{g.memory_total_mb} MiB used"
                         + (f", busy ({len(g.processes)} process(es))" if g.busy else ""))
    else:
        lines.append(f"- GPUs (NVML): none ({why})")
    warn = visible_devices_warning()
    if warn:
        lines.append(f"- note: {warn}")
    import psutil

    lines.append(f"- CPUs: {os.cpu_count()} logical, {psutil.cpu_count(logical=False) or '?'} physical; "
                 f"RAM {psutil.virtual_memory().total / 2**30:.1f} GiB")
    for var in ("OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME",
                "MASTER_ADDR", "MASTER_PORT", "TORCHDECK_RUNS", "TORCHDECK_PRESETS"):
        if var in os.environ:
            lines.append(f"- {var}={os.environ[var]}")
    return lines
