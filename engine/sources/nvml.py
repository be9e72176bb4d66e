"""GPU samples through NVML (nvidia-ml-py), for the device picker and the Monitor's GPU pane.

Built on engine.nvml's session (the one NVML wrapper, shared with the launch checks): NVML is
initialised once per source and its device handles kept, a field the GPU or driver cannot report
(NotSupported, NoPermission, ...) becomes None ("n/a" on screen) instead of an error, and a
missing library or driver is a status with the reason, not a crash.

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

from ..nvml import NOT_INSTALLED, NVML, MiB, number
from ..procs import pid_alive


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


class GPUSource:
    """Reads every GPU NVML sees, through one engine.nvml session (started on first use, handles
    kept). Blocking: call from a thread worker. Thread safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._nvml: NVML | None = None
        self._devices: list[tuple[int, object, str, str]] = []  # (index, handle, name, uuid)
        self._ok: bool | None = None  # None: not probed yet
        self._reason = ""

    # ------------------------------------------------------------------ start / stop
    def _start(self) -> None:
        """Start NVML; names and UUIDs are read once and kept with the handles."""
        nv = NVML()
        ok, why = nv.status()
        if not ok:
            self._ok = False
            self._reason = why + (" (pip install nvidia-ml-py)" if why == NOT_INSTALLED else "")
            return
        devices = [(i, h, nv.read_text("nvmlDeviceGetName", h) or "n/a", nv.read_text("nvmlDeviceGetUUID", h) or "")
                   for i, h in nv.handles()]
        if devices:
            self._nvml, self._devices, self._ok, self._reason = nv, devices, True, ""
        else:
            self._ok = False
            self._reason = nv.problem or ("NVML found no GPU" if nv.count == 0
                                          else f"NVML lists {nv.count} GPU(s) but none can be opened")
            nv.close()  # nothing to watch: NVML is released at once

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
            if self._nvml is not None:
                self._nvml.close()
            self._nvml, self._devices = None, []
            self._ok, self._reason = False, "GPU source closed"

    # ------------------------------------------------------------------ one device
    def _sample_one(self, index: int, h, name: str, uuid: str) -> GPUSample:
        nv = self._nvml
        rates = nv.read("nvmlDeviceGetUtilizationRates", h)
        mem = nv.read("nvmlDeviceGetMemoryInfo", h)
        pids: list[int] = []
        for fn in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
            for p in nv.read(fn, h) or []:
                pid = getattr(p, "pid", None)
                if isinstance(pid, int) and pid not in pids:
                    pids.append(pid)
        return GPUSample(
            index=index, name=name, uuid=uuid,
            util=number(getattr(rates, "gpu", None)), mem_util=number(getattr(rates, "memory", None)),
            mem_used_mb=number(getattr(mem, "used", None), MiB), mem_total_mb=number(getattr(mem, "total", None), MiB),
            temp_c=nv.read_number("nvmlDeviceGetTemperature", h, getattr(nv.nv, "NVML_TEMPERATURE_GPU", 0)),
            power_w=nv.read_number("nvmlDeviceGetPowerUsage", h, scale=1000.0),  # mW
            power_limit_w=nv.read_number("nvmlDeviceGetEnforcedPowerLimit", h, scale=1000.0),
            fan_pct=nv.read_number("nvmlDeviceGetFanSpeed", h), pids=pids)


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
