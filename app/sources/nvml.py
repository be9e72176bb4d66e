"""GPU samples through NVML (nvidia-ml-py), for the device picker and the Monitor's GPU pane.

Like nvitop: NVML is initialised once per source and its device handles kept, a field the GPU
or driver cannot report (NotSupported, NoPermission, ...) becomes None ("n/a" on screen)
instead of an error, and a missing library or driver is a status with the reason, not a crash.

Indices are the physical ones NVML reports (as nvidia-smi and nvitop show them), whatever
CUDA_VISIBLE_DEVICES says: torchdeck's `devices:` use the same physical indices.

NVML reports host PIDs: inside a container without the host PID namespace they do not match the
processes we can see; `pid_namespace_warning` says so instead of showing an empty list.

pynvml is imported lazily (it dlopens the driver library); torch is never imported here.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Callable

from engine.procs import pid_alive

_MiB = 2**20


@dataclass(frozen=True)
class GPUSample:
    """One GPU at one moment. Every reading is None when NVML could not read it."""

    index: int
    name: str
    util: float | None  # GPU (SM) utilisation, 0-100 %
    mem_used_mb: float | None
    mem_total_mb: float | None
    temp_c: float | None
    power_w: float | None
    power_limit_w: float | None
    pids: list[int] = field(default_factory=list)  # compute + graphics processes (host PIDs)
    uuid: str = ""
    mem_util: float | None = None  # memory controller busy, 0-100 %
    fan_pct: float | None = None

    @property
    def mem_percent(self) -> float | None:
        if self.mem_used_mb is None or not self.mem_total_mb:
            return None
        return 100.0 * self.mem_used_mb / self.mem_total_mb


def _init_failure_reason(nv, exc: Exception) -> str:
    """NVML's start-up errors, in words a user can act on."""
    def is_(name: str) -> bool:
        cls = getattr(nv, name, None)
        return isinstance(cls, type) and isinstance(exc, cls)

    if is_("NVMLError_LibraryNotFound"):
        return "no NVIDIA driver library (libnvidia-ml) on this host"
    if is_("NVMLError_DriverNotLoaded"):
        return "the NVIDIA driver is not loaded (is this a GPU machine? try nvidia-smi)"
    if is_("NVMLError_NoPermission"):
        return "no permission to use NVML (check access to /dev/nvidia*)"
    if is_("NVMLError_LibRmVersionMismatch"):
        return "NVIDIA driver and library versions differ (reload the driver or reboot)"
    return f"NVML failed to start: {exc}"


class GPUSource:
    """Reads every GPU NVML sees. Blocking: call from a thread worker. Thread safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._nv = None  # the pynvml module once NVML is up
        self._devices: list[tuple[int, object, str, str]] = []  # (index, handle, name, uuid)
        self._ok: bool | None = None  # None: not probed yet
        self._reason = ""

    # ------------------------------------------------------------------ start / stop
    def _start(self) -> None:
        """nvmlInit once; handles, names and UUIDs are read once and kept."""
        try:
            import pynvml as nv
        except ImportError:
            self._ok, self._reason = False, "nvidia-ml-py is not installed (pip install nvidia-ml-py)"
            return
        try:
            nv.nvmlInit()
        except Exception as exc:
            self._ok, self._reason = False, _init_failure_reason(nv, exc)
            return
        try:
            count = int(nv.nvmlDeviceGetCount())
        except Exception as exc:
            count, self._reason = 0, f"NVML could not count the GPUs: {exc}"
        devices = []
        for i in range(count):
            try:
                h = nv.nvmlDeviceGetHandleByIndex(i)
            except Exception:
                continue  # a lost or inaccessible GPU: leave it out rather than fail them all
            name = _text(_read(nv.nvmlDeviceGetName, h)) or "n/a"
            uuid = _text(_read(nv.nvmlDeviceGetUUID, h)) or ""
            devices.append((i, h, name, uuid))
        self._nv, self._devices = nv, devices
        if devices:
            self._ok, self._reason = True, ""
        else:
            self._ok = False
            self._reason = self._reason or ("NVML found no GPU" if count == 0
                                            else f"NVML lists {count} GPU(s) but none can be opened")
            self._shutdown()

    def _shutdown(self) -> None:
        if self._nv is not None:
            try:
                self._nv.nvmlShutdown()
            except Exception:
                pass
        self._nv, self._devices = None, []

    def _ensure(self) -> None:
        if self._ok is None:
            self._start()

    def status(self) -> tuple[bool, str]:
        """(True, "") when GPUs can be read, else (False, why). Probes once, then answers from memory."""
        with self._lock:
            self._ensure()
            return bool(self._ok), self._reason

    def sample(self) -> list[GPUSample]:
        """One sample per GPU, by physical index; [] when NVML is unavailable. Never raises."""
        with self._lock:
            try:
                self._ensure()
                if not self._ok:
                    return []
                return [self._sample_one(*d) for d in self._devices]
            except Exception:  # a sampler must never take the UI down
                return []

    def close(self) -> None:
        with self._lock:
            if self._ok:
                self._shutdown()
            self._ok, self._reason = False, "GPU source closed"

    # ------------------------------------------------------------------ one device
    def _sample_one(self, index: int, h, name: str, uuid: str) -> GPUSample:
        nv = self._nv
        util = mem_util = None
        rates = _read(nv.nvmlDeviceGetUtilizationRates, h)
        if rates is not None:
            util, mem_util = _num(getattr(rates, "gpu", None)), _num(getattr(rates, "memory", None))
        used = total = None
        mem = _read(nv.nvmlDeviceGetMemoryInfo, h)
        if mem is not None:
            used = _num(getattr(mem, "used", None), _MiB)
            total = _num(getattr(mem, "total", None), _MiB)
        temp = _num(_read(nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU))
        power = _num(_read(nv.nvmlDeviceGetPowerUsage, h), 1000.0)  # mW
        limit = _num(_read(nv.nvmlDeviceGetEnforcedPowerLimit, h), 1000.0)
        fan = _num(_read(nv.nvmlDeviceGetFanSpeed, h))
        pids: list[int] = []
        for fn in (nv.nvmlDeviceGetComputeRunningProcesses, nv.nvmlDeviceGetGraphicsRunningProcesses):
            for p in _read(fn, h) or []:
                pid = getattr(p, "pid", None)
                if isinstance(pid, int) and pid not in pids:
                    pids.append(pid)
        return GPUSample(index=index, name=name, util=util, mem_used_mb=used, mem_total_mb=total,
                         temp_c=temp, power_w=power, power_limit_w=limit, pids=pids, uuid=uuid,
                         mem_util=mem_util, fan_pct=fan)


def _read(fn, *args):
    """One NVML reading; None when the GPU, driver or our permissions cannot give it."""
    try:
        return fn(*args)
    except Exception:
        return None


def _num(value, scale: float = 1.0) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) / scale


def _text(value) -> str | None:
    if value is None:
        return None
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def pid_namespace_warning(samples: list[GPUSample]) -> str | None:
    """A note when NVML lists GPU processes none of which exist here (a container's own PID namespace)."""
    pids = {p for s in samples for p in s.pids}
    if not pids:
        return None
    missing = [p for p in sorted(pids) if not pid_alive(p)]
    if len(missing) < len(pids):
        return None
    return (f"NVML reports {len(pids)} GPU process(es) whose PIDs do not exist here: this looks like a "
            f"container without the host PID namespace, so per-process GPU lists are unreliable "
            f"(run with --pid=host to fix)")


class FakeGPUSource:
    """GPUSource's interface over fixed samples (or a function making them): tests, snapshots."""

    def __init__(self, samples: list[GPUSample] | Callable[[], list[GPUSample]],
                 reason: str = "no GPU (fake source)") -> None:
        self._samples = samples
        self._reason = reason
        self.closed = False

    def _current(self) -> list[GPUSample]:
        return list(self._samples() if callable(self._samples) else self._samples)

    def status(self) -> tuple[bool, str]:
        return (True, "") if self._current() else (False, self._reason)

    def sample(self) -> list[GPUSample]:
        return self._current()

    def close(self) -> None:
        self.closed = True
