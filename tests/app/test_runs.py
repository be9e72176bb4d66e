"""The Runs list, driven with Pilot over real run directories.

One run is real (a tiny CPU run started the way the app starts one, through engine.runs.control);
failed, stopped, live and lost runs are written with RunDir's own API, a "live" one by pointing
supervisor.pid at a real sleeping child process.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from textual.widgets import DataTable

from torchdeck.app.main import TorchdeckApp
from torchdeck.app.runs.screen import RunsScreen
from torchdeck.app.sources.nvml import FakeGPUSource
from torchdeck.engine import config as cfgmod
from torchdeck.engine import events
from torchdeck.engine.runs.catalog import HEAD_BYTES, TAIL_BYTES, collect, deletable, read_head_tail
from torchdeck.engine.rundir.layout import RunDir
from tests.app.screen_helpers import screen_text, until

SIZE = (80, 24)  # the smallest terminal we promise to be usable in
TINY = """\
name: tiny
strategy: cpu
model: {name: mlp, hidden: 32}
data: {dataset: synthetic, train_size: 256, val_size: 64, image_size: 16}
train: {batch_size: 32, epochs: 1, max_steps: 4, log_every_n_steps: 1}
"""


def tiny_cfg(name: str) -> cfgmod.RunConfig:
    cfg = cfgmod.loads(TINY)
    cfg.name = name
    return cfg


@pytest.fixture(scope="module")
def real_run(tmp_path_factory):
    """A real finished run, made once for the module: (runs root, run path)."""
    from torchdeck.engine.runs import control

    root = tmp_path_factory.mktemp("real") / "runs"
    run = control.start(tiny_cfg("real-tiny"), root)
    final = control.wait(run, timeout=240)
    assert final is not None and final["status"] == "finished", (final, (run.path / "supervisor.log").read_text())
    return root, run.path


def write_events(rd: RunDir, evs: list[dict]) -> None:
    with open(rd.events_path, "a") as fh:
        for ev in evs:
            fh.write(events.dumps(ev) + "\n")


def started_event(t0: float, strategy="ddp", world=2) -> dict:
    ev = events.make("run_started", run="x", strategy=strategy, world_size=world, total_steps=20)
    ev["t"] = t0
    return ev


def step_event(t: float, step: int, total: int = 20) -> dict:
    ev = events.make("step", rank=0, epoch=0, step=step, total_steps=total, loss=1.0)
    ev["t"] = t
    return ev


@pytest.fixture
def sleeper():
    """A real process to stand in for a live supervisor; reaped at the end."""
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    yield p
    if p.poll() is None:
        p.kill()
    p.wait(timeout=30)


def make_runs(root: Path, live_pid: int) -> dict[str, Path]:
    """failed, stopped, live and lost runs, as the supervisor would leave them."""
    t0 = time.time() - 3600
    out = {}

    rd = RunDir.create(tiny_cfg("broke"), root)
    write_events(rd, [started_event(t0), step_event(t0 + 5, 3)])
    rd.pid_path.write_text("999999999\n")
    rd.status_path.write_text(json.dumps({"status": "failed", "exit_codes": [1, -9], "root_cause": "rank 1 killed by signal 9 (SIGKILL)",
                     "elapsed_s": 12.5}))
    out["failed"] = rd.path

    rd = RunDir.create(tiny_cfg("halted"), root)
    ep = events.make("epoch_end", rank=0, epoch=0, step=7, train_loss=1.0, train_acc=0.4, val_loss=1.1, val_acc=0.5)
    write_events(rd, [started_event(t0 + 10), step_event(t0 + 20, 7), ep])
    rd.status_path.write_text(json.dumps({"status": "stopped", "exit_codes": [0, 0], "root_cause": None, "elapsed_s": 30.0}))
    out["stopped"] = rd.path

    rd = RunDir.create(tiny_cfg("going"), root)
    write_events(rd, [started_event(time.time() - 65, strategy="cpu", world=1), step_event(time.time(), 2)])
    rd.pid_path.write_text(f"{live_pid}\n")
    out["live"] = rd.path

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    rd = RunDir.create(tiny_cfg("vanished"), root)
    rd.pid_path.write_text(f"{dead.pid}\n")
    out["lost"] = rd.path
    return out


def make_app(root: Path) -> TorchdeckApp:
    return TorchdeckApp(runs_root=root, gpu_source=FakeGPUSource([]))


@pytest.fixture(autouse=True)
def presets_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHDECK_PRESETS", str(tmp_path / "presets"))


async def open_runs(pilot) -> RunsScreen:
    """F2 from the Configure screen, as a user gets there; wait for the first poll."""
    await pilot.press("f2")
    assert await until(pilot, lambda: isinstance(pilot.app.screen, RunsScreen))
    screen = pilot.app.screen
    assert await until(pilot, lambda: screen.loaded)
    return screen


def table_rows(screen) -> dict[str, dict[str, str]]:
    """What the table shows, by run directory name and column."""
    table = screen.query_one(DataTable)
    cols = [c.key.value for c in table.ordered_columns]
    out = {}
    for rk in table.rows:
        out[rk.value] = {c: str(v) for c, v in zip(cols, table.get_row(rk))}
    return out


def select(screen, path: Path) -> None:
    table = screen.query_one(DataTable)
    table.move_cursor(row=table.get_row_index(path.name))


def notes(app) -> list[str]:
    return [n.message for n in app._notifications]


# ------------------------------------------------------------------------------ tests


@pytest.mark.slow
async def test_lists_every_run_with_its_status(real_run, tmp_path, sleeper):
    real_root, real_path = real_run
    root = tmp_path / "runs"
    made = make_runs(root, sleeper.pid)
    # the real run's directory, copied in with what it wrote (events, status, logs, checkpoints)
    import shutil
    shutil.copytree(real_path, root / real_path.name)
    app = make_app(root)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_runs(pilot)
        rows = table_rows(screen)
        assert set(rows) == {real_path.name, *(p.name for p in made.values())}
        status = {k: v["status"] for k, v in rows.items()}
        assert status == {real_path.name: "finished", made["failed"].name: "failed",
                          made["stopped"].name: "stopped", made["live"].name: "running",
                          made["lost"].name: "lost"}

        real = rows[real_path.name]
        assert real["run"] == "real-tiny" and real["strategy"] == "cpu" and real["world"] == "1"
        assert real["progress"].startswith("4/4")  # max_steps 4, read from the events file's tail
        assert real["val"].endswith("%")
        final = json.loads((real_path / "status.json").read_text())
        m, s = divmod(int(final["elapsed_s"]), 60)
        assert real["duration"] == f"{m:02d}:{s:02d}"

        stopped = rows[made["stopped"].name]
        assert (stopped["strategy"], stopped["world"]) == ("ddp", "2")
        assert stopped["progress"] == "7/20" and stopped["val"] == "50.0%" and stopped["duration"] == "00:30"
        assert rows[made["live"].name]["duration"].startswith("01:")  # live: counted to now (65 s +)

        # newest first
        table = screen.query_one(DataTable)
        assert table.coordinate_to_cell_key((0, 0)).row_key.value == made["lost"].name  # made last

        select(screen, made["failed"])
        await pilot.pause(0.1)
        detail = str(screen.query_one("#run-detail").render())
        assert "rank 1 killed by signal 9" in detail and str(made["failed"]) in detail

        assert "runs, 1 live" in str(screen.query_one("#runs-header").render())


async def test_status_follows_the_run_without_a_keypress(tmp_path, sleeper):
    root = tmp_path / "runs"
    rd = RunDir.create(tiny_cfg("going"), root)
    rd.pid_path.write_text(f"{sleeper.pid}\n")
    app = make_app(root)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_runs(pilot)
        assert table_rows(screen)[rd.name]["status"] == "starting"  # alive, no training step yet
        write_events(rd, [step_event(time.time(), 1, 9)])
        assert await until(pilot, lambda: table_rows(screen)[rd.name]["status"] == "running", timeout=15)
        polls = screen.polls
        write_events(rd, [step_event(time.time(), 9, 9)])
        rd.status_path.write_text(json.dumps({"status": "finished", "exit_codes": [0], "root_cause": None, "elapsed_s": 75.0}))
        sleeper.kill()
        sleeper.wait()
        assert await until(pilot, lambda: table_rows(screen)[rd.name]["status"] == "finished", timeout=15)
        assert screen.polls > polls
        row = table_rows(screen)[rd.name]
        assert row["progress"] == "9/9" and row["duration"] == "01:15"


async def test_delete_asks_first_and_refuses_a_live_run(tmp_path, sleeper):
    root = tmp_path / "runs"
    made = make_runs(root, sleeper.pid)
    app = make_app(root)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_runs(pilot)

        select(screen, made["live"])
        await pilot.press("d")
        await pilot.pause(0.2)
        assert app.screen is screen  # no confirm dialog for a live run
        assert any("is live" in n and "stop it first" in n for n in notes(app))
        assert made["live"].is_dir()

        select(screen, made["stopped"])
        await pilot.press("d")
        assert await until(pilot, lambda: app.screen is not screen)
        assert made["stopped"].name in str(app.screen.query_one("#question").render())
        await pilot.press("n")  # changed my mind
        assert await until(pilot, lambda: app.screen is screen)
        await pilot.pause(0.3)
        assert made["stopped"].is_dir()

        select(screen, made["stopped"])
        await pilot.press("d")
        assert await until(pilot, lambda: app.screen is not screen)
        await pilot.press("y")
        assert await until(pilot, lambda: not made["stopped"].exists())
        assert await until(pilot, lambda: made["stopped"].name not in table_rows(screen))
        assert set(table_rows(screen)) == {made[k].name for k in ("failed", "live", "lost")}
        assert any(f"deleted {made['stopped'].name}" in n for n in notes(app))
        assert made["failed"].is_dir() and made["live"].is_dir()


async def test_enter_opens_the_run_in_the_monitor(tmp_path, sleeper):
    root = tmp_path / "runs"
    made = make_runs(root, sleeper.pid)
    app = make_app(root)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_runs(pilot)
        select(screen, made["stopped"])
        await pilot.press("enter")
        await pilot.pause(0.3)
        try:
            have_monitor = importlib.util.find_spec("torchdeck.app.monitor.screen") is not None
        except ImportError:
            have_monitor = False
        if not have_monitor:
            assert app.screen is screen
            assert any("Monitor screen is not available" in n for n in notes(app))
            pytest.skip("app.monitor.screen is not importable yet: only the message was checked")
        from torchdeck.app.monitor.screen import MonitorScreen

        assert await until(pilot, lambda: isinstance(app.screen, MonitorScreen))
        shown = getattr(app.screen, "run_path", None) or getattr(getattr(app.screen, "run_dir", None), "path", None)
        assert shown is not None and Path(shown) == made["stopped"]


async def test_escape_goes_back_and_empty_root_says_how_to_start(tmp_path):
    root = tmp_path / "nothing-here"
    app = make_app(root)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_runs(pilot)
        assert table_rows(screen) == {}
        detail = str(screen.query_one("#run-detail").render())
        assert f"No runs in {root}" in detail and "F5" in detail
        await pilot.press("d")  # nothing to delete: a message, not a crash
        await pilot.press("enter")
        await pilot.pause(0.2)
        assert notes(app).count("no run selected") == 2
        footer_keys = {b.binding.key for b in screen.active_bindings.values() if b.binding.show}
        assert {"enter", "d", "escape", "space", "c"} <= footer_keys
        await pilot.press("escape")
        assert await until(pilot, lambda: app.screen is app.configure_screen)


async def test_refresh_key_picks_up_a_new_run(tmp_path):
    root = tmp_path / "runs"
    app = make_app(root)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_runs(pilot)
        rd = RunDir.create(tiny_cfg("newcomer"), root)
        rd.status_path.write_text(json.dumps({"status": "finished", "exit_codes": [0], "root_cause": None, "elapsed_s": 3.0}))
        polls = screen.polls
        await pilot.press("r")
        assert await until(pilot, lambda: screen.polls > polls, timeout=5)
        assert table_rows(screen)[rd.name]["status"] == "finished"


def test_large_events_file_is_read_at_its_ends_only(tmp_path):
    """A long run's events: the head gives run_started, the tail the last step; a half-written
    last line (the supervisor mid-write) is ignored."""
    rd = RunDir.create(tiny_cfg("long"), tmp_path)
    t0 = time.time() - 7200
    evs = [started_event(t0, world=8)] + [step_event(t0 + i, i, 50_000) for i in range(1, 40_000)]
    write_events(rd, evs)
    with open(rd.events_path, "a") as fh:
        fh.write('{"v":1,"kind":"step","rank":0,"step":99999')  # no newline yet
    size = rd.events_path.stat().st_size
    assert size > 10 * (HEAD_BYTES + TAIL_BYTES)
    head, tail = read_head_tail(rd.events_path)
    assert head[0]["kind"] == "run_started" and tail[-1]["step"] == 39_999
    assert sum(len(events.dumps(e)) + 1 for e in head + tail) <= HEAD_BYTES + TAIL_BYTES
    (row,) = collect(tmp_path)
    assert row.world == 8 and row.progress == "39999/50000" and row.status == "running"  # young, no pid yet
    assert row.started == pytest.approx(t0)


def test_run_dir_without_supervisor_is_starting_then_lost(tmp_path):
    """No supervisor.pid yet: believable as starting for a minute, then it is lost, and deletable."""
    import os

    rd = RunDir.create(tiny_cfg("orphan"), tmp_path)
    (row,) = collect(tmp_path)
    assert row.status == "starting" and row.pid is None
    assert "still starting" in deletable(rd.path, tmp_path)
    old = time.time() - 3600
    os.utime(rd.config_path, (old, old))
    (row,) = collect(tmp_path)
    assert row.status == "lost"
    assert deletable(rd.path, tmp_path) is None
    other = tmp_path / "not-a-run"
    other.mkdir()
    assert "not a run directory" in deletable(other, tmp_path)
    assert "not a run directory" in deletable(rd.path, tmp_path / "elsewhere")


# ------------------------------------------------------------------------------ snapshot


def fixed_run(root: Path, dirname: str, evs: list[dict], status: dict | None = None,
              pid: int | None = None) -> RunDir:
    """A run directory with a fixed name and fixed times, so the picture never drifts."""
    rd = RunDir(root / dirname)
    rd.path.mkdir(parents=True)
    cfgmod.save(tiny_cfg(dirname.split("-", 2)[2]), rd.config_path)
    write_events(rd, evs)
    if pid is not None:
        rd.pid_path.write_text(f"{pid}\n")
    if status is not None:
        rd.status_path.write_text(json.dumps(status))
    return rd


@pytest.fixture
def snapshot_app(tmp_path, monkeypatch):
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    monkeypatch.chdir(tmp_path)  # a relative root: the header and the paths read the same anywhere
    t0 = 1_761_998_400.0  # 2025-11-01 12:00 UTC
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    root = Path("runs")
    ep = events.make("epoch_end", rank=0, epoch=3, step=40, train_loss=0.2, train_acc=0.95, val_loss=0.25,
                     val_acc=0.934)
    fixed_run(root, "20251101-120000-broke", [started_event(t0), step_event(t0 + 9, 3)],
              {"status": "failed", "exit_codes": [1, -9], "elapsed_s": 12.5,
               "root_cause": "rank 1 killed by signal 9 (SIGKILL): the OOM killer? see rank1.log"})
    fixed_run(root, "20251101-113000-halted", [started_event(t0 - 1800), step_event(t0 - 1790, 7)],
              {"status": "stopped", "exit_codes": [0, 0], "root_cause": None, "elapsed_s": 30.0})
    fixed_run(root, "20251101-110000-quickstart", [started_event(t0 - 3600), step_event(t0 - 3550, 40, 40), ep],
              {"status": "finished", "exit_codes": [0, 0], "root_cause": None, "elapsed_s": 52.3})
    fixed_run(root, "20251101-100000-vanished", [started_event(t0 - 7200, "cpu", 1), step_event(t0 - 7100, 12)],
              pid=dead.pid)
    yield TorchdeckApp(runs_root=root, gpu_source=FakeGPUSource([]))
    monkeypatch.undo()
    time.tzset()


async def _show_runs(pilot):
    await open_runs(pilot)
    await pilot.pause(0.2)


def test_runs_screen_80x24(snap_compare, snapshot_app):
    assert snap_compare(snapshot_app, terminal_size=(80, 24), run_before=_show_runs)


async def test_torchdeck_runs_and_the_runs_screen_say_the_same_of_every_run(tmp_path, sleeper, capsys):
    """One run of each status in one directory: the CLI's table and the app's rows agree on each
    (one catalog, one status rule, one formatter)."""
    from torchdeck.cli.main import main

    root = tmp_path / "runs"
    made = make_runs(root, sleeper.pid)
    rd = RunDir.create(tiny_cfg("waking"), root)  # alive, no step yet
    write_events(rd, [started_event(time.time())])
    rd.pid_path.write_text(f"{os.getpid()}\n")
    made["starting"] = rd.path
    rd = RunDir.create(tiny_cfg("done"), root)
    write_events(rd, [started_event(time.time() - 50), step_event(time.time() - 10, 20)])
    rd.write_final("finished", None, [0], 40.0)
    made["finished"] = rd.path
    assert main(["runs", "--runs-dir", str(root)]) == 0
    lines = capsys.readouterr().out.splitlines()
    cli_rows = {ln.split()[1]: ln.split()[0] for ln in lines[1:] if ln.split() and ln.split()[0] in (
        "starting", "running", "finished", "failed", "stopped", "lost")}
    app = make_app(root)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_runs(pilot)
        app_rows = {k: v["status"] for k, v in table_rows(screen).items()}
        cells = {r.key: r.cells() for r in screen.rows}
    assert cli_rows == app_rows
    assert {app_rows[p.name] for p in made.values()} == (set(made) | {"running"}) - {"live"}
    for key, c in cells.items():  # the same words in every column the two share
        line = next(ln for ln in lines if ln.split() and ln.split()[1] == key)
        for col in ("strategy", "duration", "progress"):
            if col == "duration" and app_rows[key] in ("starting", "running"):
                continue  # a live run's duration is read at two moments, a second apart under load
            assert c[col] in line, (key, col, c[col], line)


@pytest.mark.slow
async def test_resume_from_the_runs_list_starts_a_run_that_continues_it(tmp_path, real_run):
    """R on a run with a checkpoint: a new run directory that resumes it, watched in the Monitor.
    R on a run whose length is done (issue 27) is refused with the reason, and creates nothing."""
    import shutil

    _, real_path = real_run
    root = tmp_path / "runs"
    done = Path(shutil.copytree(real_path, root / real_path.name))  # finished: max_steps 4, all done
    more = Path(shutil.copytree(real_path, root / (real_path.name + "-more")))
    (more / "config.yaml").write_text((more / "config.yaml").read_text().replace("max_steps: 4", "max_steps: 6"))
    app = make_app(root)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_runs(pilot)
        select(screen, done)
        await pilot.press("R")
        assert await until(pilot, lambda: any("nothing left to train" in n for n in notes(app)), timeout=20), notes(app)
        assert sorted(p.name for p in root.iterdir()) == sorted([done.name, more.name])
        assert "train.max_steps=4 ends the run" in next(n for n in notes(app) if "nothing left" in n)
        select(screen, more)
        await pilot.press("R")
        assert await until(pilot, lambda: type(app.screen).__name__ == "MonitorScreen", timeout=20)
        new = Path(app.last_run)
        origin = json.loads((new / "origin.json").read_text())
        assert origin["resumed_from"] == str(more) and origin["checkpoint"].endswith("ckpt-00000004.pt")
        assert await until(pilot, lambda: app.screen.run_state.final, timeout=120)
        assert app.screen.run_state.status == "finished"
        assert [x for x, _ in app.screen.run_state.steps.points] == [1, 2, 3, 4, 5, 6]  # the old curve, then the new


# ------------------------------------------------------------------------------ navigation (issue 27)


async def test_r_from_a_monitor_goes_back_to_the_runs_list_it_came_from(tmp_path, sleeper):
    """F2, enter on a run, r: the app pushed a second Runs list, whose id the first one holds, and
    died (DuplicateIds). r now goes back to the list on the stack; enter on a run whose Monitor is
    on the stack goes back to that Monitor."""
    from torchdeck.app.monitor.screen import MonitorScreen

    root = tmp_path / "runs"
    made = make_runs(root, sleeper.pid)
    app = make_app(root)
    async with app.run_test(size=SIZE) as pilot:
        runs = await open_runs(pilot)
        select(runs, made["stopped"])
        await pilot.press("enter")
        assert await until(pilot, lambda: isinstance(app.screen, MonitorScreen))
        await pilot.press("r")
        assert await until(pilot, lambda: app.screen is runs)
        assert [type(s).__name__ for s in app.screen_stack] == ["ConfigureScreen", "RunsScreen"]
        await pilot.press("escape")
        assert await until(pilot, lambda: app.screen is app.configure_screen)

        # a Monitor opened from Configure (as Launch opens it), then r, then enter on its run
        monitor = MonitorScreen(made["stopped"])
        await app.push_screen(monitor)
        await pilot.press("r")
        assert await until(pilot, lambda: isinstance(app.screen, RunsScreen) and app.screen.loaded)
        select(app.screen, made["stopped"])
        await pilot.press("enter")
        assert await until(pilot, lambda: app.screen is monitor)
        assert [type(s).__name__ for s in app.screen_stack] == ["ConfigureScreen", "MonitorScreen"]


def _in_a_terminal(argv: list[str], env: dict, timeout: float = 60) -> tuple[int | None, str]:
    """(exit status, what it printed) of a command in a real 80x24 terminal (a pty); None when it
    was still running at the timeout (it is then closed)."""
    from bench.ptyterm import PtyProcess, visible

    p = PtyProcess(argv, env, cols=80, rows=24, cwd=str(Path(__file__).parents[2]))
    out = []
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and p.proc.poll() is None:
            got = p.read(0.5)
            if got is not None:
                out.append(visible(got[1]))
        while (got := p.read(0.2)) is not None:
            out.append(visible(got[1]))
        rc = p.proc.poll()
    finally:
        p.close()
    return rc, "".join(out)


def _env(tmp_path) -> dict:
    return dict(os.environ, TORCHDECK_RUNS=str(tmp_path / "runs"), TORCHDECK_PRESETS=str(tmp_path / "presets"),
                TORCHDECK_CACHE_DIR=str(tmp_path / "cache"))


def test_torchdeck_app_with_a_broken_preset_says_so_and_opens_nothing(tmp_path):
    """`torchdeck app nosuch` exited 2 with one line, while `torchdeck app broken.yaml` opened the
    form on the defaults with a toast: both now say what is wrong the way `torchdeck run` does,
    one line, exit 2, and nothing opens."""
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: broken\ntrain: {batch_size: 0}\n")
    run = subprocess.run([str(Path(sys.executable).with_name("torchdeck")), "run", str(broken)],
                         capture_output=True, text=True, env=_env(tmp_path), timeout=60)
    said = run.stderr.strip()
    assert run.returncode == 2 and said == f"{broken}: train.batch_size: must be at least 1, got 0"
    rc, text = _in_a_terminal([str(Path(sys.executable).with_name("torchdeck")), "app", str(broken)],
                              _env(tmp_path), timeout=20)
    assert rc == 2, (rc, text[-1500:])
    assert said in text and "Configure" not in text
    rc, text = _in_a_terminal([str(Path(sys.executable).with_name("torchdeck")), "app", "nosuch"],
                              _env(tmp_path), timeout=20)
    assert rc == 2 and "nosuch: no preset of that name" in text and "Configure" not in text


@pytest.mark.slow
def test_an_app_that_stops_on_an_error_exits_non_zero(tmp_path):
    """The crash above left the shell with exit status 0: `torchdeck app`'s status is the app's
    own (Textual prints the traceback and sets return_code; run() returns normally). A real
    terminal (a pty); the error is planted in the app's mount."""
    code = ("import sys, torchdeck.app.main as m\n"
            "def boom(self):\n    raise RuntimeError('planted for the test')\n"
            "m.TorchdeckApp.on_mount = boom\n"
            "from torchdeck.cli.main import main\nsys.exit(main(['app', 'quickstart']))\n")
    rc, text = _in_a_terminal([sys.executable, "-c", code], _env(tmp_path))
    assert "planted for the test" in text, text[-2000:]
    assert rc == 1, (rc, text[-2000:])
    assert "the app stopped on an error" in text


@pytest.mark.slow
async def test_resume_from_a_monitor_takes_the_monitors_place(tmp_path, real_run):
    """Each R on a Monitor pushed one more Monitor, so esc walked back through all of them: the
    resumed run's Monitor now takes the place of the one it was resumed from."""
    import shutil

    from torchdeck.app.monitor.screen import MonitorScreen

    _, real_path = real_run
    root = tmp_path / "runs"
    more = Path(shutil.copytree(real_path, root / (real_path.name + "-more")))
    (more / "config.yaml").write_text((more / "config.yaml").read_text().replace("max_steps: 4", "max_steps: 6"))
    app = make_app(root)
    async with app.run_test(size=SIZE) as pilot:
        runs = await open_runs(pilot)
        select(runs, more)
        await pilot.press("enter")
        assert await until(pilot, lambda: isinstance(app.screen, MonitorScreen) and app.screen.run_state.final)
        await pilot.press("R")
        assert await until(pilot, lambda: app.last_run is not None and isinstance(app.screen, MonitorScreen)
                           and app.screen.run_dir.path == Path(app.last_run), timeout=20), notes(app)
        assert [type(s).__name__ for s in app.screen_stack] == ["ConfigureScreen", "RunsScreen", "MonitorScreen"]
        assert await until(pilot, lambda: app.screen.run_state.final, timeout=120)  # nothing left running
        await pilot.press("escape")
        assert await until(pilot, lambda: app.screen is runs)


async def test_the_runs_list_at_80_columns_leaves_columns_out_and_says_which(tmp_path):
    """Opened with r from a Monitor at 80x24, the list squeezed every column ('finish  min ...
    1500/150  99.1% ('), and later opens pushed progress, val acc and --set off screen. Columns
    are left out in the order `torchdeck runs` leaves them out, a line says which, and what is
    shown is whole; at 140 columns more of them come back."""
    from torchdeck.app.monitor.screen import MonitorScreen
    from torchdeck.engine.runs.catalog import NARROW_DROP

    root = tmp_path / "runs"
    t0 = time.time() - 3600
    for name in ("mine", "baseline-with-a-long-name"):
        rd = RunDir.create(tiny_cfg(name), root)
        best = events.make("epoch_end", rank=0, epoch=0, step=750, train_loss=1.0, train_acc=0.4, val_loss=1.1,
                           val_acc=0.991)
        last = events.make("epoch_end", rank=0, epoch=1, step=1500, train_loss=1.0, train_acc=0.4, val_loss=1.1,
                           val_acc=0.95)
        write_events(rd, [started_event(t0), step_event(t0 + 20, 1500, 1500), best, last])
        rd.origin_path.write_text(json.dumps({"preset": "quickstart", "overrides": [
            "train.batch_size=128", "optimizer.lr=0.1", "train.epochs=5"]}))
        rd.write_final("finished", None, [0, 0], 30.0)
    app = make_app(root)
    async with app.run_test(size=SIZE) as pilot:
        await app.push_screen(MonitorScreen(rd.path))  # as Launch opens it
        await pilot.press("r")
        assert await until(pilot, lambda: isinstance(app.screen, RunsScreen) and app.screen.loaded)
        screen = app.screen
        await pilot.pause(0.2)
        table = screen.query_one(DataTable)
        shown = [c.key.value for c in table.ordered_columns]
        assert table.virtual_size.width <= table.size.width, (table.virtual_size, table.size)  # nothing off screen
        assert {"status", "run", "progress", "val"} <= set(shown)
        left = [k for k in NARROW_DROP if k not in shown]
        assert left and left == list(NARROW_DROP[:len(left)])  # the CLI's order
        text = screen_text(app)
        assert "1500/1500" in text and "95.0% (best 99.1%)" in text and "baseline-with-a-long-name" in text
        note = str(screen.query_one("#runs-left-out").render())
        assert note.startswith(f"{len(left)} columns left out: --set") and note.endswith("(widen the terminal)")

        await pilot.resize_terminal(140, 45)
        assert await until(pilot, lambda: len(table.ordered_columns) > len(shown))
        assert table.virtual_size.width <= table.size.width
