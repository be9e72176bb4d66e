"""What this host has, read through NVML (nvidia-ml-py) without importing torch.

Validation, the CLI and the app's device picker all need the GPU count fast; torch takes
seconds to import and may not even see the driver the same way. A missing or failing NVML
(no driver, a container, a Mac) is normal: every function here answers "no GPU, because ..."
instead of raising.

NVML indices are the physical ones and ignore CUDA_VISIBLE_DEVICES; torchdeck maps devices by
that real index, so when the variable is set we say so (`visible_devices_warning`).
"""
from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field

from engine.config import Hardware

_lock = threading.Lock()
_state: dict = {}  # "ok": bool, "reason": str, "nvml": module or None


@dataclass
class GPUInfo:
    index: int
    name: str
    memory_total_mb: int
    memory_used_mb: int
    busy: bool  # another process holds a compute context on it
    processes: list = field(default_factory=list)  # [(pid, used_mb)], host PIDs


def _init() -> dict:
    """Initialise NVML once per process; later calls reuse the answer."""
    with _lock:
        if _state:
            return _state
        try:
            import pynvml
        except ImportError:
            _state.update(ok=False, reason="nvidia-ml-py is not installed", nvml=None)
            return _state
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            if isinstance(exc, getattr(pynvml, "NVMLError_LibraryNotFound", ())):
                why = "no NVIDIA driver library (libnvidia-ml) on this host"
            elif isinstance(exc, getattr(pynvml, "NVMLError_DriverNotLoaded", ())):
                why = "the NVIDIA driver is not loaded"
            else:
                why = f"NVML failed to start: {exc}"
            _state.update(ok=False, reason=why, nvml=None)
            return _state
        except Exception as exc:  # a broken install must not crash the caller
            _state.update(ok=False, reason=f"NVML failed to start: {exc}", nvml=None)
            return _state
        _state.update(ok=True, reason="", nvml=pynvml)
        return _state


def nvml_status() -> tuple[bool, str]:
    """(True, "") when NVML works, else (False, why) in words a user can act on."""
    st = _init()
    return st["ok"], st["reason"]


def _gpu_count() -> int:
    st = _init()
    if not st["ok"]:
        return 0
    try:
        return int(st["nvml"].nvmlDeviceGetCount())
    except Exception:
        return 0


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def list_gpus() -> list[GPUInfo]:
    """Every GPU by its real index; a field NVML cannot read becomes 0 rather than an error."""
    st = _init()
    if not st["ok"]:
        return []
    nv = st["nvml"]
    out = []
    for i in range(_gpu_count()):
        try:
            h = nv.nvmlDeviceGetHandleByIndex(i)
        except Exception:
            continue
        try:
            name = _text(nv.nvmlDeviceGetName(h))
        except Exception:
            name = "n/a"
        try:
            mem = nv.nvmlDeviceGetMemoryInfo(h)
            total, used = mem.total // 2**20, mem.used // 2**20
        except Exception:
            total = used = 0
        procs = []
        try:
            for p in nv.nvmlDeviceGetComputeRunningProcesses(h):
                used_mb = (p.usedGpuMemory or 0) // 2**20 if isinstance(p.usedGpuMemory, int) else 0
                procs.append((int(p.pid), used_mb))
        except Exception:
            pass
        out.append(GPUInfo(i, name, int(total), int(used), bool(procs), procs))
    return out


def visible_devices_warning() -> str | None:
    """CUDA_VISIBLE_DEVICES renumbers GPUs for torch but not for NVML or torchdeck."""
    val = os.environ.get("CUDA_VISIBLE_DEVICES")
    if val is None:
        return None
    return (f"CUDA_VISIBLE_DEVICES={val!r} is set; torchdeck uses real GPU indices as NVML "
            f"reports them: `devices: 6,7` means physical GPUs 6 and 7, whatever that variable says")


def detect_hardware() -> Hardware:
    """The host as validation sees it; never raises. MPI stays unknown (needs torch to ask)."""
    return Hardware(gpu_count=_gpu_count(), mpi_available=None, cpu_count=os.cpu_count() or 1)
