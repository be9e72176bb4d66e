"""The local ranks of a script run (`torchdeck launch`), supervisor side: each rank a child
process running the shim around the user's script (or, for no_python, the executable itself),
with its own event pipe, and a reader thread that hands the ranks' events to the supervisor's
EventWriter.

ScriptProcess has the part of multiprocessing.Process's interface the supervisor's join, stop,
kill and stacks code uses (pid, sentinel, exitcode, is_alive, join, terminate, kill), so a script
run is joined and stopped by the same code as torchdeck's own ranks. Its sentinel is a Linux
pidfd (os.pidfd_open): readable once the process has exited.

Each rank leads a process group of its own (in the supervisor's session, so `torchdeck kill`
still finds it): terminate() sends SIGTERM to the rank alone (its handler may checkpoint; a
script that starts processes itself passes the stop on as it likes), kill() sends SIGKILL to
the rank's whole tree: its descendants (psutil) and whatever is left in its process group
(children of a rank that is already gone: mp.spawn's, when SIGTERM ended their parent).
Stdlib and psutil.
"""
from __future__ import annotations

import os
import selectors
import signal
import socket
import subprocess
import threading

from .. import events
from ..runs.layout import RunDir
from . import env as rank_env_mod
from . import shim_argv

READ_CHUNK = 1 << 16


class ScriptProcess:
    """One rank: a subprocess.Popen with a pidfd sentinel."""

    def __init__(self, popen: subprocess.Popen, local_rank: int):
        self.popen = popen
        self.pid = popen.pid
        self.name = f"rank{local_rank}"
        self.sentinel = os.pidfd_open(popen.pid)

    @property
    def exitcode(self) -> int | None:
        """None while it runs; its exit code, or -N after signal N (multiprocessing's convention)."""
        return self.popen.poll()

    def is_alive(self) -> bool:
        return self.popen.poll() is None

    def join(self, timeout: float | None = None) -> None:
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            pass

    def terminate(self) -> None:
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL to the rank and its whole tree (those that left its process group too)."""
        for p in self.tree():
            try:
                p.kill()
            except Exception:  # noqa: BLE001 - gone, or not ours to kill
                pass
        self._signal(signal.SIGKILL)
        self.kill_group()

    def tree(self) -> list:
        """The rank's live descendants (psutil.Process), while the rank lives."""
        import psutil

        try:
            return psutil.Process(self.pid).children(recursive=True) if self.is_alive() else []
        except psutil.Error:
            return []

    def kill_group(self) -> None:
        """SIGKILL to whatever is left in the rank's process group (its orphaned children)."""
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except OSError:
            pass  # nobody left in it

    def _signal(self, sig) -> None:
        if self.popen.poll() is None:
            try:
                self.popen.send_signal(sig)
            except OSError:
                pass

    def close(self) -> None:
        try:
            os.close(self.sentinel)
        except OSError:
            pass


class _Stopper:
    """What a stop request does to a script run's ranks (the spawn path's stop_event.set()):
    SIGTERM to each rank that still runs."""

    def __init__(self, ranks: "ScriptRanks"):
        self.ranks = ranks
        self._set = False

    def set(self) -> None:
        self._set = True
        for p in self.ranks.processes:
            p.terminate()

    def is_set(self) -> bool:
        return self._set


class EventReader(threading.Thread):
    """Reads every rank's pipe (selectors) and hands each event line to `put` (the EventWriter's
    queue). A pipe's end (its rank and every child holding it gone) is not an error; stop() ends
    the thread after reading what is already in the pipes (a child that outlived its rank may
    hold a write end open forever)."""

    def __init__(self, fds: dict, put, host: str | None = None, node_rank: int = 0):
        super().__init__(name="rank-events", daemon=True)
        self.put = put
        self.host = host or socket.gethostname()
        self.node_rank = node_rank
        self.sel = selectors.DefaultSelector()
        self.buffers: dict[int, bytes] = {}
        self.lines = 0
        self.refused = 0  # lines that were not events
        for fd in fds:
            os.set_blocking(fd, False)
            self.sel.register(fd, selectors.EVENT_READ)
            self.buffers[fd] = b""
        self._ending = threading.Event()

    def run(self) -> None:
        while self.buffers:
            ending = self._ending.is_set()
            ready = self.sel.select(timeout=0 if ending else 0.2)
            if ending and not ready:
                break
            for key, _ in ready:
                self._read(key.fd)
        for fd in list(self.buffers):
            self._close(fd)

    def _read(self, fd: int) -> None:
        try:
            chunk = os.read(fd, READ_CHUNK)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:  # every writer gone
            self._close(fd)
            return
        data = self.buffers[fd] + chunk
        *lines, self.buffers[fd] = data.split(b"\n")
        for line in lines:
            if line.strip():
                self._hand_on(line)

    def _hand_on(self, line: bytes) -> None:
        ev = events.parse(line)
        if ev is None or not isinstance(ev.get("kind"), str):
            self.refused += 1
            return
        if ev["kind"] in ("rank_ready", "error"):
            ev.setdefault("host", self.host)  # the engine's ranks say where they run in these
        self.lines += 1
        self.put(events.dumps(ev))

    def _close(self, fd: int) -> None:
        self.buffers.pop(fd, None)  # a partial last line: a writer killed mid-line; lines are atomic
        try:
            self.sel.unregister(fd)
        except (KeyError, ValueError):
            pass
        try:
            os.close(fd)
        except OSError:
            pass

    def stop(self, timeout: float = 5.0) -> None:
        self._ending.set()
        self.join(timeout)


class ScriptRanks:
    """The node's ranks of a script run (the supervisor's Ranks for spawned ones)."""

    def __init__(self, processes: list, reader: EventReader):
        self.processes = processes
        self.reader = reader
        self.stop_event = _Stopper(self)

    def finish(self) -> None:
        """After the ranks are gone: kill what they left behind in their process groups, read
        what is left in the pipes."""
        for p in self.processes:
            p.kill_group()
        self.reader.stop()
        for p in self.processes:
            p.close()


def command(script) -> list[str]:
    """The command line of a rank, as the user would read it (run_started's `command`)."""
    if script.no_python:
        return [script.path, *script.args]
    if script.module:
        return ["python", "-m", script.module, *script.args]
    return ["python", script.path, *script.args]


def argv(script) -> list[str]:
    """What a rank process is started with: the shim around the script or module, or for
    no_python the executable itself (no shim: no step hook, error capture or stacks)."""
    if script.no_python:
        return [script.path, *map(str, script.args)]
    if script.module:
        return shim_argv(script.module, list(map(str, script.args)), module=True)
    return shim_argv(script.path, list(map(str, script.args)))


def start(script, plan: "rank_env_mod.NodePlan", put) -> ScriptRanks:
    """Start the node's ranks (stdout/stderr to RunDir.rank_log(rank), cwd script.cwd) and the
    reader of their pipes, which hands each event line to `put`."""
    rd = RunDir(plan.run_dir)
    cmd = argv(script)
    cwd = script.cwd or None
    processes, read_ends = [], []
    try:
        for local in range(plan.nproc):
            rank = plan.node_rank * plan.nproc + local
            r, w = os.pipe()
            read_ends.append(r)
            try:
                env = rank_env_mod.rank_env(plan, local, None if script.no_python else w)
                with open(rd.rank_log(rank), "ab") as log:
                    popen = subprocess.Popen(cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                             stderr=subprocess.STDOUT, pass_fds=(w,), process_group=0)
            finally:
                os.close(w)  # the rank holds its own copy: EOF once it (and its children) are gone
            processes.append(ScriptProcess(popen, local))
    except BaseException:
        for p in processes:
            p.kill()
        for r in read_ends:
            os.close(r)
        raise
    reader = EventReader(read_ends, put, node_rank=plan.node_rank)
    reader.start()
    return ScriptRanks(processes, reader)
