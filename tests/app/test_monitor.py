"""The Monitor screen: the RunState reducer on hand-made event streams, then the screen on real
runs the engine produced (finished, failed, stopped from the screen) and on a run fed live."""
from __future__ import annotations

import asyncio
import os
import textwrap
import time
from pathlib import Path

import pytest

from app.main import TorchdeckApp
from app.monitor.state import STEP_HISTORY, RunState
from app.sources.host import FakeHostSource, HostSample, ProcSample
from app.sources.nvml import FakeGPUSource, GPUSample
from engine import events
from engine.config import from_dict
from engine.rundir import RunDir

T0 = 1_700_000_000.0


def ev(kind: str, t: float, **fields) -> dict:
    """An event from the engine's own builder, at a fixed time. Kinds the builder does not know
    yet (rank_report lands with multi-node) are built in the same shape."""
    try:
        e = events.make(kind, **fields)
    except ValueError:
        e = {"v": events.EVENT_VERSION, "kind": kind, **fields}
    e["t"] = T0 + t
    return e


def started(total=100, world=2, t=0.0):
    return ev("run_started", t, run="r1", strategy="ddp", world_size=world, nproc_per_node=world, node_rank=0,
              num_nodes=1, global_batch=64 * world, devices=["cpu"] * world, master_addr="127.0.0.1",
              master_port=29500, pid=4000, host="box", total_steps=total)


def step(rank, s, t, sps=100.0, total=100, wait=0.01, comp=0.09, loss=1.0):
    return ev("step", t, rank=rank, epoch=0, step=s, total_steps=total, loss=loss, accuracy=0.5,
              samples_per_s=sps, data_wait_s=wait, compute_s=comp, lr=0.1)


# ----------------------------------------------------------------------------- the reducer


def test_ranks_throughput_and_eta_from_steps():
    st = RunState()
    st.feed_all([started(total=101)]
                + [ev("rank_ready", 0.5, rank=r, local_rank=r, device="cpu", pid=4001 + r, host="box", threads=1)
                   for r in range(2)])
    # rank 0 at 2 steps/s, rank 1 (the slow one) at 1 step/s, from t=10
    st.feed_all([step(0, 1 + 2 * i, 10 + i, sps=200.0, total=101) for i in range(11)])
    st.feed_all([step(1, 1 + i, 10 + i, sps=100.0, wait=0.03, comp=0.07, total=101) for i in range(11)])
    assert st.status == "running"
    r0, r1 = st.rank_list()
    assert (r0.step, r1.step) == (21, 11)
    assert r1.data_wait == pytest.approx(0.3)
    assert st.global_samples_per_s() == 300.0
    # the slowest rank did 10 steps in 10 s and has 90 to go
    assert st.eta(T0 + 20) == pytest.approx(90.0)
    slow, fast = st.rank_spread()
    assert (slow.rank, fast.rank) == (1, 0)
    assert st.rank_pids() == {4000: None, 4001: 0, 4002: 1}
    assert st.elapsed(T0 + 20) == 20.0
    st.feed(ev("run_finished", 25, status="finished", exit_codes=[0, 0], root_cause=None, elapsed_s=25.0))
    assert st.final and st.eta(T0 + 30) is None and st.elapsed(T0 + 99) == 25.0


def test_stale_rank_is_flagged_only_while_running():
    st = RunState()
    st.feed(started())
    st.feed_all([step(r, i, i) for i in range(1, 21) for r in (0, 1)])  # both every 1 s until t=20
    st.feed_all([step(0, i, i) for i in range(21, 41)])  # rank 1 falls silent at t=20
    r0, r1 = st.rank_list()
    now = T0 + 40.5
    assert not st.is_stale(r0, now)
    assert st.is_stale(r1, now)  # 20 s of silence > max(10 s, 5 x 1 s)
    assert not st.is_stale(r1, T0 + 29)  # 9 s: not yet
    st.feed(ev("run_finished", 41, status="stopped", exit_codes=[0, 0], root_cause=None, elapsed_s=41))
    assert not st.is_stale(r1, T0 + 100)  # a run that is over has no stale ranks


def test_stale_threshold_follows_a_slow_log_interval():
    st = RunState()
    st.feed(started())
    st.feed_all([step(0, i, 8 * i) for i in range(1, 6)])  # one event every 8 s
    (r0,) = st.rank_list()
    assert st.stale_after(r0) == pytest.approx(40.0)
    assert not st.is_stale(r0, T0 + 40 + 30)
    assert st.is_stale(r0, T0 + 40 + 41)


def test_errors_keep_rank_host_and_traceback():
    tb = 'Traceback (most recent call last):\n  File "model.py", line 3, in build\nRuntimeError: boom\n'
    st = RunState()
    st.feed_all([started(), step(0, 1, 1), step(1, 1, 1),
                 ev("error", 2, rank=1, host="gpu-node-7", pid=4002, exception="RuntimeError", message="boom",
                    traceback=tb),
                 ev("rank_exited", 3, rank=1, exitcode=1, signal=None),
                 ev("rank_exited", 3, rank=0, exitcode=-9, signal="SIGKILL"),
                 ev("run_finished", 4, status="failed", exit_codes=[-9, 1], root_cause="rank 1 raised RuntimeError: boom",
                    elapsed_s=4.0)])
    (err,) = st.errors
    assert err.rank == 1 and "gpu-node-7" in err.text and "RuntimeError: boom" in err.text
    assert err.detail.endswith("RuntimeError: boom") and 'File "model.py"' in err.detail
    assert st.status == "failed" and st.root_cause == "rank 1 raised RuntimeError: boom"
    assert st.ranks[1].exited == "exit 1" and st.ranks[0].exited == "signal SIGKILL"
    assert [ln.level for ln in st.logs][-1] == "error"


def test_rank_report_updates_ranks_of_other_nodes_only():
    st = RunState()
    st.feed_all([started(world=4, total=50),
                 ev("rank_ready", 0, rank=0, local_rank=0, device="cuda:0", pid=4001, host="box", threads=1),
                 step(0, 10, 5, sps=500.0)])
    st.feed(ev("rank_report", 6, reports=[
        {"rank": 0, "host": "box", "node_rank": 0, "epoch": 0, "step": 3, "samples_per_s": 1.0, "data_wait": 0.5,
         "device_mem_mb": 1234.0, "t": T0 + 6},
        {"rank": 2, "host": "node-b", "node_rank": 1, "epoch": 0, "step": 9, "samples_per_s": 480.0,
         "data_wait": 0.25, "device_mem_mb": 2000.0, "t": T0 + 5.5},
        {"rank": 3, "host": "node-b", "node_rank": 1, "epoch": 0, "step": 7, "samples_per_s": 300.0,
         "data_wait": 0.6, "device_mem_mb": 2100.0, "t": T0 + 5.5},
    ]))
    r0 = st.ranks[0]
    assert (r0.step, r0.samples_per_s, r0.device_mem_mb) == (10, 500.0, 1234.0)  # own events win; memory taken
    r2, r3 = st.ranks[2], st.ranks[3]
    assert (r2.host, r2.node_rank, r2.step, r2.samples_per_s, r2.data_wait) == ("node-b", 1, 9, 480.0, 0.25)
    assert r3.from_report and r3.last_seen == T0 + 5.5 and r3.total_steps == 50
    assert st.rank_spread()[0].rank == 3  # the straggler on the other node is the slowest
    assert 2 not in st.rank_pids().values()  # no local pid for remote ranks


def test_unknown_and_malformed_events_are_skipped():
    st = RunState()
    st.feed(started())
    v = st.version
    assert st.feed({"v": 9, "kind": "telemetry_from_the_future", "t": T0 + 1, "rank": 0, "x": [1, 2]}) is False
    assert st.feed({"kind": "step", "t": T0 + 1, "rank": "zero?", "step": {"not": "a number"}}) is False
    assert st.feed(["not", "a", "dict"]) is False
    assert st.version == v and st.ranks == {}
    assert st.feed(step(0, 1, 2)) is True and st.ranks[0].step == 1


def test_step_curve_stays_bounded_and_keeps_the_whole_run():
    st = RunState()
    st.feed(started(total=10_000))
    n = 5 * STEP_HISTORY
    st.feed_all([step(0, i, i * 0.01, loss=1.0 / i) for i in range(1, n + 1)])
    pts = st.steps.points
    assert STEP_HISTORY // 2 <= len(pts) <= STEP_HISTORY
    assert pts[0][0] == 1 and pts[-1][0] == n  # first and newest step both kept
    assert [x for x, _ in pts] == sorted(x for x, _ in pts)


def test_epoch_history_prefers_rank_0_and_snapshot_is_independent():
    st = RunState()
    st.feed(started())
    st.feed(ev("epoch_end", 5, rank=1, epoch=0, step=10, train_loss=0.9, train_acc=0.7, val_loss=0.8, val_acc=0.75))
    st.feed(ev("epoch_end", 5, rank=0, epoch=0, step=10, train_loss=1.0, train_acc=0.6, val_loss=0.85, val_acc=0.7))
    assert st.epochs[0].train_loss == 1.0
    snap = st.snapshot()
    st.feed(step(0, 11, 6))
    assert 0 not in snap.ranks or snap.ranks[0].step != 11
    assert sum("epoch 0 done" in ln.text for ln in st.logs) == 1  # once, not once per rank


def test_a_failing_ranks_traceback_is_shown_once_not_again_from_its_log():
    st = RunState()
    tb = 'Traceback (most recent call last):\n  File "m.py", line 2, in build\n    raise RuntimeError("boom")\nRuntimeError: boom'
    st.feed_all([started(), ev("error", 2, rank=0, host="box", pid=7, exception="RuntimeError", message="boom",
                                traceback=tb)])
    for line in tb.splitlines() + ["rank 0 printed this itself"]:
        st.add_output(0, line)
    st.add_output(1, "RuntimeError: boom")  # another rank's output is its own
    out = [(ln.rank, ln.text) for ln in st.logs if ln.level == "output"]
    assert out == [(0, "rank 0 printed this itself"), (1, "RuntimeError: boom")]
    assert st.errors[0].detail == tb


def test_lost_supervisor_marks_lost_once():
    st = RunState()
    st.feed_all([started(), step(0, 1, 3)])
    st.mark_lost("the supervisor exited without a final status")
    assert st.status == "lost" and st.final and st.finished_t == T0 + 3
    st.mark_lost("again")
    assert st.root_cause == "the supervisor exited without a final status"


# ----------------------------------------------------------------------------- the screen

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


def screen_text(app) -> str:
    """What the screen shows, as plain text lines (the SVG's text runs, in order)."""
    import html
    import re

    svg = app.export_screenshot()
    rows: dict[int, list] = {}
    for m in re.finditer(r'<text class="[^"]*" x="([\d.]+)" y="[\d.]+" textLength="[\d.]+" '
                         r'clip-path="url\(#[^)]*-line-(\d+)\)">(.*?)</text>', svg):
        rows.setdefault(int(m.group(2)), []).append((float(m.group(1)), html.unescape(m.group(3))))
    out = []
    for line in sorted(rows):
        s = ""
        for x, txt in sorted(rows[line]):
            s = s.ljust(int(round(x / 12.2))) + txt
        out.append(s.replace("\xa0", " "))
    return "\n".join(out)


TINY = {"name": "tiny", "strategy": "ddp", "accelerator": "cpu", "devices": 2, "backend": "gloo",
        "nodes": {"master_port": 0}, "model": {"name": "mlp", "hidden": 32},
        "data": {"dataset": "synthetic", "train_size": 256, "val_size": 64, "image_size": 16},
        "train": {"batch_size": 32, "epochs": 1, "log_every_n_steps": 1, "threads_per_rank": 1}}


def launch(tmp_path, **over):
    from engine import launch as L

    data = {**TINY, **over}
    return L.start(from_dict(data), tmp_path / "runs")


@pytest.fixture
def cleanup():
    runs = []
    yield runs
    from engine.launch import kill

    for run in runs:
        if run.is_live():
            kill(run)


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_finished_real_run_shows_every_rank_at_its_last_step(tmp_path, cleanup):
    from engine.launch import wait

    run = launch(tmp_path)
    cleanup.append(run)
    final = wait(run, timeout=180)
    assert final is not None and final["status"] == "finished", final
    from app.monitor.screen import MonitorScreen

    app = make_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
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
        assert "epoch 0 done at step 4" in text  # the log pane replayed the history
        assert "A100" in text  # the fake GPU pane
        assert "supervisor" in text  # host pane process rows
        await pilot.press("escape")
        await pilot.pause(0.2)
        assert type(app.screen).__name__ == "ConfigureScreen"


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_failed_real_run_shows_rank_and_traceback(tmp_path, cleanup, monkeypatch):
    from engine.launch import wait

    (tmp_path / "badmodel_mon.py").write_text(textwrap.dedent("""\
        def build(info, **kw):
            raise RuntimeError("boom from the user model")
    """))
    monkeypatch.chdir(tmp_path)  # the supervisor (and its ranks) import the model from the cwd
    run = launch(tmp_path, model={"name": "badmodel_mon:build"})
    cleanup.append(run)
    final = wait(run, timeout=180)
    assert final is not None and final["status"] == "failed", final
    from app.monitor.screen import MonitorScreen

    app = make_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        screen = MonitorScreen(run.path)
        await app.push_screen(screen)
        await until(pilot, lambda: screen.run_state.final, 20, "replayed to the end")
        st = screen.run_state
        assert st.status == "failed" and st.errors
        assert {e.rank for e in st.errors} <= {0, 1}
        await pilot.pause(0.3)
        text = screen_text(app)
        assert "FAILED" in text
        assert "boom from the user model" in text
        assert "RuntimeError" in text and 'File "' in text  # the traceback's frames, on screen
        err = st.errors[0]
        from app.monitor.panes import LogPane

        logged = "\n".join(strip.text for strip in screen.query_one(LogPane).lines)  # scrolled-off lines too
        assert f"[error] rank {err.rank}: rank {err.rank} on " in logged
        assert "badmodel_mon.py" in err.detail and "Traceback (most recent call last)" in logged
        assert 'raise RuntimeError("boom from the user model")' in logged  # the traceback, line by line
        assert "rank 0 ended: exit 1" in logged


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_stop_key_stops_a_live_real_run(tmp_path, cleanup):
    run = launch(tmp_path, train={**TINY["train"], "epochs": 500})
    cleanup.append(run)
    from app.monitor.screen import MonitorScreen

    app = make_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
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
    from engine.launch import run_processes

    run = launch(tmp_path, train={**TINY["train"], "epochs": 500})
    cleanup.append(run)
    from app.monitor.screen import MonitorScreen

    app = make_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        screen = MonitorScreen(run.path)
        await app.push_screen(screen)
        await until(pilot, lambda: any(r.step >= 2 for r in screen.run_state.rank_list()), 120, "training started")
        assert len(run_processes(run)) >= 3  # supervisor + 2 ranks
        await pilot.press("k")
        await pilot.pause(0.3)
        assert type(app.screen).__name__ == "ConfirmDialog"
        await pilot.press("y")
        await until(pilot, lambda: screen.run_state.status == "failed", 15, "failed after kill")
        assert "killed by the user" in (screen.run_state.root_cause or "")
        await pilot.pause(0.3)
        assert "FAILED" in screen_text(app)
    deadline = time.monotonic() + 15
    while run_processes(run) and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    assert run_processes(run) == []


async def test_live_events_appear_on_screen(tmp_path):
    """A run directory whose events the test writes as it goes: each new one shows up."""
    from app.monitor.screen import MonitorScreen

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
        screen = MonitorScreen(run.path)
        await app.push_screen(screen)
        await until(pilot, lambda: "RUNNING" in screen_text(app), 10, "running shown")
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
        assert app.host_source.last_pids == {os.getpid(): None}  # the host pane asked about the supervisor


async def test_stop_and_kill_refuse_a_run_that_is_over(tmp_path):
    from app.monitor.screen import MonitorScreen

    cfg = from_dict({"name": "over", "strategy": "cpu"})
    run = RunDir.create(cfg, tmp_path / "runs")
    with open(run.events_path, "w") as fh:
        fh.write(events.dumps(events.make("run_finished", status="finished", exit_codes=[0], root_cause=None,
                                          elapsed_s=1.0)) + "\n")
    run.write_status({"status": "finished", "exit_codes": [0], "root_cause": None})
    app = make_app(tmp_path)
    said = []
    notify = app.notify
    app.notify = lambda message, **kw: (said.append(str(message)), notify(message, **kw))[1]
    async with app.run_test(size=SIZE) as pilot:
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
    from app.monitor.screen import MonitorCommands, MonitorScreen

    cfg = from_dict({"name": "pal", "strategy": "cpu"})
    run = RunDir.create(cfg, tmp_path / "runs")
    app = make_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        screen = MonitorScreen(run.path)
        await app.push_screen(screen)
        await pilot.pause(0.2)
        provider = MonitorCommands(screen)
        found = [h.text for h in [h async for h in provider.discover()]]
        assert found == ["Stop run", "Kill run", "Leave monitor"]
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
    from app.monitor.screen import MonitorScreen

    cfg = from_dict({"name": "nogpu", "strategy": "cpu"})
    run = RunDir.create(cfg, tmp_path / "runs")
    app = TorchdeckApp(gpu_source=FakeGPUSource([], reason="no NVIDIA driver library (libnvidia-ml) on this host"),
                       host_source=fake_host(), runs_root=tmp_path / "runs")
    async with app.run_test(size=SIZE) as pilot:
        screen = MonitorScreen(run.path)
        await app.push_screen(screen)
        await until(pilot, lambda: "libnvidia-ml" in screen_text(app), 10, "NVML reason")
        assert "no GPU view: no NVIDIA driver library (libnvidia-ml) on this host" in screen_text(app)


def test_worker_output_tail_reads_new_lines_only(tmp_path):
    from app.monitor.output import FIRST_BYTES, OutputTail

    (tmp_path / "supervisor.log").write_text("supervisor 1: ddp x2\n")
    (tmp_path / "rank0.log").write_text("x" * (FIRST_BYTES + 10) + "\nold line 1\nold line 2\npart")
    tail = OutputTail(tmp_path)
    assert tail.poll() == [(None, "supervisor 1: ddp x2"), (0, "old line 1"), (0, "old line 2")]
    with open(tmp_path / "rank0.log", "a") as fh:
        fh.write("ial line\n")
    (tmp_path / "rank1.log").write_text("hello from rank 1\n")
    assert tail.poll() == [(0, "partial line"), (1, "hello from rank 1")]
    assert tail.poll() == []


def test_monitor_modules_do_not_import_torch():
    """The Monitor opens from the app's first screen: torch (seconds to import) stays out of it."""
    import subprocess
    import sys

    code = ("import sys, app.monitor.screen, app.monitor.state, app.monitor.panes, app.monitor.output\n"
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         cwd=str(Path(__file__).resolve().parents[2]))
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0] == "[]"
    code = "import sys, app.monitor.state; print('textual' in sys.modules)"  # the reducer stays UI-free
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         cwd=str(Path(__file__).resolve().parents[2]))
    assert out.stdout.strip() == "False", out.stderr
