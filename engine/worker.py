"""One rank: set up the process (output, threads, device, process group, seeds), train, report.

Entry points: `rank_main` (started by the supervisor through torch.multiprocessing) and
`python -m torchdeck.engine.worker CONFIG.yaml --run-dir DIR` (under torchrun, reading RANK etc. from env).
Everything sent to the supervisor is a plain event dict; never a tensor.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import random
import signal
import socket
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import NamedTuple

from . import affinity, events, preflight
from .affinity import threads_for
from .config import ConfigError
from .strategies import nproc_per_node, world_size
from .errors import TorchdeckError
from .rundir import stacks
from .rundir.layout import RunDir, write_atomic
from .rundir.status import Status


def _redirect_output(path: Path) -> None:
    """fd 1 and 2 to the rank's log, so prints and C-level output (gloo, NCCL) land there too."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)


def _die_with_parent() -> None:
    """SIGKILL when the supervisor goes, so no rank outlives its run (Linux only)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def seed_everything(seed: int) -> None:
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed % 2 ** 32)
    torch.manual_seed(seed)


MMAP_THRESHOLD = 64 << 20  # glibc malloc: larger blocks come from mmap (and go back at free)
TRIM_THRESHOLD = 128 << 20  # free memory at the heap's top kept for the next step


def keep_freed_buffers() -> bool:
    """Have glibc's malloc reuse freed tensor buffers instead of mapping (and zeroing) fresh pages
    for each: its default sends every block over 128 KiB to mmap until the process happens to free
    a large one (then it raises that bar by itself). A rank that never did paid ~100,000 page faults
    a second in its forward and backward: one CIFAR-shaped rank in two with the node's shared data
    copy (it reads no file of its own), 20 % slower for the whole run, the other rank waiting for it.
    The user's MALLOC_* or GLIBC_TUNABLES settings win; other allocators ignore this."""
    if any(k.startswith("MALLOC_") for k in os.environ) or "GLIBC_TUNABLES" in os.environ:
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(-3, MMAP_THRESHOLD)) and bool(libc.mallopt(-1, TRIM_THRESHOLD))  # M_MMAP_, M_TRIM_THRESHOLD
    except (OSError, AttributeError):  # not glibc
        return False


class PipeReporter:
    """emit(kind, **fields) -> one event line, tagged with this rank, on the rank's own pipe to its
    node's supervisor (engine/launch/channel.py, the channel a user's script uses too): never
    blocks (a full pipe drops the event and the next one says how many), every line atomic, so a
    rank killed mid-send loses at most its own last event and the other ranks' pipes are theirs.
    (A shared multiprocessing queue had one cross-process write lock: a rank SIGKILLed while
    sending kept it, and every other rank of the node went silent.)"""

    def __init__(self, conn, rank: int):
        from .launch.channel import Channel

        self.conn = conn  # the write end (a multiprocessing Connection, which owns the fd): kept open
        self.channel = Channel(conn.fileno())
        self.rank = rank

    def __call__(self, kind: str, **fields) -> None:
        if kind not in events.KINDS:
            raise ValueError(f"unknown event kind {kind!r}")
        fields.setdefault("rank", self.rank)
        self.channel.send(kind, **fields)


class FileReporter:
    """For torchrun, where no supervisor drains a queue: every rank of the node appends to the run
    directory's events.jsonl itself, one os.write per event on an O_APPEND descriptor, so the
    lines of several ranks never interleave (a buffered text file may split a long traceback)."""

    def __init__(self, path: Path, rank: int):
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.rank = rank

    def __call__(self, kind: str, **fields) -> None:
        fields.setdefault("rank", self.rank)
        self.write_event(events.make(kind, **fields))

    def write_event(self, ev: dict) -> None:
        os.write(self.fd, (events.dumps(ev) + "\n").encode())


def error_event(emit, rank: int, exc: BaseException) -> None:
    emit("error", rank=rank, host=socket.gethostname(), pid=os.getpid(), exception=type(exc).__name__,
         message=str(exc), traceback=traceback.format_exc())


class RendezvousError(TorchdeckError, RuntimeError):
    """The ranks could not meet: said with the address, the port and what to check."""


def _rendezvous_address(cfg) -> tuple[str, str]:
    """Where this rank looks for the others: MASTER_ADDR/PORT (env://, as set by us or torchrun)
    or the host and port of a tcp:// init method; (path, "") for file://."""
    im = cfg.init_method
    if im.startswith("tcp://"):
        host, _, port = im[len("tcp://"):].rpartition(":")
        return host, port
    if im.startswith("file://"):
        return im[len("file://"):], ""
    return os.environ.get("MASTER_ADDR", cfg.nodes.master_addr), os.environ.get("MASTER_PORT", str(cfg.nodes.master_port))


def rendezvous_message(cfg, rank: int, world_size: int, exc: BaseException, node_rank: int | None = None) -> str:
    """One paragraph for a failed init_process_group: where, how long, and what to check."""
    import torch.distributed as dist

    addr, port = _rendezvous_address(cfg)
    n = cfg.nodes
    node_rank = n.node_rank if node_rank is None else node_rank
    node = f"rank {rank} (node {node_rank} of {n.num_nodes})"
    if not port:
        return (f"{node}: rendezvous through {addr} failed after {n.timeout_s} s: check that every node "
                f"sees the same shared file and that all {world_size} ranks started. ({exc})")
    same = (f"every node use the same nodes.master_addr ({addr}), nodes.master_port ({port}) and "
            f"nodes.num_nodes ({n.num_nodes})")
    if n.num_nodes > 1 and (addr in ("localhost", "::1") or addr.startswith("127.")):
        same += (f" (note: {addr} is this host itself; nodes on other machines need node 0's network "
                 f"address in nodes.master_addr)")
    if isinstance(exc, dist.DistNetworkError) and node_rank != 0:
        return (f"{node} could not reach the master at {addr}:{port} within nodes.timeout_s={n.timeout_s} s. "
                f"Check: is node 0 started (torchdeck run PRESET --node-rank 0)? is {addr} reachable from "
                f"this host, and does no firewall block TCP port {port}? does {same}? ({exc})")
    ifname = f" (nodes.ifname={n.ifname})" if n.ifname else " (set nodes.ifname if the hosts have several)"
    return (f"{node}: rendezvous at {addr}:{port} did not complete within nodes.timeout_s={n.timeout_s} s: "
            f"not all {world_size} ranks joined. Check: are all {n.num_nodes} node(s) started, with node "
            f"ranks 0..{n.num_nodes - 1}? does {same}? can the nodes reach each other on the network "
            f"interface gloo/NCCL use{ifname}, through any firewall? ({exc})")


def check_ifname(ifname: str) -> None:
    """gloo stops with "ifa != nullptr" for an interface this host lacks; name it and list the real ones.
    NCCL-style patterns (^docker, =eth0, eth prefixes) are left for NCCL to interpret."""
    if not ifname or any(c in ifname for c in "^="):
        return
    have = [name for _, name in socket.if_nameindex()]
    missing = [n for n in ifname.split(",") if n and n not in have]
    if missing:
        raise RendezvousError(
            f"nodes.ifname: no network interface {', '.join(map(repr, missing))} on host {socket.gethostname()} "
            f"(it has: {', '.join(have)}); set nodes.ifname to the interface that reaches the other nodes, "
            f"or leave it empty to let gloo/NCCL choose")


def for_host(cfg, local_rank: int) -> None:
    """What a rank re-checks of its config, and only that: what may differ on the host it runs on.
    The config was validated in full where it was made (engine/rundir/config.py); the port and
    `devices: all`/`free:N` were settled by this host's supervisor; the network interface is
    checked where gloo is told it (check_ifname). Here: the node's GPUs, which a config made on
    another host (or with other GPUs visible) may name but this host lacks. ConfigError."""
    if cfg.accelerator != "cuda" or not isinstance(cfg.devices, list):
        return
    import torch

    count = torch.cuda.device_count()
    missing = [i for i in cfg.devices if i >= count]
    if missing:
        have = f"GPUs 0-{count - 1}" if count else "no GPU"
        raise ConfigError([("devices", f"GPU {', '.join(map(str, missing))} does not exist on host "
                                       f"{socket.gethostname()} (local rank {local_rank}): it has {have}")])


REPORTER: PipeReporter | None = None  # this rank's, under the supervisor (tests reach its pipe here)
_SERVED = None  # the rendezvous store this rank serves, for the life of the process


def serve_store(cfg, world_size: int, listener) -> object:
    """Local rank 0 of node 0 serves the rendezvous store on the socket the supervisor bound (and
    kept the port with) before any torch import; the other ranks are its clients, as with
    torchrun's agent store. Returns the store as init_process_group's env:// would see it."""
    import torch.distributed as dist

    global _SERVED
    sock, connect = listener
    port = sock.getsockname()[1]
    _SERVED = dist.TCPStore(connect, port, world_size=world_size, is_master=True, wait_for_workers=False,
                            timeout=timedelta(seconds=cfg.nodes.timeout_s), master_listen_fd=sock.detach())
    return dist.PrefixStore("default_pg", _SERVED)


def flight_recorder(rd) -> None:
    """Switch NCCL's flight recorder on (a ring of the last collectives, dumped per rank into the
    run directory when one times out), unless the user set it up: the root cause names the files.
    Old and new names of the variables, so whichever this torch reads."""
    prefix = str(rd.flight_recorder_prefix)
    for var, value in (("TORCH_NCCL_TRACE_BUFFER_SIZE", "2000"), ("TORCH_FR_BUFFER_SIZE", "2000"),
                       ("TORCH_NCCL_DUMP_ON_TIMEOUT", "1"), ("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", prefix),
                       ("TORCH_FR_DUMP_TEMP_FILE", prefix)):
        os.environ.setdefault(var, value)


def init_group(cfg, rank: int, world_size: int, node_rank: int | None = None, listener=None) -> None:
    """init_process_group, with a failed rendezvous turned into a message a user can act on."""
    import torch.distributed as dist

    try:
        store = serve_store(cfg, world_size, listener) if listener is not None else None
        dist.init_process_group(cfg.resolved_backend, init_method=None if store else cfg.init_method, store=store,
                                rank=rank, world_size=world_size, timeout=timedelta(seconds=cfg.nodes.timeout_s))
    except (dist.DistError, TimeoutError) as exc:
        raise RendezvousError(rendezvous_message(cfg, rank, world_size, exc, node_rank)) from exc


LEFT_KEY = "torchdeck/left/"


def leave_group(rank: int, world_size: int, clean: bool) -> None:
    """The rank serving the store leaves last: the others may still use it while they tear their
    group down. Each says it is done; the server waits for them (not after a failure, where the
    supervisor stops everyone anyway)."""
    import torch.distributed as dist

    try:
        store = dist.distributed_c10d._get_default_store()
        if _SERVED is None:
            store.set(f"{LEFT_KEY}{rank}", "1")
        elif clean:
            store.wait([f"{LEFT_KEY}{r}" for r in range(world_size) if r != rank], timedelta(seconds=60))
    except Exception:  # leaving is best effort: the run's outcome is already decided
        pass


def _prewarm() -> None:
    """torch._dynamo takes seconds to import, and torch.compile, FSDP and DeepSpeed need it: import
    it while the rank waits for the others and builds its data (the other ranks of our loop go
    without it: engine/nodynamo.py)."""
    try:
        import torch._dynamo  # noqa: F401
    except Exception:  # the main thread will meet the same error where it matters
        pass


@dataclass
class RankJob:
    """What a rank is handed, by the supervisor's spawn or by torchrun's environment: the run,
    where the rank stands among the others, and (local rank 0 of node 0 under the supervisor) the
    socket it serves the rendezvous store on."""

    cfg: object
    run_dir: Path
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int | None = None  # None: the strategy's processes per node
    node_rank: int | None = None  # None: nodes.node_rank
    listener: tuple | None = None  # (socket, address), see serve_store

    def __post_init__(self):
        self.local_world_size = self.local_world_size or nproc_per_node(self.cfg)
        if self.node_rank is None:
            self.node_rank = self.cfg.nodes.node_rank

    def context(self, device):
        from .strategies.base import RankContext

        return RankContext(rank=self.rank, local_rank=self.local_rank, world_size=self.world_size,
                           local_world_size=self.local_world_size, node_rank=self.node_rank, device=device,
                           cfg=self.cfg)


class Placement(NamedTuple):
    """Where a rank runs: its device and thread count, and the node's core plan (cores per local
    rank, or None and why not)."""

    device: object
    threads: int
    cores: list | None
    why: str


def _take_place(job: RankJob) -> Placement:
    """Cores, threads and device, before the data, the model or another thread exist: the thread
    pools and gloo's threads inherit the binding, and the allocator setting must come first."""
    import torch

    cfg = job.cfg
    threads = threads_for(cfg, job.local_world_size)
    cores, why = affinity.plan(cfg.train.cpu_affinity, cfg.accelerator, job.local_world_size, threads,
                               affinity.core_order(affinity.allowed_cpus()))
    if cores:
        affinity.bind(cores[job.local_rank])
    keep_freed_buffers()
    torch.set_num_threads(threads)
    device = torch.device(cfg.device_for(job.local_rank))
    if device.type == "cuda":
        torch.cuda.set_device(device)  # the index the user listed: "6,7" trains on cuda:6 and cuda:7
    return Placement(device, threads, cores, why)


def _socket_interface(job: RankJob, strategy) -> None:
    """gloo and NCCL read their interface when the group is created; the user's env wins."""
    cfg = job.cfg
    if cfg.nodes.ifname:
        for var in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
            os.environ.setdefault(var, cfg.nodes.ifname)
        if (strategy.distributed and cfg.resolved_backend == "gloo"
                and os.environ["GLOO_SOCKET_IFNAME"] == cfg.nodes.ifname):
            check_ifname(cfg.nodes.ifname)
    elif strategy.distributed and job.world_size == job.local_world_size:
        # One node: the ranks' sockets need not be reachable from elsewhere (gloo would otherwise
        # listen on the address this host's name resolves to, NCCL on its first network interface).
        from .network import loopback_ifname

        lo = loopback_ifname()
        for var in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
            os.environ.setdefault(var, lo)


def _say_ready(job: RankJob, place: Placement, emit) -> None:
    cores, why = place.cores, place.why
    emit("rank_ready", local_rank=job.local_rank, device=str(place.device), pid=os.getpid(),
         host=socket.gethostname(), threads=place.threads,
         cpus=affinity.cpu_list(cores[job.local_rank]) if cores else None)
    if job.local_rank == 0 and cores:
        emit("log", level="info", message="ranks bound to cores: " + affinity.said(cores, why))
    elif job.local_rank == 0 and job.cfg.train.cpu_affinity == "exclusive":
        emit("log", level="warning", message=f"train.cpu_affinity exclusive: ranks not bound: {why}")


def train_rank(job: RankJob, emit, stop_requested=lambda: False) -> bool:
    """Everything a rank does once its environment (MASTER_ADDR etc.) is set. True: stopped on request."""
    import torch.distributed as dist

    from .nodynamo import goes_without

    prewarm = None if goes_without(job.cfg) else threading.Thread(target=_prewarm, name="prewarm", daemon=True)
    if prewarm is not None:
        prewarm.start()

    from .strategies import get_strategy
    from .train import Trainer

    cfg = job.cfg
    strategy = get_strategy(cfg.strategy)
    for_host(cfg, job.local_rank)
    place = _take_place(job)
    _socket_interface(job, strategy)
    if strategy.distributed and cfg.resolved_backend == "nccl":
        flight_recorder(RunDir(job.run_dir))
    if strategy.distributed:
        emit("phase", phase="rendezvous")
        init_group(cfg, job.rank, job.world_size, job.node_rank, job.listener)
    clean = False
    try:
        _say_ready(job, place, emit)
        seed_everything(cfg.train.seed)
        trainer = Trainer(cfg, strategy, job.context(place.device), job.run_dir, emit, stop_requested)
        trainer.resume()
        if job.rank == 0:
            emit("log", level="info",
                 message=f"{trainer.info.name}: {len(trainer.train_ds)} train samples ({trainer.data_note()}), "
                         f"{trainer.steps_per_epoch} steps/epoch; "
                         + preflight.length(cfg, steps=trainer.steps_per_epoch).said())
        if trainer.forks_workers and prewarm is not None:
            # data.worker_start fork: Python 3.11's fork hangs the child when another thread is
            # starting or ending its thread state at that moment (the child waits for the
            # interpreter's thread-list lock before re-creating it). The prewarm thread ends around
            # the first batch: not then. (gloo's threads can still do it: auto uses a fork server.)
            prewarm.join()
        pos = trainer.fit()
        if job.rank == 0:
            how = "stopped on request" if trainer.stopped else "finished"
            from .fmt import epoch_at

            emit("log", level="info", message=f"{how} at {epoch_at(pos.epoch, pos.batches_done)}, step {pos.step}")
        clean = True
        return trainer.stopped
    finally:
        if strategy.distributed and dist.is_initialized():
            leave_group(job.rank, job.world_size, clean)
            dist.destroy_process_group()


def rank_main(local_rank, cfg, run_dir, events_conn, stop_event, port, addr=None, listener=None) -> None:
    """Started once per local rank by the supervisor (multiprocessing, spawn); `addr` is where the
    rendezvous store listens (loopback on one node), else nodes.master_addr; local rank 0 of node 0
    gets the store's `listener` and serves it; `events_conn` is the write end of this rank's own
    event pipe (PipeReporter). `cfg` is the supervisor's RunConfig itself, validated where the run
    was made: not judged again here, but for what differs on this host (train_rank: for_host)."""
    # No rank_report all-gather under the supervisor: each rank's own step events carry its figures
    # and reach node 0 through the node link (engine/nodes), with no collective in the way. (Under
    # torchrun no supervisor streams: there the gather stays, at well under 0.01 % of the step time.)
    cfg.train.report_every_s = 0
    nproc, world = nproc_per_node(cfg), world_size(cfg)
    rank = cfg.nodes.node_rank * nproc + local_rank
    run_dir = Path(run_dir)
    rd = RunDir(run_dir)
    _redirect_output(rd.rank_log(rank))
    stacks.install(rd.stacks_path(rank))  # `torchdeck stacks` and the watchdog ask for them
    # Ctrl-C and a closed terminal reach the supervisor, which stops the ranks in step.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    _die_with_parent()
    os.environ.update(MASTER_ADDR=addr or cfg.nodes.master_addr, MASTER_PORT=str(port), RANK=str(rank),
                      LOCAL_RANK=str(local_rank), WORLD_SIZE=str(world),
                      LOCAL_WORLD_SIZE=str(nproc), GROUP_RANK=str(cfg.nodes.node_rank))
    global REPORTER
    emit = REPORTER = PipeReporter(events_conn, rank)
    try:
        if train_rank(RankJob(cfg, run_dir, rank, local_rank, world, listener=listener), emit, stop_event.is_set):
            rd.stop_path.touch()  # stopped (maybe asked on another node): the run is 'stopped'
    except BaseException as exc:
        error_event(emit, rank, exc)
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        raise
    _fast_exit()


def _fast_exit() -> None:
    """Done and clean: skip the interpreter teardown (with torch loaded, 1-2 s per rank) once the
    data-loader workers are gone (every event is in the pipe already: each send is one write)."""
    import gc

    gc.collect()  # finalizes data-loader iterators, which shut their worker processes down
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


# ----------------------------------------------------------------------------- torchrun entry


def _open_torchrun_run(cfg, rd, emit, world: int, local_world: int, node_rank: int,
                       launcher: str = "torchrun") -> None:
    """Local rank 0 makes the node's run directory look like one the supervisor writes (config,
    run_started), so `torchdeck attach DIR`, `torchdeck runs` and the app can open it."""
    from . import config as cfgmod
    from .strategies import get_strategy

    write_atomic(rd.launcher_pid_path, f"{os.getppid()}\n")  # torchrun's agent: the run is live while it is
    mine = cfg.copy()
    mine.nodes.node_rank = node_rank
    mine.nodes.num_nodes = max(1, world // max(1, local_world))
    cfgmod.save(mine, rd.config_path)
    strategy = get_strategy(cfg.strategy)
    emit("run_started", rank=None, run=rd.name, strategy=cfg.strategy, world_size=world,
         nproc_per_node=local_world, node_rank=node_rank, num_nodes=mine.nodes.num_nodes,
         global_batch=cfg.train.batch_size * world * cfg.train.grad_accum,
         devices=[", ".join(strategy.local_devices(cfg, i)) for i in range(local_world)],
         master_addr=os.environ.get("MASTER_ADDR"), master_port=int(os.environ.get("MASTER_PORT", 0) or 0),
         pid=os.getppid(), host=socket.gethostname(),
         threads_per_rank=threads_for(cfg, local_world), launcher=launcher,
         **preflight.length(cfg, shards=world if strategy.distributed else 1).fields())


def _close_torchrun_run(rd, emit, status: Status, started: float) -> None:
    """Local rank 0 records how the node's share ended; the root cause is the earliest error
    any rank of this node reported (later ones are usually peers losing their connection)."""
    cause = None
    if status is Status.FAILED:
        errors = sorted((e for e in events.iter_events(rd.events_path) if e.get("kind") == "error"),
                        key=lambda e: e.get("t", 0))
        if errors:
            e = errors[0]
            cause = f"rank {e.get('rank')} ({e.get('host')}): {e.get('exception')}: {e.get('message')}"
    rd.write_final(status, cause, [], round(time.time() - started, 3), emit=emit.write_event)


def main(argv=None) -> int:
    """torchrun-compatible: `torchrun --nproc-per-node 2 -m torchdeck.engine.worker CONFIG.yaml --run-dir DIR`.

    Every rank of a node appends to DIR/events.jsonl; local rank 0 also writes DIR/config.yaml
    (with this node's rank), run_started, and at the end run_finished and status.json."""
    from .preflight import load

    ap = argparse.ArgumentParser(prog="python -m torchdeck.engine.worker")
    ap.add_argument("config")
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--resume", metavar="latest|PATH", help="checkpoint.resume for this launch (a requeued SLURM job)")
    args = ap.parse_args(argv)
    cfg = load(args.config)  # no supervisor here: each rank is where the config enters, judged in full
    if args.resume:
        cfg.checkpoint.resume = args.resume
    env = os.environ
    rank = int(env.get("RANK", 0))
    local_rank = int(env.get("LOCAL_RANK", 0))
    world = int(env.get("WORLD_SIZE", 1))
    # DeepSpeed's launcher (torchdeck export --deepspeed) says LOCAL_SIZE and CROSS_RANK where
    # torchrun says LOCAL_WORLD_SIZE and GROUP_RANK
    launcher = "deepspeed" if "CROSS_RANK" in env else "torchrun"
    local_world = int(env.get("LOCAL_WORLD_SIZE") or env.get("LOCAL_SIZE") or 1)
    node_rank = int(env.get("GROUP_RANK") or env.get("CROSS_RANK") or cfg.nodes.node_rank)
    if launcher == "deepspeed" and cfg.accelerator == "cuda":
        cfg.devices = list(range(local_world))  # it made exactly the --include'd GPUs visible, in order
    started = time.time()
    rd = RunDir(Path(args.run_dir))
    rd.path.mkdir(parents=True, exist_ok=True)
    emit = FileReporter(rd.events_path, rank)
    if rank == 0:  # no `torchdeck run` prints this run: rank 0 says what it writes, as that would
        from .runs.progress import echo_events

        echo_events(emit)
    stacks.install(rd.stacks_path(rank))
    from .strategies import get_strategy

    notes = get_strategy(cfg.strategy).resolve(cfg, rd.path if local_rank == 0 else None)  # deepspeed's ds_config
    if local_rank == 0:  # before the rendezvous, so run_started comes before any rank_ready
        _open_torchrun_run(cfg, rd, emit, world, local_world, node_rank, launcher)
        for level, message in notes:
            emit("log", rank=None, level=level, message=message)
    try:
        stopped = train_rank(RankJob(cfg, rd.path, rank, local_rank, world, local_world, node_rank), emit,
                             rd.stop_path.exists)
    except BaseException as exc:
        error_event(emit, rank, exc)
        if local_rank == 0:
            _close_torchrun_run(rd, emit, Status.FAILED, started)
        raise
    if local_rank == 0:
        status = (Status.PREEMPTED if rd.preempt_path.exists() else Status.STOPPED) if stopped else Status.FINISHED
        _close_torchrun_run(rd, emit, status, started)
    return 0


if __name__ == "__main__":
    code = main()
    # Done and clean: skip the interpreter teardown, as supervised ranks do. Besides saving 1-2 s,
    # it avoids an occasional abort ("terminate called without an active exception") while the
    # client of torchrun's store is torn down, which fails the node and leaves the other nodes'
    # agents waiting in their exit barrier.
    import gc

    gc.collect()  # finalizes data-loader iterators, which shut their worker processes down
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
