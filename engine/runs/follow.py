"""Follow a run from outside: new events, new lines of its log files, and whether its processes
still live. The one follower both `torchdeck run/attach` and the Monitor use; it is the only
thing that feeds a RunView.
"""
from __future__ import annotations

import itertools
import os
import re
import time
from pathlib import Path

from .. import events
from ..events import iter_events  # noqa: F401  (importers take it from here too)
from ..rundir.layout import RunDir, checkpoint_step
from .view import RunView, checkpoint

STATUS_EVERY_S = 1.0  # how often the follower asks whether the supervisor still lives
OUTPUT_EVERY_S = 0.5  # how often the log files are read
LEAVE_BYTES = 4 << 20  # a first pass that read this much (from the start, or after the view checkpoint
# it started from) leaves one for the next reader; a shorter file is read faster than a checkpoint


class EventTail:
    """Incremental reader of a growing events file, events.CHUNK_BYTES at a time: a run of days has
    millions of events, and neither the file nor its parsed lines are ever held whole. A line is
    used once it ends in a newline (a line cut mid-write, or by a chunk, waits for its end); a line
    that is not a JSON object is counted, not raised."""

    def __init__(self, path: str | Path, chunk_bytes: int | None = None):
        self.path = Path(path)
        self.chunk_bytes = max(1, int(chunk_bytes or events.CHUNK_BYTES))
        self._pos = 0
        self._split = events.Lines()
        self.malformed = 0

    def feed(self, fold, max_bytes: int | None = None, stop=None) -> int:
        """Hand every complete event written since the last call to `fold`, one at a time, as its
        chunk is parsed (at most `max_bytes` read; no further chunk once `stop()` is true: a day's
        file takes minutes, and whoever asked may be gone); returns how many events were handed on."""
        n = 0
        try:
            fh = open(self.path, "rb")
        except OSError:
            return 0
        with fh:
            try:
                size = os.fstat(fh.fileno()).st_size  # what is there now: a fast writer cannot keep a poll going
                left = size - self._pos if max_bytes is None else min(max_bytes, size - self._pos)
                fh.seek(self._pos)
                while left > 0 and not (stop is not None and stop()):
                    chunk = fh.read(min(left, self.chunk_bytes))
                    if not chunk:
                        break
                    self._pos += len(chunk)
                    left -= len(chunk)
                    for ev in self._events(self._lines(chunk)):
                        fold(ev)
                        n += 1
            except OSError:
                pass
        return n

    def start_at(self, offset: int, malformed: int = 0) -> None:
        """Read on from `offset` (a line start: a view checkpoint's), as if what is before had been read."""
        self._pos, self._split, self.malformed = offset, events.Lines(), malformed

    @property
    def offset(self) -> int | None:
        """The byte after the last whole line read; None inside a line too long to be one."""
        return None if self._split.skipping else self._pos - len(self._split.partial)

    def poll(self, max_bytes: int | None = None) -> list[dict]:
        """The new events as a list (feed() folds them without one)."""
        out: list[dict] = []
        self.feed(out.append, max_bytes)
        return out

    def _lines(self, chunk: bytes) -> list[bytes]:
        """The lines this chunk completes; a line longer than events.MAX_LINE is one malformed."""
        before = self._split.overlong
        lines = self._split.split(chunk)
        self.malformed += self._split.overlong - before
        return lines

    def _events(self, lines):
        for line in lines:
            if not line.strip():
                continue
            ev = events.parse(line)
            if ev is not None:
                yield ev
            else:
                self.malformed += 1

    def _parse(self, lines) -> list[dict]:
        return list(self._events(lines))


# ----------------------------------------------------------------------------- log files

FIRST_BYTES = 16 * 1024  # a log file first seen is read from its last few KiB only
READ_BYTES = 64 * 1024
_RANK_LOG = re.compile(r"rank(\d+)\.log")


class _LogFile:
    def __init__(self, size: int, whole: bool = False):
        self.pos = 0 if whole else max(0, size - FIRST_BYTES)
        self.skip_first = self.pos > 0  # started mid-line: that piece is not a line
        self.partial = b""


class OutputTail:
    """New lines of a run's text logs (rank<N>.log, supervisor.log): what the workers printed.
    A finished run's logs can be long; only their tails matter to a reader (whole: every line, from
    the start, for `torchdeck launch` printing its ranks' output; supervisor: supervisor.log too).
    Each poll reads at most READ_BYTES a file; `behind` says one had more."""

    def __init__(self, run: RunDir, whole: bool = False, supervisor: bool = True):
        self.run = run
        self._files: dict[Path, _LogFile] = {}
        self.whole, self.supervisor = whole, supervisor
        self.behind = False

    def _paths(self) -> list[tuple[int | None, Path]]:
        out = []
        try:
            names = os.listdir(self.run.path)
        except OSError:
            names = []
        for name in names:
            m = _RANK_LOG.fullmatch(name)
            if m:
                out.append((int(m.group(1)), self.run.path / name))
        out.sort()
        return ([(None, self.run.supervisor_log)] if self.supervisor else []) + out

    def leftovers(self) -> list[tuple[int | None, str]]:
        """The last line of each file where it has no newline yet (a run that is over: its end)."""
        out = []
        for rank, p in self._paths():
            f = self._files.get(p)
            if f is not None and f.partial.strip():
                out.append((rank, f.partial.decode("utf-8", "replace").rstrip()))
                f.partial = b""
        return out

    def poll(self) -> list[tuple[int | None, str, float]]:
        """(rank or None for the supervisor, line, when) for every complete line written since the
        last poll; `when` is the file's modification time, the best time a line without one has."""
        out = []
        self.behind = False
        for rank, p in self._paths():
            try:
                stat = p.stat()
            except OSError:
                continue
            size = stat.st_size
            f = self._files.get(p)
            if f is None:
                f = self._files[p] = _LogFile(size, self.whole)
            if size < f.pos:  # truncated or replaced: start over
                f.pos, f.partial = 0, b""
            if size == f.pos:
                continue
            try:
                with open(p, "rb") as fh:
                    fh.seek(f.pos)
                    chunk = fh.read(READ_BYTES)
                    f.pos = fh.tell()
                    self.behind = self.behind or f.pos < size
            except OSError:
                continue
            lines = (f.partial + chunk).split(b"\n")
            f.partial = lines.pop()
            if len(f.partial) > READ_BYTES:  # a "line" with no end in sight: show it as it is
                lines.append(f.partial)
                f.partial = b""
            if f.skip_first and lines:
                lines, f.skip_first = lines[1:], False
            for ln in lines:
                text = ln.decode("utf-8", "replace").rstrip()
                if text:
                    out.append((rank, text, stat.st_mtime))
        return out


# ----------------------------------------------------------------------------- the follower


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def resumed_chain(run: RunDir, depth: int = 20) -> list[tuple[RunDir, int]]:
    """(earlier run, step it was resumed at) for each run this one continues, oldest first."""
    out, here = [], run
    for _ in range(depth):
        origin = here.origin()
        old, found = origin.get("resumed_from"), checkpoint_step(str(origin.get("checkpoint") or ""))
        if not old or not found:
            break
        here = RunDir(Path(old))
        out.append((here, found[0]))
    return out[::-1]


def history_view(chain: list[tuple[RunDir, int]], stop=None) -> RunView | None:
    """A view holding the earlier parts' curves of a resumed run (resumed_chain), as each of its
    readers starts, before this run's own events; None where `stop()` came true before the end."""
    view = RunView()
    for old, step in chain:
        evs = iter_events(old.events_path)
        if stop is not None:
            evs = itertools.takewhile(lambda _: not stop(), evs)
        view.add_history(evs, step, old.name)
        if stop is not None and stop():
            return None
    return view


class Follower:
    """Feeds one RunView from a run directory. Call `poll()` as often as you like; it reads the
    log files and asks about the run's processes only every OUTPUT_EVERY_S / STATUS_EVERY_S."""

    def __init__(self, run: RunDir | str | Path, outputs: bool = True, clock=time.time, stop=None,
                 use_checkpoint: bool = True, history: bool = True):
        """stop: a callable, true once nobody reads this view any more (the Monitor left): a poll
        of a long file then ends at its next chunk instead of reading on for minutes.
        use_checkpoint: start from the run's view checkpoint (view.ckpt.json) where it can be
        trusted, reading only the events after it; a first poll that read a long way to the file's
        end leaves one for the next reader. history: a resumed run's earlier parts'
        curves come first (a view without them leaves no checkpoint of such a run: its readers want them)."""
        self.run = run if isinstance(run, RunDir) else RunDir(Path(run))
        self.stop = stop
        self.view = RunView()
        self.events = EventTail(self.run.events_path)
        self.output = OutputTail(self.run) if outputs else None
        self.clock = clock
        self._last_output = self._last_status = -1e9
        chain = resumed_chain(self.run) if history else []
        self._history = [(old.name, step) for old, step in chain]
        got = checkpoint.load(self.run.events_path, self._history) if use_checkpoint else None
        self.from_checkpoint = got is not None  # the view started from view.ckpt.json
        self._save_checkpoint = use_checkpoint and (history or not resumed_chain(self.run, 1))
        self._history_bytes = 0  # the earlier parts read: a first pass over them is worth a checkpoint too
        if got is not None:
            self.view, offset, malformed = got
            self.events.start_at(offset, malformed)
            return
        self.view = history_view(chain)
        self._history_bytes = sum(_size(old.events_path) for old, _ in chain)

    @property
    def skipped(self) -> int:
        """Lines and events that could not be used (malformed JSON, bad fields, unknown kinds)."""
        return self.events.malformed + self.view.skipped

    def poll(self, force: bool = False) -> int:
        """Fold in what is new, event by event as it is read; returns the number of events read."""
        n = self._feed()
        if self.stop is not None and self.stop():
            return n  # maybe part of the file only: no status is judged from it
        mono = time.monotonic()
        if self.output is not None and (force or mono - self._last_output >= OUTPUT_EVERY_S):
            self._last_output = mono
            for rank, line, when in self.output.poll():
                self.view.add_output(rank, line, min(when, self.clock()))
        if not self.view.final and (force or mono - self._last_status >= STATUS_EVERY_S):
            self._last_status = mono
            n += self._check_status()
        return n

    def _leave_checkpoint(self) -> None:
        """view.ckpt.json for the next reader (never fails a read: a read-only directory has none)."""
        offset = self.events.offset
        if offset:
            checkpoint.save(self.run.events_path, checkpoint.state(self.view, offset, self._history,
                                                                   self.events.malformed))

    def _check_status(self) -> int:
        now = self.clock()
        final = self.run.final_status()
        pid = self.run.owner_pid()
        alive = final is None and self.run.owner_alive()  # a SLURM run: its job, as SLURM says
        final = final or self.run.final_status()  # owner_alive may have recorded a SLURM job's end
        late = 0
        if not alive:
            late = self.events.feed(self.view.feed, stop=self.stop)  # its last words (run_finished), written before status.json
        self.view.observe(final, alive, pid is not None, self.run.quiet_s(now), now)
        return late

    def read(self) -> RunView:
        """The view of every event written so far (from the view checkpoint on, where there is one)."""
        self._feed()
        return self.view

    def _feed(self) -> int:
        start = self.events.offset
        n = self.events.feed(self.view.feed, stop=self.stop)
        if self._save_checkpoint and not (self.stop is not None and self.stop()):
            self._save_checkpoint = False  # the first pass, before anything but events is in the view
            if (self.events.offset or 0) - (start or 0) + self._history_bytes >= LEAVE_BYTES:
                self._leave_checkpoint()
        return n

    def follow(self, interval: float = 0.2, stop=lambda: False):
        """Poll until the run is over (or `stop()`), yielding after every poll that read something
        (and at least every `interval` seconds, for clocks on screen)."""
        while not stop():
            n = self.poll()
            yield n
            if self.view.final:
                self.poll(force=True)
                return
            if not n:
                time.sleep(interval)
