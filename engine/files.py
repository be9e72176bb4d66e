"""Writing a file so that a reader sees the old text or the new, never half of either.

At the bottom of the engine (imports nothing of torchdeck): the schema, the run directory, the
strategies and the app's export all write through it.
"""
from __future__ import annotations

import os
from pathlib import Path


def write_atomic(path: str | os.PathLike, text: str, durable: bool = False) -> None:
    """`text` into a temp file beside `path` (.NAME.tmp-PID: two writers never share one), then
    renamed over it. durable: flushed to disk before the rename, so a crash cannot leave an empty
    file where a whole one was (a preset a person wrote)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w") as fh:
            fh.write(text)
            if durable:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise
