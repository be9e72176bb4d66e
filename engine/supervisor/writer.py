"""events.jsonl: the one writer of a node's run events (its ranks', its own, the other nodes'),
and the view of the ranks the watchdog asks who is stale or slow."""
from __future__ import annotations

import queue as queue_mod
import threading
import time
from pathlib import Path

from .. import events
from ..metrics import KINDS as METRIC_KINDS
from ..runs.view import RunView

FLUSH_GAP_S = 0.05  # events.jsonl is flushed once per burst of lines, and at most this often
IDLE_POLL_S = 1.0  # the writer's wait for a line with nothing to flush (stop() wakes it)
_WAKE = object()  # stop()'s wake-up marker in an in-process queue
DRAIN_POLL_S = 0.2  # once the ranks are gone: an empty queue for this long is drained


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
