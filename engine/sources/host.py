"""Host CPU/RAM and the run's own processes (supervisor + ranks) through psutil.

CPU figures are deltas between two calls, so one source is kept for the life of a screen:
it remembers the previous CPU times of the host and of every process it watches. A process
seen for the first time shows its average since it started, so the first frame is not all 0 %.
Blocking: call from a thread worker.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import psutil

_MiB = 2**20


@dataclass
class ProcSample:
    pid: int
    name: str
    cpu_percent: float  # of one core, as top and psutil count it (a busy 2-thread process: ~200)
    rss_mb: float
    rank: int | None  # None: the supervisor (or anything that is not a rank)
    child: bool = False  # a process a rank started (a script's own workers, mp.spawn), counted with it


@dataclass
class HostSample:
    cpu_percent: float  # whole host, 0-100
    per_cpu: list[float]
    ram_used_mb: float  # total - available, what `free` calls used
    ram_total_mb: float
    load1: float | None
    procs: list[ProcSample] = field(default_factory=list)


def _busy_total(t) -> tuple[float, float]:
    """(busy, total) seconds of one cpu_times tuple; guest time is already inside user/nice on Linux."""
    d = t._asdict()
    total = sum(v for k, v in d.items() if k not in ("guest", "guest_nice"))
    idle = d.get("idle", 0.0) + d.get("iowait", 0.0)
    return total - idle, total


def _percent(prev, now) -> float:
    b0, t0 = _busy_total(prev)
    b1, t1 = _busy_total(now)
    dt = t1 - t0
    if dt <= 0:
        return 0.0
    return max(0.0, min(100.0, 100.0 * (b1 - b0) / dt))


def descendants(roots: list[int]) -> dict[int, int]:
    """child pid -> the root it descends from, for every live descendant of `roots`: one pass over
    the process table (psutil's children() walks it once per call, per rank)."""
    if not roots:
        return {}
    below: dict[int, list[int]] = {}
    for p in psutil.process_iter(["ppid"]):
        ppid = p.info.get("ppid")
        if ppid:
            below.setdefault(ppid, []).append(p.pid)
    out: dict[int, int] = {}
    for root in roots:
        todo = list(below.get(root, ()))
        while todo:
            pid = todo.pop()
            if pid in out or pid in roots:
                continue
            out[pid] = root
            todo.extend(below.get(pid, ()))
    return out


class HostSource:
    """Samples the host and a given set of processes; keeps psutil state between calls."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._prev_cpu = psutil.cpu_times(percpu=True)
        self._procs: dict[int, tuple[psutil.Process, float, float]] = {}  # pid -> (proc, cpu_s, monotonic)

    def status(self) -> tuple[bool, str]:
        return True, ""

    def sample(self, pids: dict[int, int | None] | None = None) -> HostSample:
        """The host now, plus one ProcSample per pid in `pids` (pid -> rank) that still exists, and
        one per descendant of a rank (a script's own workers: mp.spawn, DataLoader workers), marked
        child and counted as that rank's."""
        with self._lock:
            now_cpu = psutil.cpu_times(percpu=True)
            per_cpu = [_percent(a, b) for a, b in zip(self._prev_cpu, now_cpu)]
            self._prev_cpu = now_cpu
            whole = sum(per_cpu) / len(per_cpu) if per_cpu else 0.0
            vm = psutil.virtual_memory()
            try:
                load1 = float(psutil.getloadavg()[0])
            except (AttributeError, OSError):
                load1 = None
            procs = self._sample_procs(pids or {})
        return HostSample(cpu_percent=whole, per_cpu=per_cpu,
                          ram_used_mb=(vm.total - vm.available) / _MiB, ram_total_mb=vm.total / _MiB,
                          load1=load1, procs=procs)

    def _sample_procs(self, pids: dict[int, int | None]) -> list[ProcSample]:
        family = dict(pids)
        kids = descendants([p for p, r in pids.items() if r is not None])  # the supervisor's are its ranks
        for kid, parent in kids.items():
            family.setdefault(kid, pids[parent])
        for gone in set(self._procs) - set(family):
            del self._procs[gone]
        out = []
        for pid, rank in family.items():
            s = self._sample_proc(pid, rank)
            if s is None:
                self._procs.pop(pid, None)  # vanished (or not ours to read): drop it quietly
            else:
                s.child = pid in kids and pid not in pids
                out.append(s)
        out.sort(key=lambda s: (s.rank is not None, s.rank if s.rank is not None else 0, s.child, s.pid))
        return out

    def _sample_proc(self, pid: int, rank: int | None) -> ProcSample | None:
        try:
            known = self._procs.get(pid)
            proc = known[0] if known else psutil.Process(pid)
            if known and not proc.is_running():  # the pid was reused by another process
                proc = psutil.Process(pid)
                known = None
            with proc.oneshot():
                if proc.status() == psutil.STATUS_ZOMBIE:
                    return None
                t = proc.cpu_times()
                cpu_s = t.user + t.system
                rss = proc.memory_info().rss
                name = proc.name()
                started = proc.create_time()
            mono = time.monotonic()
            if known:
                dt = mono - known[2]
                pct = 100.0 * (cpu_s - known[1]) / dt if dt > 0 else 0.0
            else:
                life = time.time() - started
                pct = 100.0 * cpu_s / life if life > 0 else 0.0
            self._procs[pid] = (proc, cpu_s, mono)
            return ProcSample(pid=pid, name=name, cpu_percent=max(0.0, pct), rss_mb=rss / _MiB, rank=rank)
        except (psutil.NoSuchProcess, psutil.AccessDenied, ProcessLookupError, ValueError):
            return None

    def close(self) -> None:
        with self._lock:
            self._procs.clear()


class FakeHostSource:
    """HostSource's interface over a fixed sample (or a function making one): tests, snapshots."""

    def __init__(self, sample: HostSample | Callable[..., HostSample]) -> None:
        self._sample = sample
        self.last_pids: dict | None = None

    def status(self) -> tuple[bool, str]:
        return True, ""

    def sample(self, pids: dict[int, int | None] | None = None) -> HostSample:
        self.last_pids = pids
        return self._sample() if callable(self._sample) else self._sample

    def close(self) -> None:
        pass
