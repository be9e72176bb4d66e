"""The real `torchdeck` in a real terminal (tmux): keys in, screen text out, as a person sees it."""
from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TORCHDECK = Path(sys.executable).with_name("torchdeck")

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")

TINY = """\
schema_version: 1
name: tiny
description: "e2e: 2 DDP ranks over gloo, one short epoch"
strategy: ddp
accelerator: cpu
devices: 2
backend: gloo
nodes: {master_port: 0}
data: {dataset: synthetic, train_size: 512, val_size: 128}
train: {batch_size: 64, epochs: 1, log_every_n_steps: 1}
"""


class Tmux:
    def __init__(self, env: dict):
        self.name = f"td-{uuid.uuid4().hex[:8]}"
        self.env = env
        self.starts = 0
        self.tmux = ["tmux", "-L", self.name]

    def _new_server(self):
        # A server of its own for each start (-L): killing a server's last session stops it a moment
        # later, and a new-session sent to it then fails with "server exited unexpectedly" (a test
        # that killed and started again, or another test process on the shared default server).
        self.starts += 1
        self.tmux = ["tmux", "-L", f"{self.name}-{self.starts}"]

    def start(self, command: str, width=120, height=40):
        # A running tmux server gives new panes its own environment, not ours: pass ours explicitly.
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items())
        self._new_server()
        subprocess.run([*self.tmux, "new-session", "-d", "-s", self.name, "-x", str(width), "-y", str(height),
                        f"cd {shlex.quote(str(ROOT))} && env {env} {command}"], check=True, cwd=ROOT)

    def keys(self, *keys: str):
        subprocess.run([*self.tmux, "send-keys", "-t", self.name, *keys], check=True)

    def screen(self) -> str:
        out = subprocess.run([*self.tmux, "capture-pane", "-p", "-t", self.name], capture_output=True, text=True)
        return out.stdout

    def wait_for(self, text: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        screen = ""
        while time.monotonic() < deadline:
            screen = self.screen()
            if text in screen:
                return screen
            time.sleep(0.25)
        raise AssertionError(f"{text!r} not on screen after {timeout:.0f} s; screen:\n{screen}")

    def alive(self) -> bool:
        return subprocess.run([*self.tmux, "has-session", "-t", self.name], capture_output=True).returncode == 0

    def kill(self):
        subprocess.run([*self.tmux, "kill-server"], capture_output=True)


@pytest.fixture
def term(tmp_path):
    presets = tmp_path / "presets"
    presets.mkdir()
    (presets / "tiny.yaml").write_text(TINY)
    env = {"TORCHDECK_RUNS": str(tmp_path / "runs"), "TORCHDECK_PRESETS": str(presets),
           "PATH": os.environ.get("PATH", "")}
    t = Tmux(env)
    yield t
    t.kill()
    from torchdeck.engine.runs.control import kill
    from torchdeck.engine.rundir.layout import list_runs

    for run in list_runs(tmp_path / "runs"):
        if run.is_live():
            kill(run)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_launch_from_the_app_until_finished(term, tmp_path):
    # `torchdeck` with no arguments opens the default preset; `torchdeck app tiny` opens ours.
    term.start(f"{TORCHDECK} app tiny; echo EXITED $?; sleep 600")
    screen = term.wait_for("global batch 128", timeout=60)
    assert "preset tiny (user)" in screen
    assert "$ torchdeck run tiny" in screen
    term.keys("F5")
    runs = tmp_path / "runs"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not (runs.is_dir() and any(runs.iterdir())):
        time.sleep(0.2)
    assert runs.is_dir() and any(runs.iterdir()), "F5 started no run:\n" + term.screen()
    screen = term.wait_for("FINISHED", timeout=150)  # the Monitor's status badge
    assert "ETA done" in screen
    import re

    rows = re.findall(r"^│ ([01]) .* 4/4 ", screen, re.M)  # rank rows, at whatever width tmux gave us
    assert rows == ["0", "1"], screen  # 512 samples / 2 ranks / batch 64 = 4 steps each
    term.keys("C-q")
    time.sleep(0.5)
    if "EXITED" not in term.screen():  # the monitor may keep ctrl+q for leave; go back and quit
        term.keys("Escape")
        time.sleep(0.5)
        term.keys("C-q")
    term.wait_for("EXITED 0", timeout=20)
    run = next(runs.iterdir())
    import json

    assert json.loads((run / "status.json").read_text())["status"] == "finished"


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_footer_has_no_residue_with_a_dropdown_open_at_80x24(term):
    """Issue 14 bug 8, in a real terminal: with a dropdown open the footer's keys overflow 80
    columns; the last column used to show a letter of the keys beneath (`^p paletteu`)."""
    term.start(f"{TORCHDECK} app tiny", width=80, height=24)
    term.wait_for("global batch 128", timeout=60)
    settle()
    term.keys("Enter")  # the form opens on strategy; Enter opens its list
    screen = term.wait_for("Dismiss menu", timeout=20)
    footer = screen.rstrip("\n").splitlines()[-1]
    assert footer.rstrip().endswith("▏^p palette"), repr(footer)
    term.keys("Escape")
    time.sleep(0.5)
    assert term.screen().rstrip("\n").splitlines()[-1].rstrip().endswith("▏^p palette")


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_form_sections_by_keys_at_80x24(term):
    """Issue 14 rough edge 4, in a real terminal: the essentials are the first screen, and the keys
    that jump between sections arrive through tmux (Ctrl+G then a digit, Ctrl+Down)."""
    term.start(f"{TORCHDECK} app tiny", width=80, height=24)
    term.wait_for("global batch 128", timeout=60)
    screen = term.wait_for("precision", timeout=20)  # the section follows the first frame
    lines = [ln.strip() for ln in screen.splitlines()]
    assert "Essentials" in lines[:3], screen
    for label in ("strategy", "devices", "model", "dataset", "batch size", "lr", "epochs", "precision"):
        assert any(ln.startswith(label + " ") for ln in lines), f"{label} not on the first screen:\n{screen}"
    settle()
    term.keys("C-g")
    term.wait_for("Go to section", timeout=20)
    settle(0.5)
    term.keys("6")  # 2 is Where (this host or SLURM)
    screen = wait_for_top(term, "Optimization")
    assert "Essentials" not in screen and "optimizer" in screen, screen
    term.keys("C-Down")
    screen = wait_for_top(term, "Precision & speed")
    assert screen.rstrip("\n").splitlines()[-1].rstrip().endswith("▏^p palette"), screen  # footer fits


def settle(seconds: float = 2.0) -> None:
    """Keys sent the moment text appears can beat the focus to its widget (a person's first key
    comes later): the form mounts its later sections and takes focus in its first second."""
    time.sleep(seconds)


def wait_for_top(term, title: str, timeout: float = 20) -> str:
    """Wait until the form's first line under the preset bar is this section's title."""
    deadline = time.monotonic() + timeout
    while True:
        screen = term.screen()
        body = [ln.strip().split("  ")[0] for ln in screen.splitlines()[1:]]  # the scrollbar cut off
        top = next((ln for ln in body if ln), "")
        if top == title:
            return screen
        if time.monotonic() > deadline:
            raise AssertionError(f"{title!r} is not the top section after {timeout:.0f} s:\n{screen}")
        time.sleep(0.25)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_headless_progress_fits_an_80_column_terminal_and_redraws_in_place(term, tmp_path):
    """Issue 14 bug 1: `torchdeck run` in an 80-column tmux printed ~108-column rank lines; they
    wrapped and the in-place redraw repeated the header down the screen. Now every line fits, the
    header is on screen once while it runs, and a resize to 60 columns redraws at that width."""
    # 3,000 epochs: 30 ended on their own in 7 s, before the screen was read (only Ctrl-C ends it)
    slow = TINY.replace("epochs: 1", "epochs: 3000").replace("train_size: 512", "train_size: 2048")
    (tmp_path / "presets" / "slowtiny.yaml").write_text(slow)
    term.start(f"{TORCHDECK} run slowtiny; echo EXITED $?; sleep 600", width=80, height=24)
    term.wait_for("RUNNING", timeout=120)
    time.sleep(3)  # several redraws
    screen = term.screen()
    lines = screen.splitlines()
    assert sum(ln.startswith(("RUNNING", "STARTING")) for ln in lines) == 1, screen
    assert sum(ln.startswith("rank  0") for ln in lines) == 1, screen
    block = [ln for ln in lines if ln.startswith(("RUNNING", "STARTING", "rank  "))]
    assert len(block) == 3 and all(len(ln) < 80 for ln in block), screen
    subprocess.run([*term.tmux, "resize-window", "-t", term.name, "-x", "60", "-y", "24"], check=True)
    time.sleep(2)
    screen = term.screen()
    block = [ln for ln in screen.splitlines() if ln.startswith(("RUNNING", "rank  "))]
    assert block and all(len(ln) < 60 for ln in block), screen
    assert sum(ln.startswith("RUNNING") for ln in screen.splitlines()) == 1, screen
    term.keys("C-c")
    term.wait_for("EXITED 0", timeout=120)  # a graceful stop exits 0
    assert "run stopped" in term.screen()


def test_runs_and_presets_lists_fit_an_80_column_terminal(term, tmp_path):
    """`torchdeck runs` at 80 columns wrapped each run onto two lines (~105 columns of cells): it
    now leaves columns out (the start time first: it is in the run's name) and says which.
    `torchdeck presets` cuts the descriptions that wrapped."""
    from tests.app.test_compare_screen import make_comparison

    where = make_comparison(tmp_path / "runs")
    term.start(f"{TORCHDECK} presets | grep ddp-gpu; echo EXITED $?; sleep 60",
               width=80, height=24)
    screen = term.wait_for("EXITED 0", timeout=60)
    full = [ln for ln in screen.splitlines() if ln.startswith("ddp-gpu")]
    assert len(full) == 1 and len(full[0]) >= 80, screen  # into a pipe: whole (it wraps here)
    term.kill()
    term.start(f"{TORCHDECK} presets; echo EXITED $?; sleep 60", width=80, height=24)
    screen = term.wait_for("EXITED 0", timeout=60)
    line = next(ln for ln in screen.splitlines() if ln.startswith("ddp-gpu"))
    assert len(line) <= 80 and line.endswith("…"), screen
    term.kill()
    term.start(f"{TORCHDECK} runs; echo EXITED $?; sleep 60", width=80, height=24)
    screen = term.wait_for("EXITED 0", timeout=60)
    rows = [ln for ln in screen.splitlines() if ln.startswith("finished")]
    names = sorted(p.name for p in where.iterdir() if p.is_dir())
    assert len(rows) == len(names) == 3, screen
    for ln in rows:  # a whole row on one line: its run's name and its accuracy
        assert any(n in ln for n in names) and "%" in ln, screen
    assert "(left out at 80 columns: STARTED" in screen, screen


def test_validate_wraps_its_items_under_their_indent_at_80_columns(term):
    """`torchdeck validate` printed ~100-column items; the terminal wrapped them to column 0, where
    the rest read as a new item. Each item now wraps under its own indent."""
    term.start(f"{TORCHDECK} validate quickstart; echo EXITED $?; sleep 60", width=80, height=24)
    screen = term.wait_for("EXITED 0", timeout=60)
    lines = [ln for ln in screen.splitlines() if ln.strip()]
    assert lines[0] == "quickstart: valid" and lines[-1] == "EXITED 0", screen
    assert all(ln.startswith("  ") and len(ln) <= 80 for ln in lines[1:-1]), screen
    assert any(ln.startswith("    ") and "precision" in ln for ln in lines), screen  # one did wrap
