"""The Monitor screen on real runs the engine produced (finished, failed, stopped from the screen),
on a run fed live, and on hand-made event streams (tests/run_events.py). The reducer it draws is
tested on its own in tests/engine/test_run_view.py."""
from __future__ import annotations

import asyncio
import json
import os
import textwrap
import time
from pathlib import Path

import pytest

from torchdeck.app.main import TorchdeckApp
from torchdeck.app.sources.host import FakeHostSource, HostSample, ProcSample
from torchdeck.app.sources.nvml import FakeGPUSource, GPUSample
from torchdeck.engine import events
from torchdeck.engine.config import from_dict
from torchdeck.engine.rundir.layout import RunDir
from tests.app.screen_helpers import screen_text
from tests.run_events import T0, ev, started, step

SIZE = (140, 45)


def fake_gpu():
    return FakeGPUSource([GPUSample(index=0, name="NVIDIA A100-SXM4-40GB", util=90.0, mem_used_mb=30000,
                                    mem_total_mb=40960, temp_c=70, power_w=300.0, power_limit_w=400.0, pids=[])])


def fake_host():
    return FakeHostSource(HostSample(cpu_percent=50.0, per_cpu=[50.0, 50.0], ram_used_mb=4000, ram_total_mb=16000,
                                     load1=1.0, procs=[ProcSample(4000, "python", 1.0, 100.0, None)]))


def make_app(tmp_path):
    return TorchdeckApp(gpu_source=fake_gpu(), host_source=fake_host(), runs_root=tmp_path / "runs")


async def until(pilot, cond, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        await pilot.pause(0.1)
    raise AssertionError(f"{what}: not within {timeout:.0f} s; screen:\n{screen_text(pilot.app)}")


TINY = {"name": "tiny", "strategy": "ddp", "accelerator": "cpu", "devices": 2, "backend": "gloo",
        "nodes": {"master_port": 0}, "model": {"name": "mlp", "hidden": 32},
        "data": {"dataset": "synthetic", "train_size": 256, "val_size": 64, "image_size": 16},
        "train": {"batch_size": 32, "epochs": 1, "log_every_n_steps": 1, "threads_per_rank": 1}}

# A run that outlasts any test (stop and kill must end it): 500 epochs (2,000 steps) ended on their
# own in 16 s once the ranks' events went through their own pipes, before the key was pressed
LONG_EPOCHS = 100_000


async def form_mounted(pilot, app):
    """The Configure form beneath mounts its groups after the first paint: leaving (or covering it)
    while a Select of it is still mounting makes Textual fail at exit (NoMatches '#label')."""
    await until(pilot, lambda: app.configure_screen.form.complete, 60, "the form mounted")  # 10 s: short at load 15


def launch(tmp_path, **over):
    from torchdeck.engine.runs import control as L

    data = {**TINY, **over}
    return L.start(from_dict(data), tmp_path / "runs")


@pytest.fixture
def cleanup():
    runs = []
    yield runs
    from torchdeck.engine.runs.control import kill

    for run in runs:
        if run.is_live():
            kill(run)


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_finished_real_run_shows_every_rank_at_its_last_step(tmp_path, cleanup):
    from torchdeck.engine.runs.control import wait

    run = launch(tmp_path)
    cleanup.append(run)
    final = wait(run, timeout=180)
    assert final is not None and final["status"] == "finished", final
    from torchdeck.app.monitor.screen import MonitorScreen

    app = make_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await form_mounted(pilot, app)
        screen = MonitorScreen(run.path)
        await app.push_screen(screen)
        await until(pilot, lambda: screen.run_state.final, 20, "replayed to the end")
        st = screen.run_state
        assert st.status == "finished"
        ranks = st.rank_list()
        assert [r.rank for r in ranks] == [0, 1]
        total = st.total_steps
        assert total == 4 and all(r.step == total for r in ranks)  # 256 samples / 2 ranks / batch 32
        await pilot.pause(0.3)
        text = screen_text(app)
        assert "FINISHED" in text and "ETA done" in text
        for r in (0, 1):
            row = next(ln for ln in text.splitlines() if ln.startswith(f"│ {r}    cpu"))
            assert "4/4" in row
        assert "epoch 1/1 done at step 4" in text  # the log pane replayed the history (epochs from 1)
        from torchdeck.app.monitor.panes import LogPane

        logged = [strip.text for strip in screen.query_one(LogPane).lines]
        first = lambda word: next(i for i, ln in enumerate(logged) if word in ln)  # noqa: E731
        assert first("run started") < first("supervisor ") < first("epoch 1/1 done") < first("run finished"), logged
        assert st.logs[-1].text == "run finished" and sum(ln.text == "run finished" for ln in st.logs) == 1
        assert "A100" in text  # the fake GPU pane
        assert "supervisor" in text  # host pane process rows
        await pilot.press("escape")
        await pilot.pause(0.2)
        assert type(app.screen).__name__ == "ConfigureScreen"


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_failed_real_run_shows_rank_and_traceback(tmp_path, cleanup, monkeypatch):
    from torchdeck.engine.runs.control import wait

    (tmp_path / "badmodel_mon.py").write_text(textwrap.dedent("""\
        def build(info, **kw):
            raise RuntimeError("boom from the user model")
    """))
    monkeypatch.chdir(tmp_path)  # the supervisor (and its ranks) import the model from the cwd
    run = launch(tmp_path, model={"name": "badmodel_mon:build"})
    cleanup.append(run)
    final = wait(run, timeout=180)
    assert final is not None and final["status"] == "failed", final
    from torchdeck.app.monitor.screen import MonitorScreen

    app = make_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await form_mounted(pilot, app)
        screen = MonitorScreen(run.path)
        await app.push_screen(screen)
        await until(pilot, lambda: screen.run_state.final, 20, "replayed to the end")
        st = screen.run_state
        assert st.status == "failed" and st.errors
        assert {e.rank for e in st.errors} <= {0, 1}
        # the root cause in the header and the traceback's frames, on screen (drawn on refreshes after
        # the replay; a frame's `File "/long/path"` may wrap after "File" at 70 columns, as CI's did)
        await until(pilot, lambda: all(w in screen_text(app) for w in (
            "root cause:", "boom from the user model", "File", ", line ")), 10, "the root cause and traceback drawn")
        text = screen_text(app)
        assert "FAILED" in text
        assert "RuntimeError" in text
        err = st.errors[0]
        from torchdeck.app.monitor.panes import LogPane

        logged = "\n".join(strip.text for strip in screen.query_one(LogPane).lines)  # scrolled-off lines too
        assert f"[error] rank {err.rank}: rank {err.rank} on " in logged
        assert "badmodel_mon.py" in err.detail and "Traceback (most recent call last)" in logged
        assert 'raise RuntimeError("boom from the user model")' in logged  # the traceback, line by line
        assert "rank 0 ended: exit 1" in logged


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_stop_key_stops_a_live_real_run(tmp_path, cleanup):
    run = launch(tmp_path, train={**TINY["train"], "epochs": LONG_EPOCHS})
    cleanup.append(run)
    from torchdeck.app.monitor.screen import MonitorScreen

    app = make_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await form_mounted(pilot, app)
        screen = MonitorScreen(run.path)
        await app.push_screen(screen)
        await until(pilot, lambda: any(r.step >= 2 for r in screen.run_state.rank_list()), 120, "training started")
        assert screen.run_state.status == "running"
        assert "RUNNING" in screen_text(app)
        await pilot.press("s")
        await pilot.pause(0.3)
        assert type(app.screen).__name__ == "ConfirmDialog"
        assert not run.stop_path.exists()  # nothing happens before the answer
        await pilot.press("y")
        await pilot.pause(0.2)
        assert run.stop_path.exists()
        t0 = time.monotonic()
        await until(pilot, lambda: screen.run_state.status == "stopped", 30, "stopped")
        assert time.monotonic() - t0 < 30
        await pilot.pause(0.3)
        assert "STOPPED" in screen_text(app)
    assert run.final_status()["status"] == "stopped"
    assert sorted(run.checkpoint_dir.glob("ckpt-*.pt"))  # rank 0 saved on the way out


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_kill_key_kills_every_process_of_a_live_real_run(tmp_path, cleanup):
    from torchdeck.engine.runs.control import run_processes

    run = launch(tmp_path, train={**TINY["train"], "epochs": LONG_EPOCHS})
    cleanup.append(run)
    from torchdeck.app.monitor.screen import MonitorScreen

    app = make_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await form_mounted(pilot, app)
        screen = MonitorScreen(run.path)
        await app.push_screen(screen)
        await until(pilot, lambda: any(r.step >= 2 for r in screen.run_state.rank_list()), 120, "training started")
        assert len(run_processes(run)) >= 3  # supervisor + 2 ranks
        await pilot.press("k")
        await pilot.pause(0.3)
        assert type(app.screen).__name__ == "ConfirmDialog"
        await pilot.press("y")
        await until(pilot, lambda: screen.run_state.status == "stopped", 15, "stopped after kill")
        assert "killed by the user" in (screen.run_state.root_cause or "")  # the user's kill: not a failure
        await pilot.pause(0.3)
        assert "STOPPED" in screen_text(app)
    deadline = time.monotonic() + 15
    while run_processes(run) and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    assert run_processes(run) == []


async def test_live_events_appear_on_screen(tmp_path):
    """A run directory whose events the test writes as it goes: each new one shows up."""
    from torchdeck.app.monitor.screen import MonitorScreen

    cfg = from_dict({"name": "live", "strategy": "ddp", "accelerator": "cpu", "devices": 2, "backend": "gloo"})
    run = RunDir.create(cfg, tmp_path / "runs")
    run.pid_path.write_text(f"{os.getpid()}\n")  # a live "supervisor": this test
    now = time.time()

    def put(*evs):
        with open(run.events_path, "a") as fh:
            for e in evs:
                e["t"] = now
                fh.write(events.dumps(e) + "\n")

    put(events.make("run_started", run=run.name, strategy="ddp", world_size=2, nproc_per_node=2, node_rank=0,
                    num_nodes=1, global_batch=128, devices=["cpu", "cpu"], master_addr="127.0.0.1",
                    master_port=29500, pid=os.getpid(), host="box", total_steps=987654))
    app = make_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await form_mounted(pilot, app)
        screen = MonitorScreen(run.path)
        await app.push_screen(screen)
        await until(pilot, lambda: "STARTING" in screen_text(app), 10, "starting shown (no step yet)")
        for k in range(3):
            s = 123450 + k
            put(*[events.make("step", rank=r, epoch=0, step=s, total_steps=987654, loss=0.5, accuracy=0.9,
                              samples_per_s=640.0, data_wait_s=0.0, compute_s=0.1, lr=0.1) for r in (1, 0)])
            await until(pilot, lambda: len([ln for ln in screen_text(app).splitlines()
                                            if ln.startswith(("│ 0    ", "│ 1    ")) and f"{s}/987654" in ln]) == 2,
                        10, f"step {s} shown in both ranks' rows")
            rows = [ln[:3] for ln in screen_text(app).splitlines() if ln.startswith(("│ 0    ", "│ 1    "))]
            assert rows == ["│ 0", "│ 1"]  # rank order, though rank 1 reported first
        put(events.make("log", rank=1, level="warning", message="loss is getting interesting"))
        await until(pilot, lambda: "[warning] rank 1: loss is getting interesting" in screen_text(app), 10, "log")
        put(events.make("run_finished", status="finished", exit_codes=[0, 0], root_cause=None, elapsed_s=1.0))
        await until(pilot, lambda: "FINISHED" in screen_text(app), 10, "finished shown")
        # The host pane asks about the supervisor at its next sample (once a second; the one before
        # may have come before the screen knew the run's pids).
        await until(pilot, lambda: app.host_source.last_pids == {os.getpid(): None}, 5,
                    f"the host pane sampled the supervisor's pid (last asked {app.host_source.last_pids})")


async def test_stop_and_kill_refuse_a_run_that_is_over(tmp_path):
    from torchdeck.app.monitor.screen import MonitorScreen

    cfg = from_dict({"name": "over", "strategy": "cpu"})
    run = RunDir.create(cfg, tmp_path / "runs")
    with open(run.events_path, "w") as fh:
        fh.write(events.dumps(events.make("run_finished", status="finished", exit_codes=[0], root_cause=None,
                                          elapsed_s=1.0)) + "\n")
    run.status_path.write_text(json.dumps({"status": "finished", "exit_codes": [0], "root_cause": None}))
    app = make_app(tmp_path)
    said = []
    notify = app.notify
    app.notify = lambda message, **kw: (said.append(str(message)), notify(message, **kw))[1]
    async with app.run_test(size=SIZE) as pilot:
        await form_mounted(pilot, app)
        screen = MonitorScreen(run.path)
        await app.push_screen(screen)
        await until(pilot, lambda: screen.run_state.final, 10, "final")
        for key in ("s", "k"):
            await pilot.press(key)
            await pilot.pause(0.2)
            assert app.screen is screen  # no confirmation for a run that is over
        assert not run.stop_path.exists()
        assert said == ["Cannot stop: the run is not running (status finished)",
                        "Cannot kill: the run is not running (status finished)"]


async def test_palette_lists_the_monitor_actions(tmp_path):
    from torchdeck.app.monitor.screen import MonitorCommands, MonitorScreen

    cfg = from_dict({"name": "pal", "strategy": "cpu"})
    run = RunDir.create(cfg, tmp_path / "runs")
    app = make_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await form_mounted(pilot, app)
        screen = MonitorScreen(run.path)
        await app.push_screen(screen)
        await pilot.pause(0.2)
        provider = MonitorCommands(screen)
        found = [h.text for h in [h async for h in provider.discover()]]
        assert found == ["Stop run", "Kill run", "Show stacks", "Resume run", "Leave monitor"]
        assert "Runs list" in [c.title for c in app.get_system_commands(screen)]  # the app's, on every screen
        hits = [h async for h in provider.search("kill")]
        assert hits and hits[0].text == "Kill run"
        await pilot.press("ctrl+p")
        await pilot.pause(0.3)
        await pilot.press(*"Leave monitor")
        await pilot.pause(0.5)
        await pilot.press("enter")
        await pilot.pause(0.3)
        assert type(app.screen).__name__ == "ConfigureScreen"


async def test_without_nvml_the_gpu_pane_says_why(tmp_path):
    from torchdeck.app.monitor.screen import MonitorScreen

    cfg = from_dict({"name": "nogpu", "strategy": "cpu"})
    run = RunDir.create(cfg, tmp_path / "runs")
    app = TorchdeckApp(gpu_source=FakeGPUSource([], reason="no NVIDIA driver library (libnvidia-ml) on this host"),
                       host_source=fake_host(), runs_root=tmp_path / "runs")
    async with app.run_test(size=SIZE) as pilot:
        await form_mounted(pilot, app)
        screen = MonitorScreen(run.path)
        await app.push_screen(screen)
        await until(pilot, lambda: "libnvidia-ml" in screen_text(app), 10, "NVML reason")
        assert "no GPU view: no NVIDIA driver library (libnvidia-ml) on this host" in screen_text(app)


def test_monitor_modules_do_not_import_torch():
    """The Monitor opens from the app's first screen: torch (seconds to import) stays out of it."""
    import subprocess
    import sys

    code = ("import sys, torchdeck.app.monitor.screen, torchdeck.app.monitor.panes, torchdeck.engine.runs.view, "
            "torchdeck.engine.runs.follow\n"
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         cwd=str(Path(__file__).resolve().parents[2]))
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0] == "[]"
    code = "import sys, torchdeck.engine.runs.view, torchdeck.engine.runs.follow; print('textual' in sys.modules)"  # UI-free core
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         cwd=str(Path(__file__).resolve().parents[2]))
    assert out.stdout.strip() == "False", out.stderr


async def test_log_lines_rewrap_when_the_terminal_is_resized_at_80x24(tmp_path):
    """Lines wrapped at the old width were cut when the window shrank (issue 14): every word of a
    long log line is still in the pane after a resize to 80x24 and back."""
    from torchdeck.app.monitor.panes import LogPane
    from torchdeck.app.monitor.screen import MonitorScreen

    run = RunDir.create(from_dict({"name": "wrap", "strategy": "cpu"}), tmp_path / "runs")
    long = ("epoch 3 is over and this line is long enough to wrap at eighty columns: train loss 0.0123 "
            "acc 99.7%, val loss 0.0456 acc 99.8%")
    evs = [started(world=1), ev("log", 1, rank=0, level="info", message=long),
           ev("run_finished", 2, status="finished", exit_codes=[0], root_cause=None, elapsed_s=2.0)]
    run.events_path.write_text("".join(events.dumps(e) + "\n" for e in evs))
    run.write_final("finished", None, [0], 2.0)
    app = make_app(tmp_path)

    def logged() -> str:
        return " ".join(strip.text.strip() for strip in app.screen.query_one(LogPane).lines)

    async with app.run_test(size=SIZE) as pilot:
        await form_mounted(pilot, app)
        await app.push_screen(MonitorScreen(run.path))
        await until(pilot, lambda: "acc 99.8%" in logged(), 10, "the long line")
        for size in ((80, 24), (60, 24), (140, 45)):
            await pilot.resize_terminal(*size)
            await until(pilot, lambda: app.screen.query_one(LogPane)._width == app.screen.query_one(
                LogPane).scrollable_content_region.width, 10, "resize seen")
            await pilot.pause(0.3)
            text = " ".join(logged().split())
            assert long in text, (size, text)
            width = app.screen.query_one(LogPane).scrollable_content_region.width
            assert max(len(strip.text.rstrip()) for strip in app.screen.query_one(LogPane).lines) <= width


def test_a_lost_runs_ranks_are_marked_gone_and_a_stale_rank_stops_the_header():
    from torchdeck.app.monitor.panes import header_text, rank_text
    from torchdeck.engine.runs.view import RunView

    st = RunView()
    st.feed_all([started(), step(0, 5, 10), step(1, 5, 10)])
    assert "ETA" in header_text(st, T0 + 11, "r").plain
    head = header_text(st, T0 + 40, "r").plain  # both silent for 30 s
    assert "STALLED: ranks 0,1 silent" in head and "0 samples/s" in head and "ETA" not in head
    st.observe(None, alive=False, has_pid=True, quiet_s=600.0, now=T0 + 700)
    assert st.status == "lost"
    for r in st.rank_list():
        line = rank_text(st, r, T0 + 900, 120).plain
        assert line.rstrip().endswith("gone") and "s" not in line.split()[-1].replace("gone", "")


def test_each_final_status_says_one_thing_in_the_header_the_exit_code_and_the_runs_list():
    """Issue 28: three lists of statuses disagreed: the Monitor's header left out a preempted run's
    cause (which `torchdeck runs` prints, and `torchdeck stop --wait` exits 0 on). One rule now,
    engine.rundir.status.Status: the cause of a run that ended early is said, red when it went wrong."""
    from torchdeck.app.monitor.panes import header_text
    from torchdeck.cli.main import _exit_for
    from torchdeck.engine.runs.view import RunView

    for status, style, code in (("failed", "red", 1), ("stopped", "yellow", 0), ("preempted", "yellow", 0),
                                ("finished", None, 0)):
        st = RunView()
        st.feed_all([started(), step(0, 5, 10), ev("run_finished", 20, status=status, exit_codes=[],
                                                   root_cause=f"why it {status}", elapsed_s=20.0)])
        head = header_text(st, T0 + 30, "r")
        said = [span.style for span in head.spans if f"why it {status}" in head.plain[span.start:span.end]]
        assert (said[0] if said else None) == style, (status, head.plain)
        assert _exit_for(st) == code, status


def test_curve_ticks_are_whole_steps():
    from torchdeck.app.monitor.panes import step_ticks

    for lo, hi in ((1, 4), (1, 10), (3, 300), (1, 187), (100, 107), (1, 123_456)):
        ticks = step_ticks(lo, hi)
        assert ticks and all(isinstance(t, int) and lo <= t <= hi for t in ticks) and len(ticks) <= 5
        gaps = {b - a for a, b in zip(ticks, ticks[1:])}
        assert len(gaps) <= 1 and all(str(g).strip("0") in ("1", "2", "25", "5") for g in gaps), (lo, hi, ticks)


async def test_stacks_of_a_run_that_is_over_are_what_torchdeck_stacks_prints(tmp_path, capsys):
    """Issue 27: `t` on a run that is over showed only the watchdog's stacks event, while
    `torchdeck stacks` prints the newer of that event and the files an earlier `t` left
    (engine.rundir.stacks.last_recorded). One question, one answer: both read this run directory."""
    from torchdeck.app.monitor.screen import MonitorScreen
    from torchdeck.app.monitor.stacks import StacksScreen
    from torchdeck.cli import main as cli
    from tests.engine.test_stacks import DUMP

    cfg = from_dict({"name": "over", "strategy": "ddp", "accelerator": "cpu", "devices": 2, "backend": "gloo"})
    run = RunDir.create(cfg, tmp_path / "runs")
    watchdog = ev("stacks", 45, rank=None, reason="rank 1 silent for 12 s", summary="rank 1: sleep (x.py:1)",
                  groups=[{"who": "rank 1", "ranks": [1], "where": "sleep (x.py:1)", "frames": []}],
                  files=["rank1.stacks"])
    done = ev("run_finished", 50, status="stopped", exit_codes=[0, 0], root_cause=None, elapsed_s=50.0)
    run.events_path.write_text("".join(events.dumps(e) + "\n" for e in [started(world=2), watchdog, done]))
    run.status_path.write_text(json.dumps({"status": "stopped", "exit_codes": [0, 0], "elapsed_s": 50.0}))
    for name in ("rank0.stacks", "rank1.stacks"):  # `t` asked after the watchdog: newer
        (run.path / name).write_text(DUMP)
        os.utime(run.path / name, (T0 + 48, T0 + 48))

    assert cli.main(["stacks", str(run.path)]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert "(asked; rank0.stacks, rank1.stacks)" in printed[0], printed
    app = make_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await form_mounted(pilot, app)
        screen = MonitorScreen(run.path)
        await app.push_screen(screen)
        await until(pilot, lambda: screen.run_state.final, 10, "final")
        await pilot.press("t")
        await until(pilot, lambda: isinstance(app.screen, StacksScreen)
                    and "taken at" in str(app.screen.query_one("#stacks-body").content), 10, "stacks shown")
        shown = str(app.screen.query_one("#stacks-body").content).splitlines()
    assert shown[0].endswith("(asked; rank0.stacks, rank1.stacks)"), shown
    assert printed[0].split(" recorded at ")[1].rstrip(":") == shown[0].split("taken at ")[1]  # same time, why
    assert [ln for ln in shown[1:] if not ln.startswith("    ")] == \
        [ln for ln in printed[1:] if not ln.startswith("    ")] == [
            "ranks 0,1: all_reduce (distributed/distributed_c10d.py:2950) <- _should_stop (engine/train.py:341)"]


@pytest.mark.parametrize("strategy,said", [
    ("deepspeed", "rank balance: from the first steps (a-red is measured for ddp/zero on CPU)"),
    ("ddp", "rank balance: from the first steps (who waits for whom in the all-reduce)"),
])
async def test_starting_ranks_balance_line_says_what_is_true(tmp_path, strategy, said):
    """Issue 27: with both ranks listed and starting, the Monitor said 'fewer than two ranks
    reporting'. The truth: no rank has stepped yet, and only DDP (ddp, zero) on the CPU times its
    all-reduce wait (the a-red column), so other strategies' balance is their rates alone."""
    from torchdeck.app.monitor.screen import MonitorScreen

    cfg = from_dict({"name": "starting", "strategy": "ddp", "accelerator": "cpu", "devices": 2, "backend": "gloo"})
    run = RunDir.create(cfg, tmp_path / "runs")
    run.pid_path.write_text(f"{os.getpid()}\n")  # a live "supervisor": this test
    evs = [events.make("run_started", run=run.name, strategy=strategy, world_size=2, nproc_per_node=2, node_rank=0,
                       num_nodes=1, global_batch=64, devices=["cpu", "cpu"], master_addr="127.0.0.1",
                       master_port=29500, pid=os.getpid(), host="box", total_steps=100)]
    evs += [events.make("rank_ready", rank=r, local_rank=r, device="cpu", pid=os.getpid(), host="box", threads=1,
                        cpus=None) for r in (0, 1)]
    evs += [events.make("phase", rank=r, phase="model") for r in (0, 1)]
    run.events_path.write_text("".join(events.dumps(e) + "\n" for e in evs))
    app = make_app(tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await form_mounted(pilot, app)
        await app.push_screen(MonitorScreen(run.path))
        await until(pilot, lambda: said in screen_text(app), 10, f"{said!r} shown")
        assert "fewer than two" not in screen_text(app)
