"""The per-rank event channel, rank side: one JSON event per line into the pipe the supervisor
gave this rank, never blocking and never raising into the caller.

The protocol (the supervisor's side reads it):
- The supervisor gives each rank process one pipe; the rank inherits its write end, whose fd
  number is in env TORCHDECK_EVENTS_FD. Without that variable everything here is a no-op.
- Each event is one JSON object on one line ending in "\\n", at most LINE_MAX (4096, PIPE_BUF)
  bytes with the newline, so every write is atomic: lines of several writers sharing the pipe
  (threads, forked children) never interleave. JSON is written ASCII-only (non-ASCII as \\u
  escapes), NaN and Infinity as Python's json writes them (engine.events.dumps).
- A longer event is cut down, never split: its longest strings are shortened with a
  "[... N characters cut ...]" marker (a traceback keeps its head and its tail, other strings
  their head); if that is not enough, whole fields are left out, largest first, and the event
  carries "truncated": true. v, kind, t and rank are always kept.
- The fd is made O_NONBLOCK; a write that would block (the pipe is full: the supervisor is slow)
  drops that event and counts it. The next event that gets through carries "dropped": n, the
  events this process dropped since its previous delivered one (absent when none).
- Every event has v (engine.events.EVENT_VERSION), kind, t (time.time()), rank (int(env RANK)
  at the time of sending, null if unset), and its kind's fields (engine/events.py).
- A closed pipe (the supervisor is gone) or a bad fd: this process stops sending, silently.

Processes a rank starts: a forked child shares the fd and writes to the same pipe. A child
started with a fresh interpreter (multiprocessing "spawn"/"forkserver", subprocess with
close_fds) usually does not have the fd, or has the same number open on another file: the
first process to open the channel exports TORCHDECK_EVENTS_ID (the pipe's st_dev:st_ino) and,
on Linux, TORCHDECK_EVENTS_PATH (/proc/<pid>/fd/<fd> of that process), and a descendant uses
its fd only if it is that pipe, else reopens the pipe through that path (while the first
process lives), else sends nothing. A child reports as the RANK of its own environment: its
parent's rank unless it set RANK itself (os.environ["RANK"] = ... before its first event).

Stdlib only, cheap to import (the shim imports it before the user's script runs).
"""
from __future__ import annotations

import json
import os
import stat
import time

from ..events import EVENT_VERSION

ENV_FD = "TORCHDECK_EVENTS_FD"
ENV_ID = "TORCHDECK_EVENTS_ID"
ENV_PATH = "TORCHDECK_EVENTS_PATH"
LINE_MAX = 4096  # PIPE_BUF on Linux: a write of at most this many bytes to a pipe is atomic
_KEEP = ("v", "kind", "t", "rank")  # never cut or left out
_TAIL_FIRST = ("traceback",)  # strings whose end matters most (the exception is at the end)


def _dumps(ev: dict) -> str:
    # engine.events.dumps plus a default: a stray object becomes its repr instead of an error
    return json.dumps(ev, separators=(",", ":"), allow_nan=True, default=repr)


def _cut(key: str, text: str, keep: int) -> str:
    gone = len(text) - keep
    marker = f"[... {gone} characters cut ...]"
    if key in _TAIL_FIRST:
        head = keep // 3
        return text[:head] + "\n" + marker + "\n" + text[len(text) - (keep - head):]
    return text[:keep] + " " + marker


def fit(ev: dict, limit: int = LINE_MAX) -> str | None:
    """The event as one JSON line (without its newline) of at most limit - 1 bytes, cut down as
    the module docstring says; None if even v, kind, t and rank do not fit."""
    line = _dumps(ev)
    if len(line) < limit:  # ASCII only: characters are bytes
        return line
    ev = dict(ev)
    for _ in range(8):  # share the room among the long strings; escapes may take a second round
        over = len(line) + 1 - limit
        if over <= 0:
            return line
        # (bytes written, key) of each string: an escaped character takes 2 to 6 bytes
        strings = sorted((len(_dumps(v)), k) for k, v in ev.items() if k not in _KEEP and isinstance(v, str))
        room = sum(b for b, _ in strings) - over - 60 * len(strings)  # 60: each marker, escaped
        if not strings or room < 40 * len(strings):
            break
        for i, (b, key) in enumerate(strings):  # shortest first: what a short one leaves, longer ones get
            share = room // (len(strings) - i)
            if b > share:
                text = ev[key]
                ev[key] = _cut(key, text, max(20, share * len(text) // b))
                room -= share
            else:
                room -= b
        line = _dumps(ev)
    ev["truncated"] = True
    line = _dumps(ev)
    while len(line) >= limit:
        sizes = [(len(_dumps(v)), k) for k, v in ev.items() if k not in _KEEP and k != "truncated"]
        if not sizes:
            return None
        del ev[max(sizes)[1]]
        line = _dumps(ev)
    return line


def _identity(fd: int) -> str | None:
    """st_dev:st_ino of fd if it is a pipe or a socket, else None."""
    try:
        st = os.fstat(fd)
    except OSError:
        return None
    if not (stat.S_ISFIFO(st.st_mode) or stat.S_ISSOCK(st.st_mode)):
        return None
    return f"{st.st_dev}:{st.st_ino}"


class Channel:
    """Writes events to one fd. send() never blocks and never raises."""

    def __init__(self, fd: int):
        self.fd = fd
        self.dropped = 0  # events not delivered since the last one that was (a full pipe)
        self.closed = False
        try:
            os.set_blocking(fd, False)
        except OSError:
            self.closed = True

    def send(self, kind: str, **fields) -> bool:
        """One event of `kind`; True if it was written, False if dropped (a full pipe, or an
        event that cannot be cut to fit) or the channel is closed."""
        if self.closed:
            return False
        try:
            rank = os.environ.get("RANK")
            ev = {"v": EVENT_VERSION, "kind": kind, "t": time.time(),
                  "rank": int(rank) if rank and rank.strip().lstrip("-").isdigit() else None}
            ev.update(fields)
            dropped = self.dropped  # read once: another thread may add to it meanwhile
            if dropped:
                ev["dropped"] = dropped
            line = fit(ev)
            if line is None:
                self.dropped += 1
                return False
            os.write(self.fd, (line + "\n").encode("ascii"))
        except BlockingIOError:  # the pipe is full: drop, count, go on
            self.dropped += 1
            return False
        except OSError:  # EPIPE (the reader is gone), EBADF: stop sending
            self.closed = True
            return False
        except Exception:  # noqa: BLE001 - an event we cannot encode is dropped, never raised
            self.dropped += 1
            return False
        self.dropped -= dropped
        return True


_channel: Channel | None = None
_looked = False  # a forked child inherits both: it writes to its parent's pipe


def _open() -> Channel | None:
    env = os.environ
    raw = env.get(ENV_FD)
    if not raw:
        return None
    try:
        fd = int(raw)
    except ValueError:
        return None
    want = env.get(ENV_ID)
    have = _identity(fd)
    if have is not None and (want is None or want == have):
        if want is None:  # the first process: tell descendants what the pipe is and where
            env[ENV_ID] = have
            if os.path.isdir("/proc/self/fd"):
                env[ENV_PATH] = f"/proc/{os.getpid()}/fd/{fd}"
        return Channel(fd)
    path = env.get(ENV_PATH)
    if not path or want is None:
        return None  # fd is another file here (or none): never write into it
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    if _identity(fd) != want:
        os.close(fd)
        return None
    return Channel(fd)


def get() -> Channel | None:
    """This process's channel (opened on first use), or None outside torchdeck."""
    global _channel, _looked
    if not _looked:
        _looked = True
        try:
            _channel = _open()
        except Exception:  # noqa: BLE001 - never raise into the caller
            _channel = None
    return _channel


def emit(kind: str, **fields) -> bool:
    """Send one event if this process is under torchdeck; never blocks, never raises."""
    ch = get()
    return ch.send(kind, **fields) if ch is not None else False
