"""New lines of a run's text logs (rank<N>.log, supervisor.log): what the workers printed.

Read by the Monitor's reader thread next to events.jsonl. A file first seen is read from its
last few KB only (a finished run's logs can be long; the pane keeps the tail anyway).
"""
from __future__ import annotations

import re
from pathlib import Path

FIRST_BYTES = 16 * 1024
READ_BYTES = 64 * 1024
_RANK_LOG = re.compile(r"rank(\d+)\.log")


class _File:
    def __init__(self, size: int):
        self.pos = max(0, size - FIRST_BYTES)
        self.skip_first = self.pos > 0  # started mid-line: that piece is not a line
        self.partial = b""


class OutputTail:
    def __init__(self, run_path: str | Path):
        self.path = Path(run_path)
        self._files: dict[Path, _File] = {}

    def _paths(self) -> list[tuple[int | None, Path]]:
        out = []
        for p in self.path.glob("rank*.log"):
            m = _RANK_LOG.fullmatch(p.name)
            if m:
                out.append((int(m.group(1)), p))
        out.sort()
        return [(None, self.path / "supervisor.log")] + out

    def poll(self) -> list[tuple[int | None, str]]:
        """(rank or None for the supervisor, line) for every complete line written since the last poll."""
        out = []
        for rank, p in self._paths():
            try:
                size = p.stat().st_size
            except OSError:
                continue
            f = self._files.get(p)
            if f is None:
                f = self._files[p] = _File(size)
            if size < f.pos:  # truncated or replaced: start over
                f.pos, f.partial = 0, b""
            if size == f.pos:
                continue
            try:
                with open(p, "rb") as fh:
                    fh.seek(f.pos)
                    chunk = fh.read(READ_BYTES)
                    f.pos = fh.tell()
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
                    out.append((rank, text))
        return out
