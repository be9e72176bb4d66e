"""The supervisor: one process per node and run that starts the ranks, drains their events into
events.jsonl, turns stop requests into a graceful stop, and stops every rank when one fails.

    python -m torchdeck.engine.supervisor RUN_DIR      (the launcher redirects its output to supervisor.log)
    supervise(run_dir) -> exit code          (in-process, for tests)

While it lives it holds a small `.reserve` file in the run directory, released when the run ends,
so that a disk that filled up during the run still has room for status.json.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import multiprocessing
import os
import queue as queue_mod
import signal
import socket
import sys
import threading
import time
from multiprocessing import connection as mp_connection
from pathlib import Path

from . import events, network, strategies, usercode
from .config import resolve_all_gpus
from .errors import TorchdeckError
from .losses import said as loss_said
from .rundir import stacks
from .rundir.layout import RunDir
from .kinds import kind_of
from .rundir.status import Status
from .runs.view import RunView
from .preflight import length, load
from .metrics import KINDS as METRIC_KINDS
from .strategies import get_strategy

FLUSH_GAP_S = 0.05  # events.jsonl is flushed once per burst of lines, and at most this often
IDLE_POLL_S = 1.0  # the writer's wait for a line with nothing to flush (stop() wakes it)
_WAKE = object()  # stop()'s wake-up marker in an in-process queue
DRAIN_POLL_S = 0.2  # once the ranks are gone: an empty queue for this long is drained
POLL_S = 0.5
STOP_GRACE_S = 30.0
SLOW_DUMP_EVERY_S = 60.0  # at most one stacks dump a minute for slow steps (a stale rank: always)
RESERVE_BYTES = 64 << 10
FAIL_GRACE_S = 2.0
SIGNAL_COALESCE_S = 0.5
NODE_DRAIN_S = 3.0  # node 0, its ranks gone: how long it waits for the other nodes' last events
TAIL_BYTES = 16 << 10  # what is read of a failed rank's log for its last lines (a log may be huge)
TAIL_LINES = 8


# ----------------------------------------------------------------------------- events file


class EventWriter(threading.Thread):
    """Drains the ranks' queue continuously (a full pipe would block them) into events.jsonl."""

    def __init__(self, path: Path, q):
        super().__init__(name="event-writer", daemon=True)
        self.path, self.q = path, q
        self.fh = open(path, "a", buffering=1 << 20)
        self.lock = threading.Lock()
        self.errors: list[dict] = []
        self.done = threading.Event()
        self._ending = threading.Event()  # stop(): drain what is there, then end
        self.count = 0  # lines taken
        self.flushes = 0
        self._unflushed = 0  # lines written since the last flush
        self.write_error: OSError | None = None  # disk full / file gone: keep draining, report it
        self.view = RunView()  # the ranks as a front end sees them: the watchdog asks it who is stale
        self.metrics = None  # engine.metrics.MetricsSink: metrics.csv (and TensorBoard) fed as events come

    def _guarded(self, fn, *args) -> None:
        with self.lock:
            if self.write_error is not None:
                return
            try:
                fn(*args)
            except OSError as exc:
                self.write_error = exc

    def _to_metrics(self, method: str, *args) -> None:
        """metrics.csv is a copy for other tools: a failing write ends it, never the run."""
        if self.metrics is None:
            return
        try:
            getattr(self.metrics, method)(*args)
        except (OSError, ValueError):  # disk full, or closed after an earlier failure
            self.metrics = None

    def write(self, ev: dict) -> None:
        """Supervisor's own events go straight to the file (under the same lock)."""
        self._guarded(self._write_flush, events.dumps(ev) + "\n")

    def _write_flush(self, text: str) -> None:
        self.fh.write(text)
        self.fh.flush()

    def take(self, line: str) -> None:
        """One line from the ranks, written now in the caller's thread (the ranks' reader: no
        hop to the writer thread, which would cost a thread wake-up per round of lines); the
        caller flushes when its round is done (flush_taken). Lines taken and not flushed by
        their caller are flushed by the writer thread within IDLE_POLL_S."""
        self._take(line)

    def _take(self, line: str) -> None:
        """Parsed once, for the errors, the watchdog's view and metrics.csv; written as it came
        (a line that is not an event too: it was sent)."""
        ev = events.parse(line) if line.startswith("{") else None
        kind = ev.get("kind") if ev is not None else None
        with self.lock:
            self.count += 1
            if kind is not None:
                if kind == "error":
                    self.errors.append(ev)
                self.view.feed(ev)
            if self.write_error is None:
                try:
                    self.fh.write(line + "\n")
                    self._unflushed += 1
                except OSError as exc:
                    self.write_error = exc
            if kind in METRIC_KINDS:
                self._to_metrics("add", ev)

    def flush_taken(self) -> None:
        """Flush what was written since the last flush (events.jsonl and metrics.csv), if anything."""
        with self.lock:
            if not self._unflushed:
                return
            self._unflushed = 0
            self.flushes += 1
            if self.write_error is None:
                try:
                    self.fh.flush()
                except OSError as exc:
                    self.write_error = exc
            self._to_metrics("flush")

    def stale(self, now: float) -> list:
        """(rank, seconds silent) of the ranks the run's own rule calls stale (engine/runs/view.py)."""
        with self.lock:
            return [(r.rank, now - r.last_seen) for r in self.view.stale_ranks(now)]

    def slow(self, now: float) -> list:
        """(rank, seconds in its step window, median window) of the ranks the run's rule calls slow."""
        with self.lock:
            return [(r.rank, took, med) for r, took, med in self.view.slow_ranks(now)]

    def run(self) -> None:
        """The lines put into the queue (other nodes' events, tests): every line waiting is
        written, then the file is flushed once, so a follower (attach, the Monitor) sees an event
        as soon as the writer has it, with at most one flush every FLUSH_GAP_S. This node's ranks'
        lines come through take() instead, in the reader's rounds (engine/launch/ranks.py)."""
        in_process = isinstance(self.q, queue_mod.Queue)  # stop() can wake it (see stop)
        idle = IDLE_POLL_S if in_process else DRAIN_POLL_S
        last_flush, due = float("-inf"), None  # due: when what is written gets flushed; None: nothing waits
        while True:
            ending = self._ending.is_set()
            if due is not None:
                timeout = max(0.0, due - time.monotonic())
            else:
                timeout = DRAIN_POLL_S if ending else idle
            try:
                ev = self.q.get(timeout=timeout)
                n = 0
                while ev is not None:
                    if ev is not _WAKE:
                        # Ranks send events already serialized: the one writer thread only writes lines.
                        self._take(ev if isinstance(ev, str) else events.dumps(ev))
                        n += 1
                        if due is None:
                            due = max(time.monotonic(), last_flush + FLUSH_GAP_S)
                        elif n % 256 == 0 and time.monotonic() >= due:
                            break  # a flood that never lets the queue empty is flushed all the same
                    ev = self.q.get_nowait()
            except queue_mod.Empty:
                if (ending or (in_process and self._ending.is_set())) and due is None:
                    break  # the ranks are gone and the queue is empty
            except (EOFError, OSError):
                break
            now = time.monotonic()
            if (due is not None and now >= due) or (due is None and self._unflushed):  # the latter: take()n lines
                self.flush_taken()
                last_flush, due = now, None
        self.flush_taken()
        self._guarded(self.fh.flush)
        self.done.set()

    def stop(self, timeout: float = 5.0) -> None:
        """Drain what is left in the queue, then end the thread (the file stays open).

        Never by putting an end marker into a multiprocessing queue: a rank SIGKILLed while
        sending an event (the OOM killer) keeps its cross-process write lock forever, so the
        marker never went out, and at exit multiprocessing joined the thread feeding it: the
        supervisor hung after writing the run's final status, for good. An in-process
        queue.Queue (what the supervisor uses: other nodes' events come through it) has no such
        lock: a wake-up marker there ends the wait at once, so the writer can wait long between
        lines."""
        self._ending.set()
        if isinstance(self.q, queue_mod.Queue):
            self.q.put(_WAKE)
        if self.ident is not None:
            self.join(timeout)

    def close(self) -> None:
        self._guarded(self.fh.flush)
        self._to_metrics("close")
        try:
            self.fh.close()
        except OSError:
            pass


# ----------------------------------------------------------------------------- ports


def port_in_use(port: int, host: str = "") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


class PortError(TorchdeckError, RuntimeError):
    """The master port cannot be had (multi-node runs never move it silently)."""


def choose_port(cfg) -> tuple[int, str | None]:
    """(port, message): single node picks a free one when needed; multi-node never silently moves."""
    n = cfg.nodes
    if n.num_nodes > 1:
        if n.node_rank == 0 and port_in_use(n.master_port):
            raise PortError(f"nodes.master_port {n.master_port} is in use on this host (node 0); free it "
                            "(a leftover run?) or pick another port on every node")
        return n.master_port, None
    if n.master_port == 0:
        p = free_port()
        return p, f"master port: free port {p} (master_port 0)"
    if port_in_use(n.master_port):
        p = free_port()
        return p, f"port {n.master_port} in use; using {p}"
    return n.master_port, None


def meeting_point(cfg, port: int) -> tuple[str, int, bool]:
    """(host, port, fixed) where the ranks meet: nodes.master_addr and the chosen port for env://,
    or what a tcp:// init method names (fixed: the port may not move to a free one)."""
    if cfg.init_method.startswith("tcp://"):
        host, _, p = cfg.init_method[len("tcp://"):].rpartition(":")
        return host, int(p), True
    return cfg.nodes.master_addr, port, cfg.nodes.num_nodes > 1


@dataclasses.dataclass
class StoreSocket:
    """The rendezvous store's listening socket, bound by the supervisor before any torch import
    and handed to local rank 0, which serves the store on it (engine/worker.py serve_store)."""

    sock: socket.socket
    connect: str  # the address the serving rank's own client uses
    meet: str  # the address the ranks are told (MASTER_ADDR)
    port: int


def bind_store(cfg, port: int, msg: str | None) -> tuple[StoreSocket, str | None]:
    """Bind the rendezvous store's socket now, so the port is held from the moment it is chosen:
    no other run can take it while the ranks import torch. It listens only where the ranks need
    it (engine/network.py): loopback on one node, so the ranks are sent there whatever
    nodes.master_addr says; TCPStore itself would bind every interface, so it is handed this one
    (master_listen_fd). Returns it and the message for the log."""
    n = cfg.nodes
    host, port, fixed = meeting_point(cfg, port)
    ours = cfg.init_method == "env://"
    bind, connect, note = network.store_address(host, n.num_nodes, n.ifname, ours=ours)
    try:
        sock = network.listener(bind, port)
    except OSError as exc:
        if fixed or not network.address_in_use(exc):
            raise PortError(_port_problem(cfg, port, bind, exc)) from exc
        sock = network.listener(bind, 0)
        msg = f"port {port} in use; using {sock.getsockname()[1]}"
    if note:
        msg = f"{msg}; {note}" if msg else note
    port = sock.getsockname()[1]
    return StoreSocket(sock, connect, connect if n.num_nodes == 1 and ours else host, port), msg


def _port_problem(cfg, port: int, bind: str, exc: OSError) -> str:
    where = "init_method's port" if cfg.init_method.startswith("tcp://") else "nodes.master_port"
    if network.address_in_use(exc):
        return (f"{where} {port} is in use on this host (node 0); free it (a leftover run?) or pick "
                f"another port" + (" on every node" if cfg.nodes.num_nodes > 1 else ""))
    return f"{where} {port}: cannot listen on {bind or 'every interface'}: {exc.strerror or exc}"


# ----------------------------------------------------------------------------- supervisor


def _say(level: str, message: str) -> None:
    """A line in supervisor.log (this process's output), never raising (a full disk)."""
    try:
        print(f"{level}: {message}", flush=True)
    except OSError:
        pass


@dataclasses.dataclass
class _Plan:
    """What the supervisor decided before starting the ranks (Supervisor._plan)."""

    port: int
    port_msg: str | None
    notes: list
    threads: int
    child_env: dict
    store: StoreSocket | None
    meet: str


@dataclasses.dataclass
class Ranks:
    """The node's rank processes (what torch's ProcessContext holds; the supervisor joins them itself).
    A script run's ranks are engine.launch.ranks.ScriptRanks, with the same interface."""

    processes: list
    reader: object = None  # engine.launch.ranks.EventReader of the ranks' pipes

    def finish(self) -> None:
        """After the ranks are gone: read what is left in their pipes (a script run's ranks also
        clean up their trees here)."""
        if self.reader is not None:
            self.reader.stop()


@contextlib.contextmanager
def _environ(values: dict):
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _signal_text(exitcode: int | None) -> str | None:
    if exitcode is None or exitcode >= 0:
        return None
    try:
        return signal.Signals(-exitcode).name
    except ValueError:
        return f"signal {-exitcode}"


def _exit_said(rank: int, code: int | None) -> str:
    if code is not None and code < 0:
        return f"rank {rank} killed by signal {-code} ({_signal_text(code)})"
    return f"rank {rank} exited with code {code}"


def log_tail(path, lines: int = TAIL_LINES, limit: int = TAIL_BYTES) -> list[str]:
    """The last non-blank lines of a rank's log, from its last `limit` bytes only."""
    try:
        with open(path, "rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            fh.seek(max(0, size - limit))
            data = fh.read(limit)
    except OSError:
        return []
    out = data.decode("utf-8", "replace").splitlines()
    if size > limit:
        out = out[1:]  # cut mid-line
    return [ln.rstrip() for ln in out if ln.strip()][-lines:]


def _cannot_write(path, exc: OSError) -> str:
    """Disk full, over quota, too large: one line with the file, the reason and the fix."""
    from .checkpoint import disk_hint

    return f"cannot write {path}: {exc.strerror or exc}: {disk_hint(exc.errno)}"


def _is_timeout(err: dict) -> bool:
    """A collective or rendezvous that gave up waiting (gloo: "Timed out waiting 5000ms ...")."""
    if err.get("exception") == "RendezvousError":  # already says where and what to check (worker.py)
        return False
    text = f"{err.get('exception')} {err.get('message')}".lower()
    return "timed out" in text or "timeout" in text


def _timeout_cause(err: dict, timeout_s, stuck: list[int], where: dict | None = None) -> str:
    """Name the setting that ended the wait, and the ranks that never arrived and where they were
    (`where`: rank -> place, from the stacks taken before they were stopped): a user sees a
    timeout on rank 0, but the problem is usually the rank that stopped reporting."""
    limit = f"nodes.timeout_s={timeout_s} s" if timeout_s else "nodes.timeout_s"
    where = where or {}
    places = "; ".join(f"rank {r} was in {where[r]}" for r in stuck if r in where)
    who = (f"; rank{'s' if len(stuck) > 1 else ''} {', '.join(map(str, stuck))} sent no error and had to "
           f"be stopped: the likely hang (see {', '.join(f'rank{r}.log' for r in stuck)}"
           + (f"; {places}" if places else "") + ")") if stuck else ""
    return (f"rank {err.get('rank')} ({err.get('host')}): a collective timed out after {limit} waiting for "
            f"the other ranks{who}; raise nodes.timeout_s if a step can legitimately take that long "
            f"[{err.get('exception')}: {err.get('message')}]")


def _raised_at(tb) -> str | None:
    """'train.py:23 in step' of the innermost frame of a traceback's text (the line that raised)."""
    import re

    frames = re.findall(r'File "([^"]+)", line (\d+), in (\S+)', tb) if isinstance(tb, str) else []
    if not frames:
        return None
    file, line, func = frames[-1]
    return f"{file}:{line} in {func}"


def lone_node_warning(cfg) -> str | None:
    """Several nodes meeting at a loopback address (torchrun's default 127.0.0.1): node 0 waits
    for nodes that on other machines can never reach it, silently until nodes.timeout_s, so say
    so at the start (several nodes on one host is a fair rehearsal: a warning, not a refusal)."""
    from .preflight import _is_loopback

    n = cfg.nodes
    if n.num_nodes <= 1:
        return None
    if cfg.init_method.startswith("tcp://"):
        what, host = "init_method", cfg.init_method[len("tcp://"):].rpartition(":")[0]
    elif cfg.init_method.startswith("env://"):
        what, host = "master address", n.master_addr
    else:
        return None
    if not _is_loopback(host):
        return None
    others = "the other node" if n.num_nodes == 2 else f"the other {n.num_nodes - 1} nodes"
    return (f"{what} {host.strip()} is this host itself: {others} must reach node 0 there, so only nodes "
            f"on this host can join; on other machines give every node node 0's network address "
            f"(--master-addr HOST, nodes.master_addr). The ranks wait at the rendezvous until all "
            f"{n.num_nodes} nodes have come")


def _kind_fields(cfg) -> dict:
    """run_started's fields that depend on what the ranks run: the run's length for our loop; for
    a user's script, kind "script" and its command line (the length is the script's to know)."""
    kind = kind_of(cfg)
    if kind.loop_config:
        return {**length(cfg).fields(), "loss": loss_said(cfg.train.loss)}  # total_steps, epochs, end_epoch, ends_by; train.loss
    from .launch.ranks import command

    return {"run_kind": kind.name, "command": command(cfg.script), "total_steps": None, "epochs": None,
            "end_epoch": None, "ends_by": None, "steps_per_epoch": None}


def _pick_free_gpus(cfg) -> list:
    """devices: free:N still unresolved (a config written before launch): pick the GPUs now, or
    refuse with who uses what (ConfigError)."""
    from .config import ConfigError, free_gpus_asked
    from .hardware import detect_hardware, resolve_free_gpus

    if cfg.accelerator != "cuda" or free_gpus_asked(cfg.devices) is None:
        return []
    hw, problems = detect_hardware(), []
    resolve_free_gpus(cfg, hw, problems)
    if problems:
        raise ConfigError(problems)
    return [("info", n) for n in hw.notes]


def _open_metrics(writer: EventWriter, cfg, rd: RunDir) -> str | None:
    """metrics.csv beside events.jsonl (and TensorBoard when asked); the line to log, if any."""
    from .metrics import MetricsSink

    try:
        writer.metrics = MetricsSink(rd.metrics_path, rd.tensorboard_dir if cfg.logging.tensorboard else None)
    except OSError as exc:
        return f"metrics.csv not written: {_cannot_write(rd.metrics_path, exc)}"
    if writer.metrics.note:
        print(writer.metrics.note, flush=True)
    return writer.metrics.note


class Supervisor:
    def __init__(self, run_dir):
        self.rd = RunDir(Path(run_dir))
        self.stop_requests = 0
        self._signal_t = float("-inf")  # the last stop signal (request_stop)
        self.first_stop_t: float | None = None
        self.started = time.time()
        self.writer_errors: list[dict] = []
        self.write_failure: str | None = None
        self.timeout_s: int | None = None
        self.base = 0  # global rank of this node's local rank 0
        self.where: dict = {}  # rank -> where its stacks last showed it (the newest dump)
        self._dump_lock = threading.Lock()
        self._stall_dumped = False  # one dump per stall: re-armed once no rank is stale
        self._slow_dumped_t = float("-inf")
        self.script = False  # strategy script: the user's own script (torchdeck launch)
        self.stop_grace_s = STOP_GRACE_S  # a stop's SIGKILL comes this long after it (script.stop_grace_s)
        self.failed_local_rank: int | None = None  # the local rank _root_cause blames (status.json, run_finished)
        self.quote: tuple | None = None  # (local rank, exit code, last lines of its log): _quoted
        self.writer: EventWriter | None = None
        self.sender = None  # engine.nodes.link.Sender: a non-zero node streaming to node 0
        self.receiver = None  # engine.nodes.link.Receiver: node 0, hearing the other nodes
        self.sampler = None  # engine.nodes.sampler.NodeSampler: node_sample once a second (several nodes)

    # ---------------------------------------------------------------- stop requests
    def request_stop(self, *_):
        """SIGTERM/SIGINT: a stop; a second one (seconds later) kills. Signals within
        SIGNAL_COALESCE_S of the last are one request: one keypress or `kill` of a process group
        can deliver the same stop twice."""
        now = time.monotonic()
        if now - self._signal_t >= SIGNAL_COALESCE_S:
            self.stop_requests += 1
            self._signal_t = now

    def request_preempt(self, *_):
        """SLURM is about to preempt the job (or its time is up): stop with a checkpoint, as
        status 'preempted', so a requeued job resumes from it (`torchdeck resume`)."""
        try:
            self.rd.preempt_path.touch()
        except OSError:
            pass
        self.stop_requests = max(self.stop_requests, 1)

    def _install_signals(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        signal.signal(signal.SIGTERM, self.request_stop)
        signal.signal(signal.SIGINT, self.request_stop)
        signal.signal(signal.SIGUSR1, self.request_preempt)  # SLURM's warning (--signal=USR1@120)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # the run outlives the terminal

    def _reserve(self) -> None:
        """Hold RESERVE_BYTES of real disk in the run directory while the run lives: when the disk
        fills up, releasing it leaves room for the final status (and the log line saying why)."""
        try:
            with open(self.rd.reserve_path, "wb") as fh:
                fh.write(b"\0" * RESERVE_BYTES)
        except OSError:
            self._release_reserve()

    def _release_reserve(self) -> None:
        try:
            self.rd.reserve_path.unlink(missing_ok=True)
        except OSError:
            pass

    def _finish(self, writer, status, exit_codes, root_cause) -> int:
        self._release_reserve()
        try:
            print(f"run {status}" + (f": {root_cause}" if root_cause else ""), flush=True)
        except OSError:
            pass  # supervisor.log on the disk that is full
        first = self.failed_local_rank if status == "failed" else None
        self.rd.write_final(status, root_cause, exit_codes, round(time.time() - self.started, 3),
                            emit=writer.write if writer is not None else None,
                            **({} if first is None else {"failed_local_rank": first}))
        return 0 if Status(status).ended_well else 1

    def run(self) -> int:
        self._install_signals()
        rd = self.rd
        rd.write_pid(os.getpid())
        self._reserve()
        try:
            stacks.install(rd.stacks_path(None))
        except OSError:
            pass  # an unwritable run directory fails below, with its message
        try:
            cfg = load(rd.config_path)
            usercode.add_folders(*usercode.run_folders(rd.path))  # the user's module:callable: where it
            usercode.extend_path()  # was launched from, and its preset's folder; spawned ranks inherit sys.path
            self.timeout_s = cfg.nodes.timeout_s
            if kind_of(cfg).ranks_from_shim:
                self.script, self.stop_grace_s = True, float(cfg.script.stop_grace_s)
            plan = self._plan(cfg)
        except (TorchdeckError, OSError) as exc:  # a bad config, a taken port, a missing ds_config
            return self._finish(None, "failed", [], str(exc))
        writer = self.writer = EventWriter(rd.events_path, None)
        metrics_note = _open_metrics(writer, cfg, rd)
        if metrics_note:
            plan.notes = [*plan.notes, ("warning", metrics_note)]
        self._announce(cfg, plan, writer)
        if writer.write_error is not None:  # unwritable run directory: start nothing
            writer.close()
            if plan.store is not None:
                plan.store.sock.close()
            return self._finish(None, "failed", [],
                                f"{_cannot_write(rd.events_path, writer.write_error)}; nothing was started")
        self._link_open(cfg, plan, writer)
        try:
            ranks, stop_event = (self._start_script if self.script else self._spawn)(cfg, plan, writer)
        except OSError as exc:  # no_python: the executable cannot be run
            self._link_close(writer)
            if self.sender is not None:
                self.sender.close()
            if writer.is_alive():
                writer.stop()
            writer.close()
            return self._finish(None, "failed", [], f"cannot start the ranks: {exc}")
        for thread in (self.receiver, self.sampler):  # the writer's queue exists now
            if thread is not None:
                thread.start()
        return self._collect(ranks, stop_event, writer)

    # ---------------------------------------------------------------- node link (engine/nodes)
    def _link_open(self, cfg, plan: "_Plan", writer: EventWriter) -> None:
        """Several nodes: node 0 listens for the others' events (Receiver), each other node streams
        its own to node 0 (Sender); every node samples its GPUs and host once a second. The threads
        that need the writer's queue start once the ranks are started."""
        from . import nodes
        from .nodes import link
        from .nodes.sampler import NodeSampler

        n = cfg.nodes
        secret = os.environ.pop(nodes.ENV_SECRET, "")  # the ranks (a user's script) never see it
        if n.num_nodes <= 1:
            return
        host_name = socket.gethostname()
        meet_host, meet_port, _ = meeting_point(cfg, plan.port)
        try:
            port = int(os.environ.get(nodes.ENV_PORT) or meet_port + nodes.PORT_OFFSET)
        except ValueError:
            port = meet_port + nodes.PORT_OFFSET
        if n.node_rank == 0:
            if not secret:
                secret = self._new_secret(writer)
            bind, _, note = network.store_address(meet_host, n.num_nodes, n.ifname)
            try:
                self.receiver = link.Receiver(bind, port, secret, self._remote, log=_say, num_nodes=n.num_nodes)
            except Exception as exc:  # noqa: BLE001 - zmq.ZMQError (port taken): the run goes on without it
                writer.write(events.make("log", rank=None, level="warning", message=(
                    f"node link: cannot listen on {bind or 'every interface'}:{port} ({exc}): the other nodes' "
                    f"events stay on their nodes")))
            else:
                writer.write(events.make("log", rank=None, level="info", message=(
                    f"node link: listening on {self.receiver.endpoint} for the other nodes' events and samples"
                    + (f"; {note}" if note else ""))))
        elif not secret:
            writer.write(events.make("log", rank=None, level="warning", message=(
                f"node link: {nodes.ENV_SECRET} is not set on this node: its events stay in its own run "
                f"directory and node 0 does not show its ranks (set it to node 0's secret)")))
        else:
            self.sender = link.Sender(meet_host, port, secret, n.node_rank, host_name, log=self._link_log)
            self.sender.start()
        self.sampler = NodeSampler(self._put, n.node_rank, host_name)

    def _new_secret(self, writer: EventWriter) -> str:
        """Node 0 without a secret: one for this run, in RUN_DIR/node.key that only its owner reads."""
        import secrets

        from . import nodes

        secret = secrets.token_hex(32)
        path = self.rd.path / "node.key"
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(secret + "\n")
            said = (f"{nodes.ENV_SECRET} is not set: made one for this run in {path} (readable by you only); "
                    f"start the other nodes with {nodes.ENV_SECRET}=\"$(cat {path})\" in their environment")
        except OSError as exc:
            said = f"{nodes.ENV_SECRET} is not set and {path} cannot be written ({exc}): no other node can stream here"
        writer.write(events.make("log", rank=None, level="warning", message=f"node link: {said}"))
        return secret

    def _remote(self, line: str) -> None:
        """An event another node streamed here (Receiver's thread)."""
        self.writer.q.put(line)

    def _link_log(self, level: str, message: str) -> None:
        """What a non-zero node's Sender says (node 0 unreachable, refused, reached): in this node's events."""
        if self.writer is not None:
            self._write(self.writer, events.make("log", rank=None, level=level, message=message))

    def _link_close(self, writer: EventWriter) -> None:
        """The ranks are gone: the last samples; node 0 waits briefly for the other nodes' last events."""
        if self.sampler is not None:
            self.sampler.stop()
        if self.receiver is not None:
            if self.receiver.is_alive():
                self.receiver.wait_done(NODE_DRAIN_S)
            self.receiver.stop()
            if self.receiver.refused:
                _say("warning", f"node link: refused {self.receiver.refused} connection(s) in all")

    def _plan(self, cfg) -> "_Plan":
        """Everything decided before a rank starts: port, store socket, threads, environment.
        No torch here: the ranks start importing theirs at once, and the store they meet at is
        served by local rank 0 on the socket bound here (one torch import on the critical path)."""
        port, port_msg = choose_port(cfg)
        if cfg.accelerator == "cuda" and cfg.devices == "all":
            import torch

            from .hardware import Hardware

            resolve_all_gpus(cfg, Hardware(gpu_count=torch.cuda.device_count()))
        picked = [("info", n) for n in self.rd.origin().get("host_notes") or [] if isinstance(n, str)]
        picked += _pick_free_gpus(cfg)
        strategy = get_strategy(cfg.strategy)
        notes = picked + list(strategy.resolve(cfg, self.rd.path))  # deepspeed: the user's ds_config
        from .affinity import threads_for

        threads = threads_for(cfg, strategies.nproc_per_node(cfg))
        child_env = {"OMP_NUM_THREADS": str(threads)}
        if self.script:  # script.env's, else one exported to torchdeck, as torchrun keeps it
            from .launch.env import threads_of

            threads = threads_of(cfg.script.env, os.environ, threads)
            del child_env["OMP_NUM_THREADS"]  # the ranks' environment sets it (engine.launch.env.rank_env)
        store = None  # the store's socket, until local rank 0 has its own copy
        meet = cfg.nodes.master_addr
        # a script's rank 0 binds the port itself (init_process_group's env://): it is not held here
        if strategy.distributed and not self.script and not cfg.init_method.startswith("file://") \
                and cfg.nodes.node_rank == 0:
            store, port_msg = bind_store(cfg, port, port_msg)
            meet, port = store.meet, store.port
            child_env["TORCHELASTIC_USE_AGENT_STORE"] = "True"  # the other ranks are its clients
        if cfg.nodes.ifname:
            for var in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
                child_env[var] = os.environ.get(var, cfg.nodes.ifname)
        lone = lone_node_warning(cfg)
        if lone:
            notes = [*notes, ("warning", lone)]
        return _Plan(port, port_msg, notes, threads, child_env, store, meet)

    def _announce(self, cfg, plan: "_Plan", writer: EventWriter) -> None:
        """run_started and the supervisor's notes, written before any rank exists."""
        strategy = get_strategy(cfg.strategy)
        writer.write(events.make(
            "run_started", run=self.rd.name, strategy=cfg.strategy, world_size=strategies.world_size(cfg),
            nproc_per_node=strategies.nproc_per_node(cfg), node_rank=cfg.nodes.node_rank, num_nodes=cfg.nodes.num_nodes,
            global_batch=strategies.global_batch(cfg),
            devices=[", ".join(strategy.local_devices(cfg, i)) for i in range(strategies.nproc_per_node(cfg))],
            master_addr=cfg.nodes.master_addr, master_port=plan.port, pid=os.getpid(),
            host=socket.gethostname(), threads_per_rank=plan.threads, **_kind_fields(cfg)))
        if plan.port_msg:
            writer.write(events.make("log", rank=None, level="warning" if "in use" in plan.port_msg else "info",
                                     message=plan.port_msg))
        for level, message in plan.notes:
            writer.write(events.make("log", rank=None, level=level, message=message))

    def _start_script(self, cfg, plan: "_Plan", writer: EventWriter):
        """Start the node's ranks of a user's script: each a process of its own with its own event
        pipe, read by a thread into the writer's queue."""
        from .launch import env as launch_env
        from .launch import ranks as launch_ranks

        nproc = strategies.nproc_per_node(cfg)
        yours = "OMP_NUM_THREADS" in (cfg.script.env or {}) or bool(os.environ.get("OMP_NUM_THREADS", "").strip())
        writer.q = queue_mod.Queue()
        writer.start()
        writer.write(events.make("log", rank=None, level="info", message=(
            f"supervisor {os.getpid()}: {' '.join(launch_ranks.command(cfg.script))} x{nproc} on node "
            f"{cfg.nodes.node_rank}, {cfg.nodes.master_addr}:{plan.port}, {plan.threads} thread(s) per rank"
            + (" (your OMP_NUM_THREADS)" if yours else ""))))
        node = launch_env.plan_for(cfg, self.rd.path, nproc, plan.port, plan.threads, plan.child_env)
        self.base = cfg.nodes.node_rank * nproc
        ranks = launch_ranks.start(cfg.script, node, self._put, flush=writer.flush_taken)
        return ranks, ranks.stop_event

    def _spawn(self, cfg, plan: "_Plan", writer: EventWriter):
        """Start the node's ranks (spawn context: events are text, no torch needed to carry them),
        each with its own event pipe (worker.PipeReporter), read by one thread into the writer's
        queue, as a script run's ranks are (engine/launch/ranks.py)."""
        from .launch.ranks import EventReader
        from .worker import rank_main

        nproc = strategies.nproc_per_node(cfg)
        ctx_mp = multiprocessing.get_context("spawn")
        writer.q = queue_mod.Queue()
        stop_event = ctx_mp.Event()
        writer.start()
        writer.write(events.make("log", rank=None, level="info", message=(
            f"supervisor {os.getpid()}: {cfg.strategy} x{nproc} on node {cfg.nodes.node_rank}, port {plan.port}, "
            f"{plan.threads} thread(s) per rank")))
        cfg_dict = cfg.to_dict()
        store = plan.store
        pipes = [ctx_mp.Pipe(duplex=False) for _ in range(nproc)]  # (read end, write end) per rank
        ranks = Ranks([ctx_mp.Process(target=rank_main, name=f"rank{i}",
                                      args=(i, cfg_dict, str(self.rd.path), pipes[i][1], stop_event, plan.port,
                                            plan.meet,
                                            (store.sock, store.connect) if store is not None and i == 0 else None))
                       for i in range(nproc)])
        try:
            with _environ(plan.child_env):  # the children inherit it; this process (maybe a test) keeps its own
                for p in ranks.processes:
                    p.start()
        finally:
            fds = []
            for r, w in pipes:
                w.close()  # each rank holds its own write end: its pipe ends when it (and its children) are gone
                fds.append(os.dup(r.fileno()))  # the reader owns (and closes) its copy
                r.close()
        ranks.reader = EventReader(fds, self._put, node_rank=cfg.nodes.node_rank, flush=writer.flush_taken)
        ranks.reader.start()
        if store is not None:
            store.sock.close()  # local rank 0 holds it now
        self.base = cfg.nodes.node_rank * nproc
        return ranks, stop_event

    def _put(self, line: str) -> None:
        """A line from this node's ranks (or its sampler): into events.jsonl, and towards node 0
        when this node streams to it. Written in the caller's thread (EventWriter.take)."""
        self.writer.take(line)
        if self.sender is not None:
            self.sender.send(line)

    def _write(self, writer: EventWriter, ev: dict) -> None:
        """A supervisor event that node 0 should have too (stacks, rank exits, the link's own news)."""
        writer.write(ev)
        if self.sender is not None:
            self.sender.send(events.dumps(ev))

    def _collect(self, ranks: "Ranks", stop_event, writer: EventWriter) -> int:
        """Wait for the ranks, then record how each ended and the run's outcome."""
        try:
            died_first, reported = self._join(ranks, stop_event, writer)
        finally:  # even when the supervisor itself fails, no rank outlives it
            for p in ranks.processes:
                if p.is_alive():
                    p.kill()
                    p.join(5)
            ranks.finish()
        codes = [p.exitcode for p in ranks.processes]
        self._link_close(writer)  # the other nodes' last events, into the queue before it is drained
        writer.stop()  # every rank is gone: what they sent is in the pipe; drain it first
        self.writer_errors = writer.errors
        for i, code in enumerate(codes):
            self._write(writer, events.make("rank_exited", rank=self.base + i, exitcode=code, signal=_signal_text(code)))
        if self.sender is not None:
            self.sender.close()  # what is queued, then a bye (node 0 waits for it)
        status, cause = self._outcome(codes, died_first, self.base, reported)
        if status == "failed" and self.quote is not None:
            self._write_quote(writer, ranks)
        records = self.rd.flight_records() if status == "failed" else []
        if records:  # NCCL's watchdog dumped what each rank's last collectives were (a GPU timeout)
            cause = f"{cause}; NCCL flight recorder: {', '.join(p.name for p in records)} in {self.rd.path}"
        try:
            return self._finish(writer, status, codes, cause)
        finally:
            writer.close()

    def _write_quote(self, writer: EventWriter, ranks) -> None:
        """The failed rank's last lines as an `error` event, so every front end shows them as a
        rank's failure (the CLI's summary, attach, the Monitor), as a traceback is shown."""
        local, code, tail = self.quote
        what = f"exit code {code}" if code is not None and code >= 0 else _signal_text(code)
        self._write(writer, events.make(
            "error", rank=self.base + local, host=socket.gethostname(), pid=ranks.processes[local].pid,
            exception=what, message=tail[-1].strip(), traceback="\n".join(tail),
            source=str(self.rd.rank_log(self.base + local).name)))

    def _join(self, pctx, stop_event, writer):
        """Wait for the ranks; pass on stop requests; on the first failure stop the rest.

        A ctx.join(timeout) loop in spirit, polling the sentinels itself so that it knows which
        ranks died on their own before it terminated the others (the root cause is among them)."""
        sentinels = {p.sentinel: i for i, p in enumerate(pctx.processes)}
        while True:
            self._take_stop_requests(writer)
            if self.stop_requests and self.first_stop_t is None:
                self.first_stop_t = time.monotonic()
                stop_event.set()
                writer.write(events.make("log", rank=None, level="info", message=self._stop_said()))
            if self._stop_overdue():
                return [], self._kill_all(pctx, writer)
            self._watchdog(pctx, writer)
            failed = self._wait_step(pctx, sentinels)
            if failed:
                # Which ranks died on their own, before we terminate the rest: the root cause is among them.
                failed += [i for i, p in enumerate(pctx.processes)
                           if i not in failed and p.exitcode not in (0, None)]
                self._stacks_on_timeout(pctx, writer)
                self._terminate(pctx)
                return failed, None
            if not sentinels:
                return [], None

    def _take_stop_requests(self, writer) -> None:
        """A stop file (torchdeck stop, the app), and an events file that cannot be written (a full
        disk), count as a stop request: the ranks checkpoint and leave."""
        if self.rd.stop_path.exists() and self.stop_requests == 0:
            self.stop_requests = 1
        if writer.write_error is not None and self.write_failure is None:
            self.write_failure = _cannot_write(self.rd.events_path, writer.write_error)
            try:
                print(f"cannot write {self.rd.events_path}: stopping the run", file=sys.stderr, flush=True)
            except OSError:
                pass
            self.stop_requests = max(self.stop_requests, 1)

    def _stop_said(self) -> str:
        if self.script:
            return (f"stop requested: SIGTERM to the ranks, SIGKILL to their process trees in "
                    f"{self.stop_grace_s:g} s (a second stop: now)")
        return "stop requested: ranks finish this step, rank 0 checkpoints"

    def _stop_overdue(self) -> bool:
        return self.first_stop_t is not None and (
            self.stop_requests > 1 or time.monotonic() - self.first_stop_t > self.stop_grace_s)

    def _kill_all(self, pctx, writer) -> str:
        """A second stop request, or no exit within STOP_GRACE_S: kill every rank; returns why, the run's cause."""
        why = "second stop request" if self.stop_requests > 1 else f"no exit {self.stop_grace_s:g} s after stop"
        writer.write(events.make("log", rank=None, level="warning", message=f"{why}: killing the ranks"))
        for p in pctx.processes:
            if p.is_alive():
                p.kill()
        for p in pctx.processes:
            p.join(5)
        return f"killed after {why}"

    # ---------------------------------------------------------------- watchdog
    def dump_stacks(self, pctx, writer, reason: str, wait_s: float = stacks.WAIT_S) -> list[dict]:
        """Stacks of this node's live ranks, as a `stacks` event (and a line in supervisor.log)."""
        with self._dump_lock:
            ready = None
            if self.script:  # a script's rank says rank_ready once its dump is installed: before that
                with writer.lock:  # (python starting, the shim's imports) STACK_SIGNAL would kill it
                    ready = {st.rank for st in writer.view.rank_list() if st.pid is not None}
            targets = [(f"rank {self.base + i}", self.base + i, p.pid, self.rd.stacks_path(self.base + i))
                       for i, p in enumerate(pctx.processes)
                       if p.is_alive() and (ready is None or self.base + i in ready)]
            if not targets:
                return []
            taken = stacks.collect(targets, wait_s)
            groups = stacks.group(taken)
            self.where.update({ps.rank: ps.where for ps in taken if not ps.error})
            line = stacks.summary(groups)
            self._write(writer, events.make("stacks", rank=None, reason=reason, summary=line, groups=groups,
                                     files=[ps.file for ps in taken]))
            try:
                print(f"stacks ({reason}): {line}", flush=True)
            except OSError:
                pass
            return groups

    def _watchdog(self, pctx, writer) -> None:
        """When a rank turns stale (the rule the Monitor marks STALE by), or its step window in
        progress takes SLOW_MULTIPLE times its median (engine/runs/view.py), dump every rank's
        stacks once, in a thread (the join loop goes on); again only after every rank is back."""
        now = time.time()
        silent = writer.stale(now)
        slow = [] if silent else writer.slow(now)
        if not silent and not slow:
            self._stall_dumped = False
            return
        if self._stall_dumped or self.first_stop_t is not None:
            return
        if not silent and now - self._slow_dumped_t < SLOW_DUMP_EVERY_S:
            return  # a straggling step that recurs (a slow file system): once a minute, not each time
        self._stall_dumped = True
        ranks = sorted(r for r, *_ in silent or slow)
        who = f"rank{'s' if len(ranks) > 1 else ''} {','.join(map(str, ranks))}"
        if silent:
            reason = f"{who} silent for {max(s for _, s in silent):.0f} s"
        else:
            self._slow_dumped_t = now
            took, med = max((t, m) for _, t, m in slow)
            reason = f"{who} slow: {took:.1f} s in a step window, {took / med:.0f}x the median window ({med:.2f} s)"
        threading.Thread(target=self.dump_stacks, args=(pctx, writer, reason), name="watchdog",
                         daemon=True).start()

    def _stacks_on_timeout(self, pctx, writer) -> None:
        """A rank gave up waiting in a collective: before the others are stopped, see where the
        ones that never arrived are (they are still alive, stuck)."""
        deadline = time.monotonic() + 1.0
        while not writer.errors and time.monotonic() < deadline:
            time.sleep(0.05)  # the failed rank's error event may still be in the pipe
        if any(_is_timeout(e) for e in writer.errors) and any(p.is_alive() for p in pctx.processes):
            self.dump_stacks(pctx, writer, "a collective timed out", wait_s=2.0)

    @staticmethod
    def _wait_step(pctx, sentinels) -> list[int]:
        """One poll (what ctx.join(timeout) does, but without its cleanup, so we see who died first)."""
        ready = mp_connection.wait(list(sentinels), timeout=POLL_S)
        failed = []
        for sentinel in ready:
            i = sentinels.pop(sentinel)
            pctx.processes[i].join()
            if pctx.processes[i].exitcode != 0:
                failed.append(i)
        return failed

    @staticmethod
    def _terminate(pctx) -> None:
        """Let the others fail on their own briefly, then SIGTERM, then SIGKILL."""
        procs = pctx.processes
        for step in ("wait", "terminate", "kill"):
            if step == "terminate":
                for p in procs:
                    if p.is_alive():
                        p.terminate()
            elif step == "kill":
                for p in procs:
                    if p.is_alive():
                        p.kill()
            deadline = time.monotonic() + FAIL_GRACE_S
            for p in procs:
                p.join(max(0.0, deadline - time.monotonic()))
            if not any(p.is_alive() for p in procs):
                return

    def _outcome(self, codes, died_first, base, reported):
        """(status, cause) of the run, from the ranks' exit codes and what the supervisor saw."""
        ok = all(c == 0 for c in codes)
        # A stop asked on another node reaches our ranks through the stop agreement; they leave the stop file.
        stopping = self.first_stop_t is not None or self.rd.stop_path.exists()
        if self.write_failure:  # the ranks were stopped gracefully; say whether that went through
            return "failed", self._write_failure_cause(ok, codes)
        if ok:
            if stopping and self.rd.preempt_path.exists():
                return "preempted", "SIGUSR1: preemption or time limit warning; resume from the last checkpoint"
            return ("stopped" if stopping else "finished"), None
        if stopping and (reported or self.script):  # a script's ranks may end on the SIGTERM itself
            return "stopped", reported
        return "failed", self._root_cause(codes, died_first, base)

    def _write_failure_cause(self, ok: bool, codes) -> str:
        if ok:
            return f"{self.write_failure}; the run was stopped after a final checkpoint"
        errors = sorted(self.writer_errors, key=lambda e: e.get("t", 0))  # seen, if not written
        then = (f"rank {errors[0].get('rank')}: {errors[0].get('exception')}: {errors[0].get('message')}"
                if errors else f"the ranks exited with codes {codes} (the disk may be full for them too)")
        return f"{self.write_failure}; while stopping, {then}"

    def _root_cause(self, codes, died_first, base) -> str:
        """A rank that died by a signal on its own without reporting (the OOM killer), else the
        earliest error event (later ones are usually peers losing their connection), else the
        first rank to exit badly."""
        errors = sorted(self.writer_errors, key=lambda e: e.get("t", 0))
        reporting = {e.get("rank") for e in errors}
        for i in died_first:
            code = codes[i]
            if code is not None and code < 0 and base + i not in reporting:
                self.failed_local_rank = i
                return self._quoted(i, code)
        bad = (died_first or [i for i, c in enumerate(codes) if c != 0])[0]
        if errors:
            r = errors[0].get("rank")
            local = r - base if isinstance(r, int) and not isinstance(r, bool) else -1
            self.failed_local_rank = local if 0 <= local < len(codes) else bad
            return self._error_cause(errors[0], codes, died_first, base, reporting)
        self.failed_local_rank = bad
        return self._quoted(bad, codes[bad])

    def _quoted(self, local: int, code) -> str:
        """A rank that ended badly without an error event (argparse's exit 2, sys.exit(1), a
        crash in C): its exit, with the last line it printed (from its log: stdout and stderr),
        the tail kept for an error event (self.quote). A SIGKILL (the OOM killer, a kill) is
        quoted nowhere: what the rank printed last says nothing of it."""
        said = _exit_said(self.base + local, code)
        if code == -signal.SIGKILL:
            return said
        name = self.rd.rank_log(self.base + local).name
        tail = log_tail(self.rd.rank_log(self.base + local))
        if not tail:
            return said
        self.quote = (local, code, tail)
        return f"{said}; its last output ({name}): {tail[-1].strip()}"

    def _error_cause(self, e: dict, codes, died_first, base, reporting) -> str:
        """A timeout names the ranks that never arrived: those still running, silent, when it was stopped."""
        if not _is_timeout(e):
            at = _raised_at(e.get("traceback")) if self.script else None
            return (f"rank {e.get('rank')} ({e.get('host')}): {e.get('exception')}: {e.get('message')}"
                    + (f" (at {at})" if at else ""))
        stuck = [base + i for i, c in enumerate(codes) if c != 0 and i not in died_first and base + i not in reporting]
        return _timeout_cause(e, self.timeout_s, stuck, self.where)

def supervise(run_dir) -> int:
    """Run to the end; whatever goes wrong in the supervisor itself still ends in a status."""
    sup = Supervisor(run_dir)
    try:
        return sup.run()
    except Exception as exc:  # unwritable run dir, disk full, a broken install...
        import traceback

        cause = f"supervisor: {type(exc).__name__}: {exc}"
        sup._release_reserve()
        try:
            traceback.print_exc()
            print(f"run failed: {cause}", file=sys.stderr, flush=True)
        except OSError:
            pass
        try:
            sup.rd.write_final("failed", cause, [], round(time.time() - sup.started, 3))
        except OSError:
            pass
        return 1


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m torchdeck.engine.supervisor RUN_DIR", file=sys.stderr)
        return 2
    return supervise(argv[0])


if __name__ == "__main__":
    sys.exit(main())
