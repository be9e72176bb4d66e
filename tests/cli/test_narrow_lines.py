"""Lines the CLI prints in an 80-column terminal wrap between words, under an indent, never inside
a word or a path (QA of issue 35, item 14): `runs`' root causes, the Ctrl-C stop and detach lines."""
import json
import os
import pty
import subprocess
import sys
from pathlib import Path

from torchdeck.engine import config as cfgmod
from torchdeck.engine import events
from torchdeck.engine.runs.layout import RunDir

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
