"""A node's GPUs and host, once a second, as `node_sample` events (engine/events.py), sampled by
the node's supervisor with the engine's sources (the ones the app's panes use: one sampler)."""
from __future__ import annotations

import dataclasses
import threading

from .. import events

EVERY_S = 1.0
HOST_FIELDS = ("cpu_percent", "per_cpu", "ram_used_mb", "ram_total_mb", "load1")


def node_sample(node_rank: int, host: str, gpus: list, host_sample) -> dict:
    """The event for one moment: gpus as engine.sources GPUSample's fields, the host's figures."""
    stats = None if host_sample is None else {k: getattr(host_sample, k) for k in HOST_FIELDS}
    return events.make("node_sample", node_rank=node_rank, host=host,
                       gpus=[dataclasses.asdict(g) for g in gpus], host_stats=stats)


class NodeSampler(threading.Thread):
    """Samples every EVERY_S and hands each event line to `put` (the supervisor's: into its own
    events.jsonl on node 0, towards node 0 on the others). NVML missing is normal: gpus []."""

    def __init__(self, put, node_rank: int, host: str, every: float = EVERY_S, gpu_source=None, host_source=None):
        super().__init__(name="node-sampler", daemon=True)
        self.put, self.node_rank, self.host, self.every = put, node_rank, host, every
        self._gpu, self._host = gpu_source, host_source
        self._ending = threading.Event()
        self.count = 0

    def run(self) -> None:
        from ..sources.host import HostSource
        from ..sources.nvml import GPUSource

        gpu = self._gpu or GPUSource()
        host = self._host or HostSource()
        try:
            while not self._ending.wait(self.every):
                try:
                    gpus = gpu.sample() if gpu.status()[0] else []
                except Exception:  # noqa: BLE001 - a driver hiccup costs one sample, never the run
                    gpus = []
                try:
                    hs = host.sample()
                except Exception:  # noqa: BLE001
                    hs = None
                self.put(events.dumps(node_sample(self.node_rank, self.host, gpus, hs)))
                self.count += 1
        finally:
            for src in (gpu, host):
                try:
                    src.close()
                except Exception:  # noqa: BLE001
                    pass

    def stop(self, timeout: float = 3.0) -> None:
        self._ending.set()
        if self.is_alive():
            self.join(timeout)
