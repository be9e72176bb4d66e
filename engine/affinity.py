"""Each CPU rank on cores of its own (train.cpu_affinity), without importing torch.

Left to the scheduler, the ranks of a CPU run on a small host migrate and now and then share a
core while another sits idle; in data parallel training every rank then waits in the all-reduce
for the one that shared. Binding local rank r to its own `threads` cores (as torch.backends.xeon's
run_cpu and torchrun's --numa-binding=exclusive do) removed that: a 2-rank CIFAR-shaped run on 2
cores trained ~10 % faster, the same gain for the plain script given the same binding
(BENCHMARKS.md, issue 17).

The cores are split out of the set this process may use (taskset, SLURM's cpuset, a container's),
in topology order (`core_order`: a physical core's hyperthreads together, NUMA node by node), so a
rank gets whole cores, on one node where its share fits. DataLoader workers get that whole set
back (`loader_kwargs`): they must not crowd onto their rank's cores.
"""
from __future__ import annotations

import contextlib
import functools
import os

SYSFS = "/sys/devices/system"

_original: list[int] | None = None  # the set before this process bound itself (for loader workers)


def allowed_cpus() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # no affinity on this OS
        return []


def usable_cpus() -> int:
    """CPUs this process may run on: SLURM's --cpus-per-task, taskset and container cpusets give
    fewer than the host has (os.cpu_count() counts the host)."""
    return len(allowed_cpus()) or os.cpu_count() or 1  # [] where the OS has no affinity


def threads_for(cfg, local_world_size: int) -> int:
    """Usable cores / local processes (as torchrun's OMP_NUM_THREADS), unless train.threads_per_rank says."""
    return cfg.train.threads_per_rank or max(1, usable_cpus() // max(1, local_world_size))


def parse_list(text: str) -> list[int]:
    """'0-3,8,10-11' (sysfs, taskset) -> [0, 1, 2, 3, 8, 10, 11]."""
    out = []
    for part in text.strip().split(","):
        if part:
            lo, _, hi = part.partition("-")
            out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def _read(path: str) -> str | None:
    try:
        with open(path) as fh:
            return fh.read()
    except OSError:
        return None


def core_order(cpus: list[int], sysfs: str = SYSFS) -> list[int]:
    """`cpus` ordered so that splitting them in order gives each rank whole physical cores (a
    core's hyperthreads side by side) and keeps a rank on one NUMA node where its share fits.
    Linux numbers a 2-socket SMT host's first hyperthreads 0..P-1 across both sockets and their
    siblings P..2P-1, so a split by number gave one rank a thread of every core of both sockets
    and the other rank the siblings of the same cores. Unknown topology: number order."""
    node_of = {}
    for name in os.listdir(f"{sysfs}/node") if os.path.isdir(f"{sysfs}/node") else []:
        text = _read(f"{sysfs}/node/{name}/cpulist") if name[4:].isdigit() and name.startswith("node") else None
        for cpu in parse_list(text) if text else []:
            node_of[cpu] = int(name[4:])

    def key(cpu: int) -> tuple:
        topo = f"{sysfs}/cpu/cpu{cpu}/topology"
        pkg, core = _read(f"{topo}/physical_package_id"), _read(f"{topo}/core_id")
        try:
            return node_of.get(cpu, 0), int(pkg), int(core), cpu
        except (TypeError, ValueError):
            return node_of.get(cpu, 0), 0, cpu, cpu

    return sorted(cpus, key=key)


def plan(mode: str, accelerator: str, local_world: int, threads: int, cpus: list[int]) -> tuple[list[list[int]] | None, str]:
    """(cores per local rank, or None: not bound; why, in words a log line can carry).
    auto binds CPU runs of 2+ local ranks whose threads take the cores (as auto threads_per_rank
    does); exclusive binds any run that fits."""
    need = local_world * threads
    if mode == "none":
        return None, "train.cpu_affinity none"
    if not cpus:
        return None, "this OS does not let a process choose its cores"
    if need > len(cpus):
        return None, (f"{local_world} rank(s) x {threads} thread(s) = {need} cores, but this process may use "
                      f"{len(cpus)}")
    if mode == "auto" and (accelerator != "cpu" or local_world < 2):
        return None, ("train.cpu_affinity auto binds CPU runs only" if accelerator != "cpu"
                      else "one rank per node: nothing to keep apart")
    if mode == "auto" and len(cpus) - need >= local_world:
        # threads_per_rank leaves cores over (for another run, say): binding every run to the
        # first cores would pile them up there
        return None, f"{need} of {len(cpus)} cores asked for: auto binds only ranks that take them all"
    return [cpus[r * threads:(r + 1) * threads] for r in range(local_world)], f"train.cpu_affinity {mode}"


def cpu_list(cores: list[int]) -> str:
    """0-3,8 style (as taskset and /proc say it)."""
    out, start, prev = [], None, None
    for c in sorted(cores):
        if start is None:
            start = prev = c
        elif c == prev + 1:
            prev = c
        else:
            out.append(f"{start}-{prev}" if prev != start else str(start))
            start = prev = c
    if start is not None:
        out.append(f"{start}-{prev}" if prev != start else str(start))
    return ",".join(out)


def _set_all_threads(cores: list[int]) -> None:
    """Every thread of this process (sched_setaffinity binds one thread; threads started later
    inherit from the one that starts them)."""
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        tids = [0]
    for tid in tids:
        try:
            os.sched_setaffinity(tid, cores)
        except OSError:  # a thread that ended meanwhile
            pass


def bind(cores: list[int]) -> None:
    """Bind this rank (all its threads) to `cores`; remember the set it had for its loader workers."""
    global _original
    if _original is None:
        _original = allowed_cpus()
    _set_all_threads(cores)


def _reset_to(cores: list[int], _worker_id: int = 0) -> None:
    _set_all_threads(cores)


@contextlib.contextmanager
def unbound():
    """The calling thread on the set this process had before binding (a process it starts inherits
    that), then back on its cores."""
    if not _original:
        yield
        return
    mine = os.sched_getaffinity(0)
    os.sched_setaffinity(0, _original)
    try:
        yield
    finally:
        os.sched_setaffinity(0, mine)


def loader_kwargs() -> dict:
    """What a DataLoader of a bound rank needs (nothing when it is not bound): a worker_init_fn that
    gives each loader worker the set its rank had before binding. It carries the set itself: a
    worker started by spawn imports this module afresh."""
    return {"worker_init_fn": functools.partial(_reset_to, _original)} if _original else {}


def said(cores: list[list[int]] | None, why: str) -> str:
    """A plan in words, for the run's log and `torchdeck validate` alike."""
    if not cores:
        return f"not bound ({why})"
    return ", ".join(f"local rank {i} on {cpu_list(c)}" for i, c in enumerate(cores)) + f" ({why})"


def describe(cfg, local: int) -> str:
    """The plan for `local` ranks on this host, as `torchdeck validate` says it before launch (the
    ranks make the same plan when they start; the run's log says what they did)."""
    return "cores: " + said(*plan(cfg.train.cpu_affinity, cfg.accelerator, local, threads_for(cfg, local),
                                  core_order(allowed_cpus())))
