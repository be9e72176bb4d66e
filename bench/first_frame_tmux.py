"""The first frame in a real 80x24 tmux, as issue 17 first measured it (bench/first_frame.py uses a
pty of its own): `torchdeck` and a Textual hello world, alternating, each timed from the moment its
shell execs it to the moment tmux's pane output (piped to a reader) holds its mark ("Launch" in
the key bar, "Hello, world!").

    .venv/bin/python -m bench.first_frame_tmux [--rounds 15]

Needs tmux. Each round starts a fresh tmux session; the reader is started by `tmux pipe-pane` and
its own start overlaps the program's, for both programs alike.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench import common as C
from bench import first_frame as F

READER = r'''
import os, re, sys, time
marker, out = sys.argv[1], sys.argv[2]
seen, fd = "", sys.stdin.fileno()
while True:
    b = os.read(fd, 65536)
    if not b:
        break
    seen += re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]|\x1b[()][A-Z0-9]|\x1b[=>]|\s", "", b.decode("utf-8", "replace"))
    if marker in seen:
        open(out, "w").write(repr(time.time()))
        break
while os.read(fd, 65536):
    pass
'''


# A tmux server of its own: the default one is shared with whatever else uses tmux (the e2e tests).
TMUX = ["tmux", "-L", f"ffbench-{os.getpid()}"]


def one(tmp: Path, cmd: str, marker: str, timeout: float = 30) -> float:
    t0, t1 = tmp / "t0", tmp / "t1"
    for f in (t0, t1):
        f.unlink(missing_ok=True)
    stamp = f"{sys.executable} -c 'import time; open(\"{t0}\", \"w\").write(repr(time.time()))'"
    subprocess.run([*TMUX, "new-session", "-d", "-s", "ffbench", "-x", "80", "-y", "24",
                    f"sleep 0.3; {stamp}; cd {C.ROOT} && exec {cmd}"], check=True)
    try:
        subprocess.run([*TMUX, "pipe-pane", "-t", "ffbench", "-o",
                        f"{sys.executable} {tmp / 'reader.py'} {marker} {t1}"], check=True)
        deadline = time.monotonic() + timeout
        while not t1.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.05)
        return float(t1.read_text()) - float(t0.read_text())
    finally:
        subprocess.run([*TMUX, "kill-server"], capture_output=True)
        time.sleep(0.3)


def run(rounds: int = 15) -> dict:
    if not shutil.which("tmux"):
        return {"skipped": "no tmux"}
    tmp = C.tmpdir("first_frame_tmux")
    (tmp / "reader.py").write_text(READER)
    (tmp / "hello.py").write_text(F.HELLO)
    exe = Path(sys.executable).with_name("torchdeck")
    deck = str(exe) if exe.exists() else f"{sys.executable} -m torchdeck.cli"
    hello, td = C.alternate(rounds, lambda: one(tmp, f"{sys.executable} {tmp / 'hello.py'}", "Hello,world!"),
                            lambda: one(tmp, deck, "Launch"))
    h, t = statistics.median(hello), statistics.median(td)
    out = {"hello_s": hello, "torchdeck_s": td, "ratio": t / h,
           "paired": statistics.median([a / b for a, b in zip(td, hello)])}
    print(f"tmux 80x24, {rounds} rounds: hello world {h:.3f} s, torchdeck {t:.3f} s, "
          f"ratio {out['ratio']:.2f} (paired {out['paired']:.2f})")
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=15)
    run(p.parse_args().rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
