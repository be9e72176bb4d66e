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
import unicodedata

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


_SEQ = re.compile(r"\x1b\[([0-?]*)[ -/]*([@-~])|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[P^_][^\x1b]*\x1b\\|\x1b[@-Z\\-_]"
                  r"|[\r\n\b]|[^\x00-\x1f\x7f]+")
SYNC_QUERY, SYNC_YES = b"\x1b[?2026$p", b"\x1b[?2026;2$y"  # DECRQM for synchronized output, and 'supported'
SYNC_END = "\x1b[?2026l"


class Screen:
    """What a terminal shows, kept from a program's output: enough of xterm for Textual's frames
    (cursor moves, erases, text; colours are ignored). feed() returns True when a frame ended:
    at the end of a synchronized update when the program uses them (answer SYNC_QUERY with
    SYNC_YES, as a modern terminal does), else after every chunk."""

    def __init__(self, cols: int, rows: int):
        import codecs

        self.cols, self.rows = cols, rows
        self.cells = [[" "] * cols for _ in range(rows)]
        self.x = self.y = 0
        self.synced = False  # the program wraps its frames in synchronized updates
        self._decode = codecs.getincrementaldecoder("utf-8")("replace").decode
        self._rest = ""

    def text(self) -> list[str]:
        return ["".join(row) for row in self.cells]

    def feed(self, data: bytes) -> bool:
        s = self._rest + self._decode(data)
        esc = s.rfind("\x1b")
        self._rest = ""
        if esc >= 0 and not _SEQ.match(s, esc):  # a sequence cut by the read: keep it for the next
            s, self._rest = s[:esc], s[esc:]
        ended = False
        for m in _SEQ.finditer(s):
            tok = m.group(0)
            if m.group(2):
                self._csi(m.group(1), m.group(2))
                if tok == SYNC_END:
                    ended = True
                elif tok == "\x1b[?2026h":
                    self.synced = True
            elif tok[0] == "\x1b":
                continue
            elif tok == "\r":
                self.x = 0
            elif tok == "\n":
                if self.y == self.rows - 1:  # the bottom line: the screen scrolls up a line
                    del self.cells[0]
                    self.cells.append([" "] * self.cols)
                else:
                    self.y += 1
            elif tok == "\b":
                self.x = max(0, self.x - 1)
            else:
                self._put(tok)
        return ended or not self.synced

    def _put(self, text: str) -> None:
        row = self.cells[self.y]
        if text.isascii():  # most of a frame: one cell a character, no lookup (this runs beside the app timed)
            end = min(self.cols, self.x + len(text))
            if self.x < end:
                row[self.x:end] = text[:end - self.x]
            self.x += len(text)
            return
        for ch in text:
            if unicodedata.combining(ch):
                continue
            wide = unicodedata.east_asian_width(ch) in "WF"
            if self.x < self.cols:
                row[self.x] = ch
                if wide and self.x + 1 < self.cols:
                    row[self.x + 1] = ""
            self.x += 2 if wide else 1

    def _csi(self, params: str, final: str) -> None:
        if params.startswith("?") or final not in "HfABCDEFGdJK":
            return  # modes, colours: nothing a cell holds
        nums = [int(p) if p.isdigit() else 0 for p in params.split(";")] if params else []
        n = nums[0] if nums and nums[0] else 1
        if final in "Hf":
            self.y = min(self.rows, n) - 1
            self.x = min(self.cols, nums[1] if len(nums) > 1 and nums[1] else 1) - 1
        elif final == "A":
            self.y = max(0, self.y - n)
        elif final == "B":
            self.y = min(self.rows - 1, self.y + n)
        elif final in "EF":  # next / previous line, at its start
            self.y = min(self.rows - 1, self.y + n) if final == "E" else max(0, self.y - n)
            self.x = 0
        elif final == "C":
            self.x = min(self.cols - 1, self.x + n)
        elif final == "D":
            self.x = max(0, self.x - n)
        elif final == "G":
            self.x = min(self.cols, n) - 1
        elif final == "d":
            self.y = min(self.rows, n) - 1
        elif final == "J":
            mode = nums[0] if nums else 0
            rows = range(self.rows) if mode == 2 else range(self.y + 1, self.rows) if mode == 0 else range(self.y)
            for y in rows:
                self.cells[y] = [" "] * self.cols
            if mode in (0, 1):
                self._erase_line(mode)
        elif final == "K":
            self._erase_line(nums[0] if nums else 0)

    def _erase_line(self, mode: int) -> None:
        row = self.cells[self.y]
        lo, hi = (self.x, self.cols) if mode == 0 else (0, self.x + 1) if mode == 1 else (0, self.cols)
        for x in range(lo, min(hi, self.cols)):
            row[x] = " "
