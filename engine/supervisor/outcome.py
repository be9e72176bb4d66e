"""How a run ended, in words: its status and root cause from the ranks' exit codes, their error
events and what the supervisor saw (a stop, a disk that filled up), and how each rank's end is said."""
from __future__ import annotations

import os
import re
import signal
import socket

from .. import events
from ..rundir.status import Status

TAIL_BYTES = 16 << 10  # what is read of a failed rank's log for its last lines (a log may be huge)
TAIL_LINES = 8


def signal_text(exitcode: int | None) -> str | None:
    if exitcode is None or exitcode >= 0:
        return None
    try:
        return signal.Signals(-exitcode).name
    except ValueError:
        return f"signal {-exitcode}"


def _exit_said(rank: int, code: int | None) -> str:
    if code is not None and code < 0:
        return f"rank {rank} killed by signal {-code} ({signal_text(code)})"
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


def cannot_write(path, exc: OSError) -> str:
    """Disk full, over quota, too large: one line with the file, the reason and the fix."""
    from ..checkpoint import disk_hint

    return f"cannot write {path}: {exc.strerror or exc}: {disk_hint(exc.errno)}"


def is_timeout(err: dict) -> bool:
    """A collective or rendezvous that gave up waiting (gloo: "Timed out waiting 5000ms ...")."""
    if err.get("exception") == "RendezvousError":  # already says where and what to check (worker.py)
        return False
    text = f"{err.get('exception')} {err.get('message')}".lower()
    return "timed out" in text or "timeout" in text


def when(err: dict) -> float:
    """An error's time for ordering them: its `t`, or 0 where it has none a number (as if sent first)."""
    t = err.get("t", 0)
    return t if isinstance(t, (int, float)) and not isinstance(t, bool) and t == t else 0


class FirstErrors:
    """The ranks' error events an attempt's outcome is decided from, bounded however many come (a
    run of days whose ranks log a recoverable error every step sends millions): each rank's
    earliest error and its earliest timeout, and `seen`, the count of all. What the root cause reads
    (the earliest error, the ranks that reported one, whether one timed out) is the same as from
    every error: the earliest of all is some rank's earliest, ties going to the first to arrive."""

    def __init__(self):
        self._kept: dict = {}  # (rank, timed out?) -> (arrival number, event)
        self.seen = 0

    def add(self, err: dict) -> None:
        self.seen += 1
        rank = err.get("rank")
        try:
            hash(rank)
        except TypeError:
            rank = repr(rank)
        key = (rank, is_timeout(err))
        had = self._kept.get(key)
        if had is None or when(err) < when(had[1]):
            self._kept[key] = (self.seen, err)

    def clear(self) -> None:
        self._kept, self.seen = {}, 0

    def __iter__(self):
        """The kept errors in the order they came (a copy: the ranks' reader adds while others read)."""
        return iter([err for _, err in sorted(list(self._kept.values()), key=lambda kept: kept[0])])

    def __len__(self) -> int:
        return len(self._kept)


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
    frames = re.findall(r'File "([^"]+)", line (\d+), in (\S+)', tb) if isinstance(tb, str) else []
    if not frames:
        return None
    file, line, func = frames[-1]
    return f"{file}:{line} in {func}"


class Outcome:
    """The run's status and root cause, decided once its ranks are gone. `where` is the watchdog's
    (rank -> where its stacks last showed it), read when a timeout names the ranks that hung."""

    def __init__(self, rd, script: bool, timeout_s, where: dict):
        self.rd, self.script, self.timeout_s, self.where = rd, script, timeout_s, where
        self.base = 0  # global rank of this node's local rank 0
        self.failed_local_rank: int | None = None  # the local rank the root cause blames (status.json)
        self.quote: tuple | None = None  # (local rank, exit code, last lines of its log): _quoted

    def decide(self, codes, died_first, reported, stopping: bool, write_failure: str | None,
               errors) -> tuple[Status, str | None]:
        """(status, cause) from the ranks' exit codes; `stopping`: a stop was asked (here, or on
        another node: the ranks then leave the stop file); `errors`: the ranks' error events (FirstErrors, or every one)."""
        ok = all(c == 0 for c in codes)
        if write_failure:  # the ranks were stopped gracefully; say whether that went through
            return Status.FAILED, self._write_failure_cause(write_failure, ok, codes, errors)
        if ok:
            if stopping and self.rd.preempt_path.exists():
                return Status.PREEMPTED, "SIGUSR1: preemption or time limit warning; resume from the last checkpoint"
            return (Status.STOPPED if stopping else Status.FINISHED), None
        if stopping and (reported or self.script):  # a script's ranks may end on the SIGTERM itself
            return Status.STOPPED, reported
        return Status.FAILED, self._root_cause(codes, died_first, errors)

    @staticmethod
    def _write_failure_cause(write_failure: str, ok: bool, codes, errors) -> str:
        if ok:
            return f"{write_failure}; the run was stopped after a final checkpoint"
        errors = sorted(errors, key=when)  # seen, if not written
        then = (f"rank {errors[0].get('rank')}: {errors[0].get('exception')}: {errors[0].get('message')}"
                if errors else f"the ranks exited with codes {codes} (the disk may be full for them too)")
        return f"{write_failure}; while stopping, {then}"

    def _root_cause(self, codes, died_first, errors) -> str:
        """A rank that died by a signal on its own without reporting (the OOM killer), else the
        earliest error event (later ones are usually peers losing their connection), else the
        first rank to exit badly."""
        base = self.base
        errors = sorted(errors, key=when)
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
            return self._error_cause(errors[0], codes, died_first, reporting)
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

    def _error_cause(self, e: dict, codes, died_first, reporting) -> str:
        """A timeout names the ranks that never arrived: those still running, silent, when it was stopped."""
        if not is_timeout(e):
            at = _raised_at(e.get("traceback")) if self.script else None
            return (f"rank {e.get('rank')} ({e.get('host')}): {e.get('exception')}: {e.get('message')}"
                    + (f" (at {at})" if at else ""))
        base = self.base
        stuck = [base + i for i, c in enumerate(codes) if c != 0 and i not in died_first and base + i not in reporting]
        return _timeout_cause(e, self.timeout_s, stuck, self.where)

    def after_lost(self, lost: str, cause: str | None, ended_here: bool) -> str:
        """A node was lost (NodeLink.lost_cause): that is the cause; this node's ranks' own failure
        (a collective's "Connection reset by peer" when the node's ranks went) follows as its result,
        or, when the supervisor ended them for it before any said an error, says so. No local
        rank is to blame."""
        self.failed_local_rank = None
        if ended_here or not cause:
            self.quote = None  # their SIGTERM's last lines say nothing
            return f"{lost}; this node's ranks were ended for it"
        return f"{lost}; as a result: {cause}"

    def quote_event(self, processes) -> dict | None:
        """The failed rank's last lines as an `error` event, so every front end shows them as a
        rank's failure (the CLI's summary, attach, the Monitor), as a traceback is shown."""
        if self.quote is None:
            return None
        local, code, tail = self.quote
        what = f"exit code {code}" if code is not None and code >= 0 else signal_text(code)
        return events.make("error", rank=self.base + local, host=socket.gethostname(), pid=processes[local].pid,
                           exception=what, message=tail[-1].strip(), traceback="\n".join(tail),
                           source=str(self.rd.rank_log(self.base + local).name))
