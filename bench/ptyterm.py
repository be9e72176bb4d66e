"""A real pseudo-terminal for timing a Textual program as a user sees it: what it writes, when."""
from __future__ import annotations

import fcntl
import os
import re
import select
import signal
import struct
import subprocess
import termios
import time

_ESC = re.compile(rb"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[P^_][^\x1b]*\x1b\\|\x1b[@-Z\\-_]")


def visible(data: bytes) -> str:
    """Text a terminal would print, escape sequences turned into spaces (so numbers stay apart)."""
    return _ESC.sub(b" ", data).decode("utf-8", "ignore")


class PtyProcess:
    def __init__(self, argv: list[str], env: dict | None = None, cols: int = 140, rows: int = 45,
                 cwd: str | None = None):
        master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        e = dict(os.environ if env is None else env)
        e.setdefault("TERM", "xterm-256color")
        e.setdefault("COLORTERM", "truecolor")
        self.t_start = time.time()
        self.proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=e, cwd=cwd,
                                     start_new_session=True, close_fds=True)
        os.close(slave)
        self.master = master
        self.bytes = 0

    def read(self, timeout: float) -> tuple[float, bytes] | None:
        """(time the chunk arrived, chunk), or None when nothing came within timeout or it closed."""
        r, _, _ = select.select([self.master], [], [], timeout)
        if not r:
            return None
        try:
            data = os.read(self.master, 1 << 16)
        except OSError:
            return None
        if not data:
            return None
        self.bytes += len(data)
        return time.time(), data

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(5)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait(5)
        try:
            os.close(self.master)
        except OSError:
            pass


def first_screen(argv: list[str], env: dict | None = None, min_chars: int = 300, quiet_s: float = 0.3,
                 timeout: float = 60, cwd: str | None = None) -> dict:
    """Seconds from process start until the screen holds min_chars printed characters (first
    paint), and until output then stays quiet for quiet_s (settled; the quiet time not counted)."""
    p = PtyProcess(argv, env, cwd=cwd)
    chars, first, last, text = 0, None, None, []
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = p.read(quiet_s if first is not None else 1.0)
            if got is None:
                if first is not None or p.proc.poll() is not None:
                    break
                continue
            t, data = got
            vis = visible(data)
            text.append(vis)
            chars += sum(1 for c in vis if not c.isspace())
            last = t
            if first is None and chars >= min_chars:
                first = t
    finally:
        p.close()
    return {"first_paint_s": None if first is None else first - p.t_start,
            "settled_s": None if last is None or first is None else last - p.t_start,
            "bytes": p.bytes, "text": "".join(text)}
