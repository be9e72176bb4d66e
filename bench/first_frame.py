"""11. The app's first frame in the terminal users have, 80x24, side by side with a Textual hello
world (the floor any Textual app stands on: Python, Textual's import, one screen), alternating,
both started the same way in a real pseudo-terminal. The first frame is the moment the screen's
last line (torchdeck: its key bar; hello world: its text) has been written. Target: torchdeck
<= 1.25x the hello world."""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from bench import common as C
from bench.ptyterm import PtyProcess, visible

NAME = "first_frame"
TARGET = 1.25
COLS, ROWS = 80, 24

HELLO = '''\
from textual.app import App
from textual.widgets import Static


class Hello(App):
    def compose(self):
        yield Static("Hello, world! (a Textual hello world)")


Hello().run()
'''


def _env(tmp: Path) -> dict:
    """Both programs as installed: with their bytecode caches (pip writes them for an installed
    package, Python for a checkout), which PYTHONDONTWRITEBYTECODE would deny torchdeck's modules
    alone here (Textual's come precompiled in site-packages); the warm-up run writes them."""
    env = dict(os.environ, TORCHDECK_RUNS=str(tmp / "runs"), TORCHDECK_PRESETS=str(tmp / "presets"))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPATH"] = os.pathsep.join([str(C.ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def frame_time(argv: list[str], marker: str, env: dict, timeout: float = 60) -> float:
    """Seconds from process start until `marker` has been written to the terminal."""
    p = PtyProcess(argv, env, cols=COLS, rows=ROWS, cwd=str(C.ROOT))
    seen = ""
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = p.read(1.0)
            if got is None:
                if p.proc.poll() is not None:
                    break
                continue
            t, data = got
            seen += visible(data)
            if marker in seen.replace(" ", ""):
                return t - p.t_start
    finally:
        p.close()
    raise RuntimeError(f"{' '.join(argv)}: {marker!r} never shown; saw {' '.join(seen.split())[-500:]}")


def run(quick: bool = False, reps: int = 3) -> dict:
    reps = max(reps, 1) if quick else max(reps, 7)  # quick: one pair after the warm-up (each start ~0.7 CPU-s)
    tmp = C.tmpdir(NAME)
    hello = tmp / "hello.py"
    hello.write_text(HELLO)
    env = _env(tmp)
    exe = Path(sys.executable).with_name("torchdeck")
    deck = [str(exe)] if exe.exists() else [sys.executable, "-m", "torchdeck.cli"]
    frame_time([sys.executable, str(hello)], "Hello,world!", env)  # warm the file cache for both
    frame_time(deck, "Launch", env)
    td, hw = C.alternate(reps, lambda: frame_time(deck, "Launch", env),
                         lambda: frame_time([sys.executable, str(hello)], "Hello,world!", env))
    t, h = C.median(td), C.median(hw)
    ratio = t / h if t and h else None
    paired = C.median([a / b for a, b in zip(td, hw)])
    text = C.table(f"{NAME}: first frame in an {COLS}x{ROWS} pty, median of {reps}, alternating",
                   ["program", "first frame s", "runs"],
                   [["Textual hello world", h, " ".join(f"{x:.2f}" for x in hw)],
                    ["torchdeck (Configure screen)", t, " ".join(f"{x:.2f}" for x in td)]])
    text += (f"\ntorchdeck/hello world {C.fmt(ratio)} (paired {C.fmt(paired)}; target <= {TARGET}: "
             f"{C.verdict(ratio, TARGET, higher_is_better=False)})")
    return {"name": NAME, "text": text, "reps": reps, "torchdeck_s": td, "hello_s": hw, "ratio": ratio,
            "paired": paired,
            "targets": [{"what": "first frame torchdeck/hello world (80x24)", "value": ratio,
                         "target": f"<= {TARGET}", "verdict": C.verdict(ratio, TARGET, higher_is_better=False)}]}
