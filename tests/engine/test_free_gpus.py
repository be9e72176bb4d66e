"""`devices: free:N`: the N GPUs NVML shows without other processes and least used, picked on the
launching host; too few: refused, naming who uses what. NVML is faked (no GPU here); the
real path runs in test_gpu_one_host-style GPU tests on a lent machine."""
from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from torchdeck.engine import config as cfgmod
from torchdeck.engine import hardware, preflight
from torchdeck.engine.nvml import NVML
from torchdeck.engine.strategies import nproc_per_node, world_size

# index -> (memory used MiB, [(pid, MiB)])
BOARD = {0: (3000, [(os.getpid(), 2900)]), 1: (5000, []), 2: (300, []), 3: (20, [(999999, 0)]), 4: (900, [])}


@pytest.fixture
def fake_nvml(monkeypatch):
    """pynvml answering for a five-GPU host: GPU 0 used by this test's own process, 3 by a gone one."""
    import pynvml as nv

    funcs = dict(
        nvmlInit=lambda: None, nvmlDeviceGetCount=lambda: len(BOARD), nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetName=lambda h: b"NVIDIA A100",
        nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(used=BOARD[h][0] * 2**20, total=40960 * 2**20),
        nvmlDeviceGetComputeRunningProcesses=lambda h: [SimpleNamespace(pid=p, usedGpuMemory=mb * 2**20)
                                                        for p, mb in BOARD[h][1]])
    for name, fn in funcs.items():
        monkeypatch.setattr(nv, name, fn)
    monkeypatch.setattr(hardware, "_nvml", NVML())  # a session of its own, over the fake
    yield


def test_free_n_picks_the_least_used_gpus_without_processes(fake_nvml, capsys):
    data = {"strategy": "ddp", "accelerator": "cuda", "devices": "free:2"}
    hw = hardware.detect_hardware()
    cfg = preflight.from_dict(data, hw=hw)
    assert cfg.devices == [2, 4] and world_size(cfg) == 2
    assert hw.notes == [f"devices free:2: GPU 2, 4 (no other process, least memory used: GPU 2 300 MiB, GPU 4 900 MiB); "
                        f"passed over GPU 0 (NVIDIA A100): {hardware._owner(os.getpid())} 2900 MiB; "
                        "GPU 3 (NVIDIA A100): pid 999999"]
    with pytest.raises(cfgmod.ConfigError) as exc:
        preflight.from_dict(dict(data, devices="free:4"), hw=hardware.detect_hardware())
    msg = str(exc.value)
    assert msg.startswith("devices: free:4: only 3 of 5 GPU(s) free (no other process on them): GPU 2, 4, 1; in use: GPU 0")
    assert f"pid {os.getpid()} (" in msg and "2900 MiB" in msg and "GPU 3 (NVIDIA A100): pid 999999" in msg
    # unresolved where the host's GPUs are not read (export, a saved preset): N processes, kept as written
    kept = preflight.from_dict(data, hw=hardware.Hardware(gpu_count=None))
    assert kept.devices == "free:2" and nproc_per_node(kept) == 2
    with pytest.raises(cfgmod.ConfigError, match="free:N asks for N free GPUs"):
        preflight.from_dict(dict(data, devices="free:x"))
