"""The GPU (NVML) and host (psutil) samplers, against the real libraries and real processes.

NVML is real where it exists; on this machine (no driver) the real reader must say why and
return nothing. Where a test needs GPU behaviour here, only pynvml's functions are replaced:
pynvml stands in for the hardware, the sampler's own code runs unchanged.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import time
from types import SimpleNamespace

import psutil
import pytest

from torchdeck.app.sources.host import FakeHostSource, HostSample, HostSource
from torchdeck.app.sources.nvml import FakeGPUSource, GPUSample, GPUSource, pid_namespace_warning


def _nvidia_smi_gpus() -> list[str]:
    """`nvidia-smi -L` lines, or [] where there is no working driver."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return []
    try:
        r = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [ln for ln in r.stdout.splitlines() if ln.startswith("GPU ")] if r.returncode == 0 else []


HAVE_GPU = bool(_nvidia_smi_gpus())


# ---------------------------------------------------------------------------- real NVML


@pytest.mark.skipif(HAVE_GPU, reason="this host has a working NVIDIA driver; see the gpu tests")
def test_real_source_without_driver_says_why_and_samples_nothing():
    src = GPUSource()
    ok, reason = src.status()
    assert ok is False
    known = ("no NVIDIA driver library", "NVIDIA driver is not loaded", "NVML found no GPU",
             "nvidia-ml-py is not installed", "no permission to use NVML")
    assert any(k in reason for k in known), reason
    assert src.sample() == []
    assert src.status() == (False, reason)  # asked again: the same answer, not a new probe
    src.close()
    assert src.sample() == []


@pytest.mark.gpu
@pytest.mark.skipif(not HAVE_GPU, reason="needs an NVIDIA GPU and driver (nvidia-smi -L)")
def test_real_source_reads_every_gpu():
    lines = _nvidia_smi_gpus()
    src = GPUSource()
    try:
        assert src.status() == (True, "")
        samples = src.sample()
        assert [s.index for s in samples] == list(range(len(lines)))
        for s, line in zip(samples, lines):
            assert s.name and s.name in line
            assert s.uuid and s.uuid in line
            assert s.util is not None and 0 <= s.util <= 100
            assert s.mem_total_mb and s.mem_total_mb > 0
            assert s.mem_used_mb is not None and 0 <= s.mem_used_mb <= s.mem_total_mb
            assert s.temp_c is None or 0 < s.temp_c < 120
            assert all(isinstance(p, int) for p in s.pids)
        assert len(src.sample()) == len(samples)  # cached handles keep working
    finally:
        src.close()


@pytest.mark.gpu
@pytest.mark.skipif(not HAVE_GPU, reason="needs an NVIDIA GPU and driver (nvidia-smi -L)")
def test_real_source_sees_a_cuda_process():
    """A process holding a CUDA context shows on its GPU's pid list, as nvidia-smi shows it."""
    code = ("import torch, sys, time; x = torch.ones(1, device='cuda:0'); print('up', flush=True);"
            "sys.stdin.readline()")
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    src = GPUSource()
    try:
        assert child.stdout.readline().strip() == "up"
        pids = [p for s in src.sample() for p in s.pids]
        # NVML lists host pids; in a container with its own pid namespace this can differ
        if child.pid not in pids and pid_namespace_warning(src.sample()) is None:
            pytest.fail(f"CUDA child {child.pid} not in NVML pids {pids}")
    finally:
        child.stdin.close()
        child.wait(timeout=60)
        src.close()


# ---------------------------------------------------------------------------- NVML faults


def _fake_nvml(monkeypatch, gpus: int = 2, **override):
    """Replace pynvml's device functions with a two-GPU board that refuses some readings."""
    import pynvml as nv

    def not_supported(*_):
        raise nv.NVMLError(nv.NVML_ERROR_NOT_SUPPORTED)

    def no_permission(*_):
        raise nv.NVMLError(nv.NVML_ERROR_NO_PERMISSION)

    calls = {"init": 0, "shutdown": 0, "handle": 0}

    def init():
        calls["init"] += 1

    def shutdown():
        calls["shutdown"] += 1

    def handle(i):
        calls["handle"] += 1
        return ("h", i)

    funcs = dict(
        nvmlInit=init, nvmlShutdown=shutdown,
        nvmlDeviceGetCount=lambda: gpus,
        nvmlDeviceGetHandleByIndex=handle,
        nvmlDeviceGetName=lambda h: b"Tesla T4" if h[1] == 0 else "NVIDIA A100-SXM4-40GB",
        nvmlDeviceGetUUID=lambda h: f"GPU-{h[1]:04d}",
        nvmlDeviceGetUtilizationRates=lambda h: SimpleNamespace(gpu=37, memory=12),
        nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(used=1024 * 2**20, total=16384 * 2**20),
        nvmlDeviceGetTemperature=lambda h, sensor: 51 if h[1] == 1 else not_supported(),
        nvmlDeviceGetPowerUsage=not_supported,
        nvmlDeviceGetEnforcedPowerLimit=lambda h: 70000,
        nvmlDeviceGetFanSpeed=not_supported,
        nvmlDeviceGetComputeRunningProcesses=lambda h: [SimpleNamespace(pid=4242, usedGpuMemory=None)],
        nvmlDeviceGetGraphicsRunningProcesses=no_permission,
    )
    funcs.update(override)
    for name, fn in funcs.items():
        monkeypatch.setattr(nv, name, fn)
    return nv, calls


def test_unsupported_fields_become_none_not_errors(monkeypatch):
    nv, calls = _fake_nvml(monkeypatch)
    src = GPUSource()
    assert src.status() == (True, "")
    a, b = src.sample()
    assert (a.index, a.name, a.uuid) == (0, "Tesla T4", "GPU-0000")
    assert (b.index, b.name) == (1, "NVIDIA A100-SXM4-40GB")
    assert a.util == 37.0 and a.mem_util == 12.0
    assert a.mem_used_mb == 1024.0 and a.mem_total_mb == 16384.0 and a.mem_percent == 6.25
    assert a.temp_c is None and b.temp_c == 51.0  # NotSupported on one board only
    assert a.power_w is None and a.power_limit_w == 70.0  # mW to W
    assert a.fan_pct is None
    assert a.pids == [4242]  # graphics list refused (NoPermission): compute list still there
    src.sample()
    assert calls["init"] == 1 and calls["handle"] == 2  # init once, handles kept
    src.close()
    assert calls["shutdown"] == 1 and src.sample() == []


def test_every_reading_refused_still_gives_a_row(monkeypatch):
    """A GPU that answers nothing but its handle (e.g. a MIG parent, a lost GPU) is all None."""
    import pynvml as nv

    def lost(*_):
        raise nv.NVMLError(nv.NVML_ERROR_GPU_IS_LOST)

    names = ["nvmlDeviceGetName", "nvmlDeviceGetUUID", "nvmlDeviceGetUtilizationRates",
             "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetTemperature", "nvmlDeviceGetPowerUsage",
             "nvmlDeviceGetEnforcedPowerLimit", "nvmlDeviceGetFanSpeed",
             "nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"]
    _fake_nvml(monkeypatch, gpus=1, **{n: lost for n in names})
    (s,) = GPUSource().sample()
    assert s.index == 0 and s.name == "n/a" and s.pids == []
    assert [s.util, s.mem_used_mb, s.mem_total_mb, s.temp_c, s.power_w, s.power_limit_w, s.mem_percent] \
        == [None] * 7


@pytest.mark.parametrize("code,words", [
    ("NVML_ERROR_LIBRARY_NOT_FOUND", "no NVIDIA driver library (libnvidia-ml) on this host"),
    ("NVML_ERROR_DRIVER_NOT_LOADED", "the NVIDIA driver is not loaded"),
    ("NVML_ERROR_NO_PERMISSION", "no permission to use NVML"),
    ("NVML_ERROR_UNKNOWN", "NVML failed to start: Unknown Error"),
])
def test_init_failures_name_the_cause(monkeypatch, code, words):
    import pynvml as nv

    def init():
        raise nv.NVMLError(getattr(nv, code))

    _fake_nvml(monkeypatch, nvmlInit=init)
    src = GPUSource()
    ok, reason = src.status()
    assert not ok and words in reason
    assert src.sample() == []


@pytest.mark.parametrize("code", ["NVML_ERROR_DRIVER_NOT_LOADED", "NVML_ERROR_NO_PERMISSION",
                                  "NVML_ERROR_LIB_RM_VERSION_MISMATCH"])
def test_launch_checks_and_the_gpu_pane_say_one_reason(monkeypatch, code):
    """Issue 28: NVML was started in two places with two sets of words: validate/env said 'NVML
    failed to start: Insufficient Permissions' where the GPU pane said what to do. One session
    type, engine.nvml.NVML, now starts it for both."""
    import pynvml as nv

    from torchdeck.engine import hardware
    from torchdeck.engine.nvml import NVML

    def init():
        raise nv.NVMLError(getattr(nv, code))

    _fake_nvml(monkeypatch, nvmlInit=init)
    monkeypatch.setattr(hardware, "_nvml", NVML(), raising=False)  # a fresh session over the fake
    monkeypatch.setattr(hardware, "_state", {}, raising=False)
    assert hardware.nvml_status() == GPUSource().status()
    assert hardware.list_gpus() == [] and hardware.detect_hardware().gpu_count == 0


def test_no_gpu_and_no_library(monkeypatch):
    _, calls = _fake_nvml(monkeypatch, gpus=0)
    src = GPUSource()
    assert src.status() == (False, "NVML found no GPU") and src.sample() == []
    assert calls["shutdown"] == 1  # nothing to watch: NVML is released at once
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` now raises ImportError
    ok, reason = GPUSource().status()
    assert not ok and "nvidia-ml-py is not installed" in reason


def test_pid_namespace_warning_only_when_no_pid_is_ours():
    def s(pids):
        return GPUSample(index=0, name="g", util=1.0, mem_used_mb=1.0, mem_total_mb=2.0, temp_c=None,
                         power_w=None, power_limit_w=None, pids=pids)

    assert pid_namespace_warning([s([])]) is None
    import os
    assert pid_namespace_warning([s([os.getpid(), 2**22 + 12345])]) is None
    msg = pid_namespace_warning([s([2**22 + 12345]), s([2**22 + 12346])])
    assert msg and "PID namespace" in msg and "2 GPU process" in msg


def test_fake_gpu_source():
    sample = GPUSample(index=0, name="NVIDIA A100-SXM4-40GB", util=37.0, mem_used_mb=512, mem_total_mb=40960,
                       temp_c=45, power_w=120.0, power_limit_w=400.0, pids=[])
    assert FakeGPUSource([sample]).status() == (True, "")
    assert FakeGPUSource([sample]).sample() == [sample]
    assert FakeGPUSource([]).status() == (False, "no GPU (fake source)")
    ticks = iter(range(100))
    moving = FakeGPUSource(lambda: [GPUSample(index=0, name="g", util=float(next(ticks)), mem_used_mb=0,
                                              mem_total_mb=1, temp_c=None, power_w=None,
                                              power_limit_w=None, pids=[])])
    assert moving.sample()[0].util < moving.sample()[0].util


# ---------------------------------------------------------------------------- host


@pytest.fixture
def children():
    """A busy child (spins) and an idle one (sleeps); both killed at the end whatever happens."""
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    yield busy, idle
    for p in (busy, idle):
        if p.poll() is None:
            p.kill()
        p.wait(timeout=30)


def test_host_source_measures_real_processes(children):
    busy, idle = children
    src = HostSource()
    assert src.status() == (True, "")
    pids = {busy.pid: 0, idle.pid: 1, 999_999_999: 2}  # the last never existed: left out silently
    time.sleep(0.3)
    first = src.sample(pids)
    time.sleep(1.5)
    second = src.sample(pids)
    by_pid = {p.pid: p for p in second.procs}
    assert set(by_pid) == {busy.pid, idle.pid}
    assert by_pid[busy.pid].rank == 0 and by_pid[idle.pid].rank == 1
    # on a loaded 2-core machine the spinner still gets a fair share of one core; the sleeper ~0
    assert by_pid[busy.pid].cpu_percent > by_pid[idle.pid].cpu_percent + 15, second.procs
    assert by_pid[idle.pid].cpu_percent < 10
    assert all(p.rss_mb > 1 for p in second.procs)
    assert by_pid[busy.pid].name.startswith("python")
    assert [p.rank for p in second.procs] == [0, 1] and len(first.procs) == 2

    assert 0 <= second.cpu_percent <= 100 and len(second.per_cpu) == psutil.cpu_count()
    assert second.cpu_percent > 10  # our spinner alone keeps the host busy
    assert 0 < second.ram_used_mb < second.ram_total_mb
    assert second.load1 is None or second.load1 >= 0

    busy.kill()
    busy.wait(timeout=30)
    third = src.sample(pids)
    assert [p.pid for p in third.procs] == [idle.pid]
    assert src.sample({}).procs == [] and src.sample().procs == []


def test_host_source_first_sight_shows_lifetime_average(children):
    """A process first seen mid-run shows its average so far, not a misleading 0 %."""
    busy, _ = children
    time.sleep(1.0)
    (p,) = HostSource().sample({busy.pid: None}).procs
    assert p.rank is None and p.cpu_percent > 15


def test_fake_host_source():
    s = HostSample(cpu_percent=12.5, per_cpu=[10.0, 15.0], ram_used_mb=2048, ram_total_mb=8192, load1=0.5,
                   procs=[])
    fake = FakeHostSource(s)
    assert fake.status() == (True, "") and fake.sample({1: 0}) is s and fake.last_pids == {1: 0}
    assert FakeHostSource(lambda: s).sample() is s
