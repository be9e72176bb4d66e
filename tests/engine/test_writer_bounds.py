"""Issue 37 (runs that last days): the supervisor's list of the ranks' error events is bounded
within an attempt. A run whose ranks log a recoverable error every step sends millions of them; the
root cause reads only the earliest, the ranks that reported one and whether one timed out, and
those must come out the same as from every error the writer was sent."""
from __future__ import annotations

import random

from torchdeck.engine import events
from torchdeck.engine.rundir.layout import RunDir
from torchdeck.engine.supervisor import EventWriter
from torchdeck.engine.supervisor.outcome import Outcome, is_timeout

RANKS, PER_RANK = 4, 2500
T0 = 1_800_000_000.0


def _errors(seed: int, first_rank: int, timeout_first: bool, no_t: bool) -> list[dict]:
    """Every rank's recoverable errors, one a step, arriving interleaved and not in `t` order (the
    ranks' pipes are read in rounds); `first_rank`'s at step 700 is the earliest of all, a tie in
    `t` with another rank's that arrives later (unless `no_t`: one without a time is, as the
    outcome orders them); some ranks also time out in a collective."""
    rng = random.Random(seed)
    out = []
    for step in range(PER_RANK):
        for rank in rng.sample(range(RANKS), RANKS):
            t = T0 + 1000 + step + rng.random()
            exc, msg = "ValueError", f"bad batch at step {step}"
            if rank % 2 and step % 50 == 7:
                exc, msg = "DistBackendError", f"Timed out waiting 5000ms for recv at step {step}"
            out.append(dict(events.make("error", rank=rank, host="box", pid=100 + rank, exception=exc,
                                        message=msg, traceback="Traceback ..."), t=t))
    first = "DistBackendError" if timeout_first else "RuntimeError"
    for rank in (first_rank + 1) % RANKS, first_rank:  # the same `t`: the first to arrive is the earliest
        out.insert(700 * RANKS, dict(events.make("error", rank=rank, host="box", pid=100 + rank, exception=first,
                                                 message=f"Timed out waiting (rank {rank})" if timeout_first
                                                 else f"CUDA error (rank {rank})"), t=T0))
    if no_t:  # an error without a time: as if it came first
        out.insert(5, events.make("error", rank=RANKS - 1, host="box", exception="OSError", message="no t"))
        out[5].pop("t")
    return out


def _causes(rd: RunDir, errors) -> list:
    """The causes every reader of the errors gives: failed, a disk that filled up, a node lost."""
    out = []
    for codes, died_first in (([1, 1, 1, 1], [2]), ([0, -9, 1, 1], [1]), ([1, 1, 0, 1], []), ([1] * 4, [0, 3])):
        o = Outcome(rd, False, 60, {3: "train.py:40 in step"})
        out.append((o.decide(codes, died_first, None, False, None, errors), o.failed_local_rank))
        out.append(Outcome(rd, False, 60, {}).decide(codes, died_first, None, False, "cannot write x", errors))
    return out + [bool(errors), any(is_timeout(e) for e in errors)]


def _fed(tmp_path, name: str, errors: list[dict]) -> EventWriter:
    """A real writer on a real run directory's events.jsonl, taking the errors as the ranks' reader
    hands it their lines."""
    rd = tmp_path / name
    rd.mkdir()
    writer = EventWriter(rd / "events.jsonl", None)
    for e in errors:
        writer.take(events.dumps(e))
    writer.flush_taken()
    writer.close()
    return writer


def test_the_writers_errors_are_bounded_and_give_the_same_root_cause(tmp_path):
    for n, (first_rank, timeout_first, no_t) in enumerate([(2, False, False), (1, True, False), (0, False, True)]):
        errors = _errors(n, first_rank, timeout_first, no_t)
        writer = _fed(tmp_path, f"run{n}", errors)
        assert len(events.read_all(writer.path)) == len(errors)  # every one written all the same
        assert len(writer.errors) <= 2 * RANKS, f"{len(writer.errors)} of {len(errors)} error events kept"
        assert writer.errors.seen == len(errors)
        rd = RunDir(writer.path.parent)
        got, want = _causes(rd, writer.errors), _causes(rd, events.read_all(writer.path))
        assert got == want
        cause = got[0][0][1]
        assert cause.startswith(f"rank {RANKS - 1 if no_t else first_rank} (box)"), cause  # a tie: the first to arrive
        assert ("timed out" in cause) == timeout_first, cause
    writer.errors.clear()  # a restart's next attempt: its own root cause
    assert not writer.errors and writer.errors.seen == 0


def test_an_error_older_than_the_whole_log_is_kept_in_errors():
    """An error event whose `t` is older than every line the log keeps (a slow node's pipe, late)
    drops out of the log at once; it is still an error, and no reader raises over it (the writer's
    view raised StopIteration in the ranks' reader thread)."""
    from torchdeck.engine.runs.view import LOG_LINES, RunView

    view = RunView()
    for i in range(LOG_LINES):
        assert view.feed(events.make("log", rank=0, level="info", message=f"line {i}") | {"t": T0 + 10 + i})
    late = events.make("error", rank=1, host="box", exception="ValueError", message="late") | {"t": T0}
    assert view.feed(late)
    assert view.errors[-1].text.endswith("ValueError: late") and len(view.logs) == LOG_LINES
