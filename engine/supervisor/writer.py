"""events.jsonl: the one writer of a node's run events (its ranks', its own, the other nodes'),
and the view of the ranks the watchdog asks who is stale or slow."""
from __future__ import annotations

import os
import queue as queue_mod
import threading
import time
from pathlib import Path

from .. import events
from ..metrics import KINDS as METRIC_KINDS
from ..rundir.layout import RunDir
from ..runs.follow import EventTail, history_view, resumed_chain
from ..runs.view import RunView, checkpoint
from .outcome import FirstErrors

FLUSH_GAP_S = 0.05  # events.jsonl is flushed once per burst of lines, and at most this often
IDLE_POLL_S = 1.0  # the writer's wait for a line with nothing to flush (stop() wakes it)
_WAKE = object()  # stop()'s wake-up marker in an in-process queue
DRAIN_POLL_S = 0.2  # once the ranks are gone: an empty queue for this long is drained
CHECKPOINT_EVERY_S = 5.0  # view.ckpt.json: a reader of a run of days folds only the events after it
HISTORY_WAIT_S = 10.0  # close(): how long a resumed run's last checkpoint waits for its earlier parts' curves


class EventWriter(threading.Thread):
    """Drains the ranks' queue continuously (a full pipe would block them) into events.jsonl."""

    def __init__(self, path: Path, q):
        super().__init__(name="event-writer", daemon=True)
        self.path, self.q = Path(path), q
        self.fh = open(path, "a", buffering=1 << 20)
        self.lock = threading.Lock()
        self.errors = FirstErrors()  # what the root cause needs of the ranks' errors, bounded
        self.done = threading.Event()
        self._ending = threading.Event()  # stop(): drain what is there, then end
        self.count = 0  # lines taken
        self.flushes = 0
        self._unflushed = 0  # lines written since the last flush
        self.write_error: OSError | None = None  # disk full / file gone: keep draining, report it
        self.view = RunView()  # the run as a front end sees it (every line fed): the watchdog asks it who is
        # stale, and it is the view checkpoint readers start from
        self.metrics = None  # engine.metrics.MetricsSink: metrics.csv (and TensorBoard) fed as events come
        self.written = os.fstat(self.fh.fileno()).st_size  # bytes of events.jsonl, ours included: the checkpoint's offset
        self.malformed = 0  # lines written that a reader cannot use (it counts them too)
        self.checkpoints = 0
        self._checkpoint_t = time.monotonic()
        self._checkpoint_at = -1  # `written` at the last checkpoint
        chain = resumed_chain(RunDir(self.path.parent))  # a resumed run: its readers' views start with these
        self._history = [(old.name, step) for old, step in chain]
        self._history_ready = threading.Event()  # the view holds the history (at once where there is none)
        self._history_stop = threading.Event()
        self._history_thread = None
        if chain:
            self._history_thread = threading.Thread(target=self._load_history, args=(chain,), name="view-history",
                                                    daemon=True)
            self._history_thread.start()
        else:
            self._history_ready.set()

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
        """Supervisor's own events go straight to the file, and into the view, under the same lock:
        the view checkpoint's offset must cover exactly what the view holds."""
        text = events.dumps(ev) + "\n"
        with self.lock:
            self.view.feed(ev)
            if self.write_error is None:
                try:
                    self._write_flush(text)
                except OSError as exc:
                    self.write_error = exc
            self._to_metrics("add", ev)  # a restart: TensorBoard's curves start a new session there

    def _write_flush(self, text: str) -> None:
        self.fh.write(text)
        self.written += len(text) if text.isascii() else len(text.encode())
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
            if ev is not None:
                if kind == "error":
                    self.errors.add(ev)
                self.view.feed(ev)  # every event, as a reader folds them (an unknown one is counted)
            elif line.strip():
                self.malformed += 1
            if self.write_error is None:
                try:
                    self.fh.write(line + "\n")
                    self.written += len(line) + 1 if line.isascii() else len(line.encode()) + 1
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
            if now - self._checkpoint_t >= CHECKPOINT_EVERY_S:
                self.checkpoint()
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

    def _load_history(self, chain) -> None:
        """A resumed run's readers start with the earlier parts' curves, then fold its events: its
        checkpoint must hold the same. That view is made here, off the ranks' path (a run of days
        before it may take a minute to read): the history, then this run's file read back; under
        the lock it catches up to what is written and becomes the writer's view. Until then no
        checkpoint is written (a reader of the run reads the history itself, as before)."""
        try:
            view = history_view(chain, stop=self._history_stop.is_set)
            if view is None:
                return
            tail = EventTail(self.path)
            tail.feed(view.feed, stop=self._history_stop.is_set)  # most of it, outside the lock
            with self.lock:
                if self.write_error is not None or self._history_stop.is_set():
                    return
                self.fh.flush()
                if os.fstat(self.fh.fileno()).st_size != self.written:
                    return  # another process appended: no checkpoint of this file (see checkpoint())
                tail.feed(view.feed)
                if tail.offset != self.written:
                    return
                self.view, self.malformed = view, tail.malformed
                self._history_ready.set()
        except Exception as exc:  # a cache: whatever goes wrong never touches the run
            checkpoint.log.warning("no view checkpoint of this resumed run: %s", exc)

    def checkpoint(self) -> bool:
        """view.ckpt.json of every event written so far (the view's state is copied under the lock,
        written out after it), with a resumed run's history as its readers have it (_load_history);
        not where another process appended to the file."""
        self._checkpoint_t = time.monotonic()
        with self.lock:
            if (not self._history_ready.is_set() or self.write_error is not None
                    or self.written == self._checkpoint_at):
                return False
            try:
                self.fh.flush()
                if os.fstat(self.fh.fileno()).st_size != self.written:
                    return False
            except OSError:
                return False
            self._checkpoint_at = self.written
            try:
                state = checkpoint.state(self.view, self.written, self._history, malformed=self.malformed)
            except Exception as exc:  # a cache: whatever it cannot hold never touches the run
                checkpoint.log.warning("no view checkpoint: %s", exc)
                return False
        if not checkpoint.save(self.path, state):
            return False
        self.checkpoints += 1
        return True

    def close(self) -> None:
        if self._history_thread is not None:
            self._history_thread.join(HISTORY_WAIT_S)
            self._history_stop.set()  # still reading the earlier parts: the run's first reader will
        if self.write_error is None:
            self.checkpoint()  # the run's last state: attach and the Monitor of a finished run read nothing after it
        self._guarded(self.fh.flush)
        self._to_metrics("close")
        try:
            self.fh.close()
        except OSError:
            pass
