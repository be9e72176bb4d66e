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
import re
import selectors
import signal
import socket
import subprocess
import threading
import time

from .. import events
from ..rundir.layout import RunDir
from . import env as rank_env_mod
from . import shim_argv

READ_CHUNK = 1 << 16
READ_EVERY_S = 0.1  # after a read, wait this long before the next: lines gather, one wake-up reads them
IDLE_S = 1.0  # the wait for a line when none comes (stop() ends it at once)
PIPE_SIZE = 1 << 20  # each rank's pipe (F_SETPIPE_SZ; Linux's default limit for a user): a rank would
# have to send 50,000 200-byte step events a second to fill it during the wait above


def _enlarge(fd: int) -> None:
    try:
        import fcntl

        fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), PIPE_SIZE)
    except (OSError, ImportError):
        pass  # not Linux, or above /proc/sys/fs/pipe-max-size: the default 64 KiB


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


_T = re.compile(r'"t":(-?[0-9.]+(?:[eE][-+]?[0-9]+)?)')


def _event_time(text: str) -> float:
    """The unix time an event line opens with (events.make puts v, kind, t first); +inf if none."""
    m = _T.search(text)
    try:
        return float(m.group(1)) if m else float("inf")
    except ValueError:
        return float("inf")


class EventReader(threading.Thread):
    """Reads every rank's pipe (selectors), hands each event line (str, without its newline) to
    `put` and, after each round of reads that handed lines on, calls `flush` (in the supervisor:
    EventWriter.take and flush_taken, so lines are written in this thread). A pipe's end (its
    rank and every child holding it gone) is not an error; stop() ends the thread after reading
    what is already in the pipes (a child that outlived its rank may hold a write end open
    forever).

    Cheap per event, since every event costs CPU on the cores its ranks train on, and on a VM a
    thread's wake-up costs more than the work on a line (40-150 us against ~15): after a read it
    waits READ_EVERY_S before looking again (unless a read filled its buffer), so the lines of
    that time are read, written and flushed in one wake-up, not one each (the pipes are enlarged
    to PIPE_SIZE, so a rank's channel does not find its pipe full meanwhile). An event reaches
    events.jsonl at most READ_EVERY_S after its rank wrote it. Lines are handed on as the ranks
    wrote them (the channel writes compact JSON): only rank_ready and error events are parsed
    here, to add the host when a rank did not say it; the writer parses each line once for
    everything else it does."""

    def __init__(self, fds: dict, put, host: str | None = None, node_rank: int = 0, flush=None):
        super().__init__(name="rank-events", daemon=True)
        self.put = put
        self.flush = flush  # called after each round that handed lines on (the writer's flush_taken)
        self.host = host or socket.gethostname()
        self.node_rank = node_rank
        self.sel = selectors.DefaultSelector()
        self.buffers: dict[int, bytes] = {}
        self.lines = 0
        self.refused = 0  # lines that were not events
        self.wakeups = 0  # rounds that read something (lines / wakeups: how well reads batch)
        for fd in fds:
            os.set_blocking(fd, False)
            _enlarge(fd)
            self.sel.register(fd, selectors.EVENT_READ)
            self.buffers[fd] = b""
        self._ending = threading.Event()
        self._wake_r, self._wake_w = os.pipe()  # stop() writes a byte: the wait ends at once
        os.set_blocking(self._wake_r, False)
        self.sel.register(self._wake_r, selectors.EVENT_READ)

    def run(self) -> None:
        try:
            while self.buffers:
                ending = self._ending.is_set()
                ready = self.sel.select(timeout=0 if ending else IDLE_S)
                ready = [key for key, _ in ready if key.fd != self._wake_r]
                if ending and not ready:
                    break
                full = False
                lines = self.lines
                self._round = []
                for key in ready:
                    full = self._read(key.fd) or full
                self._put_round()
                if self.flush is not None and self.lines != lines:
                    self.flush()
                if ready:
                    self.wakeups += 1
                    if not full and not self._ending.is_set():
                        time.sleep(READ_EVERY_S)  # let lines gather: the next round reads them all at once
        finally:
            for fd in list(self.buffers):
                self._close(fd)
            if self.flush is not None:
                try:
                    self.flush()
                except Exception:  # noqa: BLE001 - the writer's own failures are its to report
                    pass
            self.sel.close()
            for fd in (self._wake_r, self._wake_w):
                try:
                    os.close(fd)
                except OSError:
                    pass

    _round: list | None = None  # the lines of the round being read, put in time order at its end

    def _read(self, fd: int) -> bool:
        """Read what the pipe holds and hand its complete lines on; True if the read filled
        READ_CHUNK (more is waiting: read again at once)."""
        try:
            chunk = os.read(fd, READ_CHUNK)
        except BlockingIOError:
            return False
        except OSError:
            chunk = b""
        if not chunk:  # every writer gone
            self._close(fd)
            return False
        data = self.buffers[fd] + chunk
        *lines, self.buffers[fd] = data.split(b"\n")
        for line in lines:
            self._hand_on(line)
        return len(chunk) == READ_CHUNK

    def _hand_on(self, line: bytes) -> None:
        line = line.strip()
        # an event is one JSON object naming its kind; anything else (a stray print into the fd) is not
        if not (line.startswith(b"{") and line.endswith(b"}") and b'"kind":' in line):
            if line:
                self.refused += 1
            return
        if b'"kind":"rank_ready"' in line or b'"kind":"error"' in line:
            ev = events.parse(line)
            if ev is None or not isinstance(ev.get("kind"), str):
                self.refused += 1
                return
            ev.setdefault("host", self.host)  # the engine's ranks say where they run in these
            text = events.dumps(ev)
        else:
            try:
                text = line.decode("utf-8")  # the channel writes ASCII; a line that is not is refused
            except UnicodeDecodeError:
                self.refused += 1
                return
        self.lines += 1
        if self._round is None:
            self.put(text)
        else:
            self._round.append(text)

    def _put_round(self) -> None:
        """A round's lines in the order their ranks made them (the `t` each event opens with),
        not in the order the pipes were read: rank 1's error, then rank 0's that followed it, is
        the story events.jsonl must tell."""
        got, self._round = self._round, None
        if got:
            got.sort(key=_event_time)
            for text in got:
                self.put(text)

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
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass  # already ended and closed
        if self.ident is not None:
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


def start(script, plan: "rank_env_mod.NodePlan", put, flush=None) -> ScriptRanks:
    """Start the node's ranks (stdout/stderr to RunDir.rank_log(rank), cwd script.cwd) and the
    reader of their pipes, which hands each event line to `put` (and calls `flush` after each
    round of lines: EventReader)."""
    rd = RunDir(plan.run_dir)
    cmd = argv(script)
    cwd = os.path.expanduser(script.cwd) if script.cwd else None  # ~ as preflight read it (a preset from the app)
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
    reader = EventReader(read_ends, put, node_rank=plan.node_rank, flush=flush)
    reader.start()
    return ScriptRanks(processes, reader)
