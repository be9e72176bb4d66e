"""Lines the CLI prints in an 80-column terminal wrap between words, under an indent, never inside
a word or a path (QA of issue 35, item 14): `runs`' root causes, the Ctrl-C stop and detach lines."""
import json
import os
import pty
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from torchdeck.engine import config as cfgmod
from torchdeck.engine import events
from torchdeck.engine.rundir.layout import RunDir

TORCHDECK = Path(sys.executable).with_name("torchdeck")


def in_a_pty(args: list[str], cwd: Path, columns: int = 80, timeout: float = 60) -> tuple[int, str]:
    """The real `torchdeck` in a terminal `columns` wide (a pty: the CLI wraps only there)."""
    main, sub = pty.openpty()
    env = dict(os.environ, COLUMNS=str(columns), LINES="24", TORCHDECK_RUNS=str(cwd / "runs"))
    cmd = [str(TORCHDECK)] if TORCHDECK.exists() else [sys.executable, "-m", "torchdeck.cli"]
    proc = subprocess.Popen(cmd + args, stdout=sub, stderr=sub, stdin=subprocess.DEVNULL, cwd=cwd, env=env)
    os.close(sub)
    chunks = []
    while True:
        try:
            data = os.read(main, 65536)
        except OSError:  # EIO: the child closed its end
            break
        if not data:
            break
        chunks.append(data)
    os.close(main)
    return proc.wait(timeout=timeout), b"".join(chunks).decode(errors="replace").replace("\r\n", "\n")


def test_runs_root_cause_lines_wrap_between_words_at_80_columns(tmp_path):
    """`runs` printed a failed run's root cause whole, so an 80-column terminal cut it mid-word
    (`...every process of the ru` / `n)`, `/tmp/qa/w` / `/raises.py`)."""
    script = tmp_path / "some" / "project" / "folder" / "w" / "raises.py"
    cause = (f"rank 1 raised ValueError: bad batch at step 30 (File {script}, line 12; "
             "the supervisor stopped every process of the run)")
    run = RunDir.create(cfgmod.from_dict({"name": "raises"}), tmp_path / "runs")
    evs = [events.make("run_started", strategy="cpu", world_size=2, total_steps=40, global_batch=64,
                       devices=["cpu", "cpu"]),
           events.make("run_finished", status="failed", exit_codes=[0, 1], root_cause=cause, elapsed_s=3.0)]
    run.events_path.write_text("".join(events.dumps(e) + "\n" for e in evs))
    run.status_path.write_text(json.dumps({"status": "failed", "exit_codes": [0, 1], "root_cause": cause}))
    rc, out = in_a_pty(["runs"], tmp_path)
    assert rc == 0, out
    start = out.index(f"{run.path.name}: rank 1 raised")
    block = out[start:out.index("(" + str(tmp_path / "runs"))].rstrip("\n").split("\n")
    for ln in block:
        assert len(ln) <= 80 or len(ln.split()) == 1, f"wider than the terminal: {ln!r}"
    assert all(ln.startswith("  ") for ln in block[1:]), block  # continuation lines under an indent
    words = " ".join(block).split()
    assert "run)" in words and any(str(script) in w for w in words), block  # whole words, the path whole


LOOP = """\
import os, time
r = int(os.environ["RANK"])
i = 0
while True:
    print(f"iter {i}: rank {r}", flush=True)
    i += 1
    time.sleep(0.3)
"""
BLOCK = re.compile(r"^(STARTING|RUNNING|STOPPING|STOPPED|FINISHED|FAILED) \||^rank  \d  ")


def _screen_until_exit(argv, cwd: Path, before_ctrl_c, cols: int = 80, rows: int = 60) -> list[str]:
    """Run `argv` in a real `cols`-wide pty, press Ctrl-C once `before_ctrl_c(shown lines)` holds,
    and return the screen's non-blank lines once it exited."""
    from bench.ptyterm import PtyProcess, Screen

    p = PtyProcess(argv, dict(os.environ, TORCHDECK_RUNS=str(cwd / "runs")), cols=cols, rows=rows, cwd=str(cwd))
    screen = Screen(cols, rows)
    shown = lambda: [ln.rstrip() for ln in screen.text() if ln.strip()]  # noqa: E731

    def until(cond, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = p.read(0.2)
            if got is not None:
                screen.feed(got[1])
            if cond():
                return True
            if got is None and p.proc.poll() is not None:
                return cond()
        return False

    try:
        assert until(lambda: before_ctrl_c(shown()), 60), "\n".join(shown())
        os.killpg(p.proc.pid, signal.SIGINT)  # what Ctrl-C sends to the foreground process group
        assert until(lambda: p.proc.poll() is not None, 60), "\n".join(shown())
        until(lambda: False, 0.3)  # the last bytes
    finally:
        p.close()
    return shown()


def _words(lines: list[str]) -> str:
    return " ".join(" ".join(lines).split())


def test_ctrl_c_stop_line_and_attach_detach_line_fit_80_columns():
    """The stop line was 81 characters (`...; Ctrl-C again to kil` / `l` at 80 columns) and attach's
    detach line wrapped mid-path above the frozen live block. Both now fit, between words, and
    the detach line comes below the (closed) block. A short folder: the path fits a line."""
    cwd = Path(tempfile.mkdtemp(prefix="td", dir="/tmp"))
    exe = str(TORCHDECK)
    try:
        (cwd / "loop.py").write_text(LOOP)
        lines = _screen_until_exit([exe, "launch", "--nproc-per-node", "2", "loop.py"], cwd,
                                   lambda shown: any(ln.startswith("rank  1") for ln in shown))
        start = next(i for i, ln in enumerate(lines) if ln.startswith("stopping:"))
        end = next(i for i, ln in enumerate(lines) if i > start and not ln.startswith("  "))
        said = lines[start:end]
        assert "Ctrl-C again to kill" in _words(said) and all(len(ln) < 80 for ln in said), "\n".join(lines)

        r = subprocess.run([exe, "launch", "--nproc-per-node", "2", "--detach", "loop.py"], cwd=cwd,
                           env=dict(os.environ, TORCHDECK_RUNS=str(cwd / "runs")), capture_output=True, text=True,
                           timeout=60, stdin=subprocess.DEVNULL)
        assert r.returncode == 0, r.stdout + r.stderr
        run = max((cwd / "runs").iterdir(), key=lambda p: p.name)
        try:
            lines = _screen_until_exit([exe, "attach", str(run)], cwd,
                                       lambda shown: any(ln.startswith("rank  1") for ln in shown))
        finally:
            subprocess.run([exe, "stop", "--kill", str(run)], cwd=cwd, capture_output=True, timeout=60,
                           env=dict(os.environ, TORCHDECK_RUNS=str(cwd / "runs")))
        assert "attached to " + str(run) + " (Ctrl-C detaches; the run goes on)" in _words(lines), "\n".join(lines)
        start = next(i for i, ln in enumerate(lines) if ln.startswith("detached;"))
        said = lines[start:]
        assert f"Re-attach with: torchdeck attach {run}" in _words(said), "\n".join(lines)
        assert all(len(ln) < 80 for ln in said), "\n".join(lines)
        assert not any(BLOCK.match(ln) for ln in said), "\n".join(lines)  # no block below it
        for old in (cwd / "runs").iterdir():
            subprocess.run([exe, "stop", "--kill", str(old)], cwd=cwd, capture_output=True, timeout=60,
                           env=dict(os.environ, TORCHDECK_RUNS=str(cwd / "runs")))
    finally:
        shutil.rmtree(cwd, ignore_errors=True)
