"""A view checkpoint: a RunView's reduced state beside events.jsonl (view.ckpt.json), with the byte
offset of the events it covers, so a reader of a run of days folds only the events after it
instead of the whole file (issue 37). The supervisor writes one every few seconds; a reader that had
to read a run without one (an older run, a torchrun-written run) writes one after its pass.

JSON, never pickle: a run directory may come from anywhere, and only the classes named in _CLASSES
are ever built from it. A checkpoint is a cache, never a source of truth: one that is corrupt, of
another schema, or whose offset is past the file's end, not at a line start, or not over the same
bytes as when it was written, is ignored with a log line and the file is read from its start.

Beside it, written with it, a row summary (view.sum.json): the same view with its curves, logs,
stacks, node samples and step windows left out, for `torchdeck runs` and the Runs list, which show
a few fields of hundreds of runs and decoded each one's whole curves before. It is checked against
the file as the checkpoint is; a run without one (older, torchrun-written) is read the old way.
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import hashlib
import json
import logging
import os
import threading
from enum import Enum
from pathlib import Path

from ...files import write_atomic
from ...rundir.status import Status
from ..fleet import GPU, Fleet, HostInfo, Node
from .records import EpochPoint, LogLine, RankState, Thinned

NAME = "view.ckpt.json"
SUMMARY_NAME = "view.sum.json"
SCHEMA = 1
FINGERPRINT_BYTES = 256  # the bytes before the offset: the checkpoint is of this file, cut at this line
log = logging.getLogger("torchdeck.view.checkpoint")
log.addHandler(logging.NullHandler())  # the Monitor's screen is no place for it; tests and --debug read it
_WRITING = threading.Lock()  # write_atomic's temp file is per process: two readers of one app take turns


@functools.lru_cache(maxsize=1)
def _classes() -> dict:
    from . import RunView  # the package imports this module's users, not this module

    return {c.__name__: c for c in (RunView, RankState, LogLine, EpochPoint, Thinned, Fleet, Node, GPU,
                                     HostInfo, Status)}


def encode(obj):
    """A JSON-able copy of a view's state: tuples, non-string keys and objects tagged so that
    decode() builds back the same values. Anything else raises TypeError (no checkpoint, not a
    wrong one)."""
    if obj is None or isinstance(obj, (bool, int, float, str)) and not isinstance(obj, Enum):
        return obj
    if isinstance(obj, list):
        return [encode(x) for x in obj]
    if isinstance(obj, tuple):
        return {"~t": [encode(x) for x in obj]}
    if isinstance(obj, dict):
        return {"~d": [[encode(k), encode(v)] for k, v in obj.items()]}
    if isinstance(obj, (set, frozenset)):
        return {"~s": sorted((encode(x) for x in obj), key=repr)}
    if isinstance(obj, Enum):
        return {"~e": type(obj).__name__, "v": obj.value}
    name = type(obj).__name__
    if _classes().get(name) is type(obj):
        return {"~o": name, "v": {k: encode(v) for k, v in vars(obj).items()}}
    raise TypeError(f"a view checkpoint cannot hold a {name}")


_NESTED = (list, dict)


def decode(data, classes: dict | None = None):
    classes = classes or _classes()
    if isinstance(data, list):
        return [x if type(x) not in _NESTED else decode(x, classes) for x in data]
    if not isinstance(data, dict):
        return data
    if "~t" in data:
        return tuple(decode(x, classes) for x in data["~t"])
    if "~s" in data:
        return set(decode(x, classes) for x in data["~s"])
    if "~d" in data:
        return {decode(k, classes): decode(v, classes) for k, v in data["~d"]}
    if "~e" in data:
        return classes[data["~e"]](data["v"])
    cls = classes[data["~o"]]
    obj = object.__new__(cls)
    obj.__dict__.update(_defaults(cls))  # a field added since the checkpoint was written (RunView.lost_nodes)
    # a plain value (most of a rank's fields) is itself: no call per field (a runs list decodes hundreds)
    obj.__dict__.update({k: v if type(v) not in _NESTED else decode(v, classes) for k, v in data["v"].items()})
    return obj


def _defaults(cls) -> dict:
    """A dataclass's fields at their defaults (none for another class); mutable ones made anew."""
    fixed, made = _default_parts(cls)
    return dict(fixed, **{name: factory() for name, factory in made}) if made else dict(fixed)


@functools.lru_cache(maxsize=None)
def _default_parts(cls) -> tuple[dict, tuple]:
    """(the fields' plain defaults, (name, factory) of the others), once per class."""
    if not dataclasses.is_dataclass(cls):
        return {}, ()
    fixed, made = {}, []
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            fixed[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            made.append((f.name, f.default_factory))
    return fixed, tuple(made)


def path_of(events_path: str | Path) -> Path:
    return Path(events_path).with_name(NAME)


def summary_path_of(events_path: str | Path) -> Path:
    return Path(events_path).with_name(SUMMARY_NAME)


def row_view(view):
    """A copy of `view` without what no row of a runs list shows (the curves, logs, errors, stacks,
    node samples, each rank's step windows): its status, progress, epochs, best and root cause are
    the view's, and events folded into it after change them as they change the view's."""
    row = copy.copy(view)
    row.steps, row.step_acc = Thinned(view.steps.cap), Thinned(view.step_acc.cap)
    row.step_t = None if view.step_t is None else Thinned(view.step_t.cap)
    row.step_metrics, row.logs, row.errors, row.stacks, row.fleet = {}, [], [], None, Fleet()
    row._traceback_lines = {}
    row.ranks = {k: copy.copy(st) for k, st in view.ranks.items()}
    for st in row.ranks.values():
        st._windows = []
    return row


def _fingerprint(fh, offset: int) -> str:
    start = max(0, offset - FINGERPRINT_BYTES)
    fh.seek(start)
    return hashlib.sha1(fh.read(offset - start)).hexdigest()


def state(view, offset: int, history=(), malformed: int = 0) -> dict:
    """What save() writes, made where the view cannot change under it (the supervisor's lock).
    malformed: the lines before `offset` that were not events (a reader's count goes on from it)."""
    return {"schema": SCHEMA, "offset": int(offset), "malformed": int(malformed),
            "history": [list(h) for h in history], "view": encode(view), "row": encode(row_view(view))}


def save(events_path: str | Path, st: dict) -> bool:
    """Write a checkpoint made by state(), its offset checked to be a line start of the file and
    fingerprinted, then its row summary (the same offset and fingerprint); False (and nothing
    written) where it is not, or the directory is not writable."""
    events_path = Path(events_path)
    try:
        with open(events_path, "rb") as fh:
            offset = st["offset"]
            if offset > os.fstat(fh.fileno()).st_size or not _line_start(fh, offset):
                log.warning("%s: not written: offset %d is not a line start of %s", NAME, offset, events_path)
                return False
            st = dict(st, fingerprint=_fingerprint(fh, offset))
        row = st.pop("row", None)
        text = json.dumps(st, separators=(",", ":"), allow_nan=True)
        row_text = None if row is None else json.dumps(dict(st, view=row), separators=(",", ":"), allow_nan=True)
        with _WRITING:
            write_atomic(path_of(events_path), text)
            if row_text is not None:  # after the checkpoint: a summary is never newer than it
                write_atomic(summary_path_of(events_path), row_text)
        return True
    except (OSError, TypeError, ValueError) as exc:
        log.info("%s: not written (%s)", NAME, exc)
        return False


def _line_start(fh, offset: int) -> bool:
    if offset == 0:
        return True
    fh.seek(offset - 1)
    return fh.read(1) == b"\n"


def load(events_path: str | Path, history=()):
    """(RunView, offset, malformed lines before it) from the checkpoint beside `events_path`, or None where there is none or it
    cannot be trusted (said in a log line). `history`: the (run, step) pairs a follower would add
    to its view first (a resumed run's earlier parts); a checkpoint made with others is not used
    (None: any will do, for a summary that draws no curves)."""
    return _load(Path(events_path), path_of(events_path), history)


def load_row(events_path: str | Path):
    """(row view, offset, malformed) from the row summary beside `events_path` (row_view's view of
    the events before offset), or None as load() says for a checkpoint: a runs list's row of a run
    without one, or with one it cannot trust, is made the old way."""
    return _load(Path(events_path), summary_path_of(events_path), None)


def _load(events_path: Path, p: Path, history):
    try:
        text = p.read_text()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        log.warning("%s ignored: unreadable (%s)", p, exc)
        return None
    try:
        st = json.loads(text)
        if not isinstance(st, dict) or st.get("schema") != SCHEMA:
            log.warning("%s ignored: schema %r, not %d", p, st.get("schema") if isinstance(st, dict) else None, SCHEMA)
            return None
        offset = st["offset"]
        if history is not None and [list(h) for h in history] != st["history"]:
            log.info("%s ignored: made for another resume history", p)
            return None
        reason = _check(events_path, offset, st["fingerprint"])
        if reason:
            log.warning("%s ignored: %s", p, reason)
            return None
        view, malformed = decode(st["view"]), int(st.get("malformed", 0))
        if type(view).__name__ != "RunView":
            raise TypeError("not a view")
    except (ValueError, TypeError, KeyError, AttributeError, IndexError, RecursionError) as exc:
        log.warning("%s ignored: corrupt (%s: %s)", p, type(exc).__name__, exc)
        return None
    return view, offset, malformed


def _check(events_path: Path, offset, fingerprint) -> str:
    """Why the checkpoint does not fit the file ("" when it does)."""
    if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
        return f"offset {offset!r}"
    try:
        with open(events_path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if offset > size:
                return f"offset {offset} past the end of {events_path.name} ({size} bytes)"
            if not _line_start(fh, offset):
                return f"offset {offset} is not at a line start"
            if _fingerprint(fh, offset) != fingerprint:
                return f"{events_path.name} before offset {offset} is not what it covered"
    except OSError as exc:
        return str(exc)
    return ""
