"""NVML (nvidia-ml-py) in one place, for the launch checks (engine.hardware) and the app's GPU
sampler (app.sources.nvml) alike. No torch, no textual; pynvml itself is imported on first use
(it dlopens the driver library).

The idea is nvitop's: a session initialises NVML once and keeps the device handles; a reading the
GPU, driver or our permissions cannot give (NotSupported, NoPermission, a lost GPU) is None, never
an error; a missing library or driver is a status with the reason in words a user can act on.

Indices are the physical ones NVML reports (as nvidia-smi shows them), whatever
CUDA_VISIBLE_DEVICES says.
"""
from __future__ import annotations

import threading

MiB = 2**20
NOT_INSTALLED = "nvidia-ml-py is not installed"


def _start_failure(nv, exc: Exception) -> str:
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


def number(value, scale: float = 1.0) -> float | None:
    """A reading as a float (divided by scale); None for anything that is not a number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) / scale


def text(value) -> str | None:
    if value is None:
        return None
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class NVML:
    """One NVML session: started on first use (nvmlInit once), the devices' handles kept until
    `close()`. Thread safe; never raises."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.nv = None  # the pynvml module while the session is up
        self._ok: bool | None = None  # None: not started yet
        self._reason = ""
        self.count = 0  # GPUs NVML counts (some may not open)
        self.problem = ""  # started, but the GPUs could not be counted: why
        self._handles: list[tuple[int, object]] = []

    def _start(self) -> None:
        try:
            import pynvml as nv
        except ImportError:
            self._ok, self._reason = False, NOT_INSTALLED
            return
        try:
            nv.nvmlInit()
        except Exception as exc:  # NVMLError, or a broken install: never the caller's crash
            self._ok, self._reason = False, _start_failure(nv, exc)
            return
        try:
            self.count = int(nv.nvmlDeviceGetCount())
        except Exception as exc:
            self.count, self.problem = 0, f"NVML could not count the GPUs: {exc}"
        for i in range(self.count):
            try:
                self._handles.append((i, nv.nvmlDeviceGetHandleByIndex(i)))
            except Exception:
                continue  # a lost or inaccessible GPU: left out rather than failing them all
        self.nv, self._ok = nv, True

    def status(self) -> tuple[bool, str]:
        """(True, "") once NVML is up, else (False, why). Starts it the first time."""
        with self._lock:
            if self._ok is None:
                self._start()
            return bool(self._ok), self._reason

    def handles(self) -> list[tuple[int, object]]:
        """(physical index, handle) of every GPU that opened; [] without NVML."""
        return list(self._handles) if self.status()[0] else []

    def read(self, function: str, *args):
        """One NVML reading, e.g. read("nvmlDeviceGetMemoryInfo", handle); None when it cannot be had."""
        try:
            return getattr(self.nv, function)(*args)
        except Exception:
            return None

    def read_number(self, function: str, *args, scale: float = 1.0) -> float | None:
        return number(self.read(function, *args), scale)

    def read_text(self, function: str, *args) -> str | None:
        return text(self.read(function, *args))

    def close(self, reason: str = "NVML closed") -> None:
        """nvmlShutdown, if it was started; the session then answers (False, reason)."""
        with self._lock:
            if self._ok and self.nv is not None:
                try:
                    self.nv.nvmlShutdown()
                except Exception:
                    pass
            self.nv, self._handles, self._ok, self._reason = None, [], False, reason
