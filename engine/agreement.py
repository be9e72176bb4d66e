"""The ranks' stop agreement and their progress reports: one tiny collective every few steps.

All ranks agree on stopping at the same step: one all-reduce (MAX) of the local stop flag and
the step time, every `interval` steps. The interval adapts to about STOP_CHECK_S of training,
from the all-reduced (so identical) step time: cheap for fast steps (a gloo all-reduce is
~0.1-1 ms), prompt for slow ones. Every ~report_every_s the same collective becomes an
all-gather of each rank's progress row instead, so the cross-node view costs no extra
collective. Whether a check is a report is decided from the step count and the agreed step
time, never from a rank's own clock, so every rank enters the same collective.
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist

STOP_CHECK_S = 0.25  # how often ranks agree on a stop request, in training time
MAX_STOP_INTERVAL = 50  # steps
# One row per rank in the gathered report; flag and per_step double as the stop agreement.
REPORT_ROW = ("flag", "per_step", "epoch", "step", "samples_per_s", "data_wait", "device_mem_mb", "t", "peak_mem_mb",
              "comm_wait")


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


class Memory:
    """What a rank holds: device memory on a GPU, the process's RSS on the CPU."""

    def __init__(self, device):
        self.device, self._proc = device, None  # psutil.Process, for the rank's RSS on CPU

    def now_mb(self) -> float:
        if self.device.type == "cuda":
            return torch.cuda.memory_allocated(self.device) / 2 ** 20
        if self._proc is None:
            import psutil

            self._proc = psutil.Process()
        return self._proc.memory_info().rss / 2 ** 20

    def peak_mb(self, now_mb: float | None = None) -> float:
        """The most this rank has held so far: what decides whether a job fits (sampling the current
        figure from outside misses short peaks and short runs). now_mb: now_mb() just read."""
        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.device) / 2 ** 20
        import resource

        # KiB on Linux; the kernel's high-water mark lags the RSS psutil reads by a few pages
        return max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 10,
                   self.now_mb() if now_mb is None else now_mb)


class Agreement:
    def __init__(self, ctx, device, comm, emit, stop_requested, report_every_s: float, memory: Memory):
        """comm: the rank's CommClock or None (a rank that arrives late waits least here too)."""
        self.ctx, self.device, self.comm, self.emit = ctx, device, comm, emit
        self.stop_requested, self.report_every_s, self.memory = stop_requested, report_every_s, memory
        self.interval, self.next_check = 1, 1
        self._check_t, self._check_step = time.perf_counter(), 0
        self._next_report = 1  # first report at the first agreement: every rank is seen early
        self._report_t = self._report_wait = self._report_comm = 0.0
        self._report_samples = 0
        self._hosts: list = []

    def start(self, step: int) -> None:
        """The clocks start with training, not at construction (resume, the worker's log and a
        fork-safe wait come between); hosts and node ranks do not change: exchanged once here."""
        self._check_t, self._check_step, self.interval, self.next_check = time.perf_counter(), step, 1, step + 1
        if self.report_every_s <= 0:
            return
        import socket

        self._report_t, self._report_wait, self._report_samples = time.perf_counter(), 0.0, 0
        self._report_comm = self.comm.total if self.comm is not None else 0.0
        me = (socket.gethostname(), self.ctx.node_rank)
        if _distributed():
            everyone = [None] * self.ctx.world_size
            dist.all_gather_object(everyone, me)
            self._hosts = everyone
        else:
            self._hosts = [me]

    def stop_now(self, pos, last: bool, final: bool, wait_total: float, samples_total: int) -> bool:
        """Every `interval` steps (and at the last): whether the ranks agree to stop here."""
        if pos.step >= self.next_check or last:
            if self.should_stop(pos, wait_total, samples_total, final):
                return True
            self.next_check = pos.step + self.interval
        return False

    def should_stop(self, pos, wait_total: float = 0.0, samples_total: int = 0, final: bool = False) -> bool:
        now = time.perf_counter()
        per_step = (now - self._check_t) / max(1, pos.step - self._check_step)
        self._check_t, self._check_step = now, pos.step
        flag = 1.0 if self.stop_requested() else 0.0
        try:
            return self._agree(pos, flag, per_step, wait_total, samples_total, now, final)
        finally:
            if self.comm is not None:
                self.comm.total += time.perf_counter() - now

    def _agree(self, pos, flag, per_step, wait_total, samples_total, now, final) -> bool:
        if self.report_every_s > 0 and (pos.step >= self._next_report or final):
            rows = self._gather_report(pos, flag, per_step, wait_total, samples_total, now)
            flag = max(r[0] for r in rows)
            per_step = max(r[1] for r in rows)
            self._next_report = pos.step + max(1, int(self.report_every_s / max(per_step, 1e-6)))
        elif _distributed():
            t = torch.tensor([flag, per_step], dtype=torch.float64, device=self.device)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            flag, per_step = t.tolist()
        self.interval = int(min(MAX_STOP_INTERVAL, max(1, STOP_CHECK_S / max(per_step, 1e-6))))
        return flag > 0

    def _gather_report(self, pos, flag, per_step, wait_total, samples_total, now) -> list[list[float]]:
        """Every rank's REPORT_ROW, through one all-gather; rank 0 emits them as a rank_report."""
        window = max(now - self._report_t, 1e-9)
        row = [flag, per_step, float(pos.epoch), float(pos.step),
               (samples_total - self._report_samples) / window,
               min(1.0, (wait_total - self._report_wait) / window),
               self.memory.now_mb(), time.time(), self.memory.peak_mb(),
               -1.0 if self.comm is None else min(1.0, (self.comm.total - self._report_comm) / window)]
        self._report_t, self._report_wait, self._report_samples = now, wait_total, samples_total
        self._report_comm = self.comm.total if self.comm is not None else 0.0
        mine = torch.tensor(row, dtype=torch.float64, device=self.device)
        if _distributed():
            out = [torch.empty_like(mine) for _ in range(self.ctx.world_size)]
            dist.all_gather(out, mine)
            rows = torch.stack(out).tolist()
        else:
            rows = [row]
        if self.ctx.rank == 0:
            self.emit("rank_report", reports=[self._report(rank, r) for rank, r in enumerate(rows)])
        return rows

    def _report(self, rank: int, r: list[float]) -> dict:
        host, node_rank = self._hosts[rank]
        return {"rank": rank, "host": host, "node_rank": node_rank, "epoch": int(r[2]), "step": int(r[3]),
                "samples_per_s": r[4], "data_wait": r[5], "device_mem_mb": r[6], "t": r[7], "peak_mem_mb": r[8],
                "comm_wait": r[9] if r[9] >= 0 else None}
