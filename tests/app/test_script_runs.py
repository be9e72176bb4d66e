"""The app's side of a script run (issue 29 item 5, torchdeck launch): the Monitor of a run whose
ranks are a user's script (steps/s from the step hook, pids, the command in the header, one rank's
log at a time; the host pane counts a rank's own children), and Configure's "your script" kind of
run. Run directories are written by the test as the supervisor writes them; the ranks' processes
are real (one of them with a child of its own)."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import yaml

from torchdeck.app.main import TorchdeckApp
from torchdeck.app.sources.host import HostSource
from torchdeck.engine import events
from torchdeck.engine.config import from_dict
from torchdeck.engine.rundir.layout import RunDir
from tests.app.screen_helpers import screen_text
from tests.app.test_configure import choose, make_app as configure_app, ready, type_into
from tests.app.test_monitor import fake_gpu, form_mounted, until

SIZE = (80, 24)
# a rank that starts a worker of its own (as mp.spawn or a DataLoader does) and waits
RANK = ("import subprocess, sys, time; "
        "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); "
        "print('child', c.pid, flush=True); time.sleep(120)")


@pytest.fixture
def ranks():
    procs = [subprocess.Popen([sys.executable, "-c", RANK], stdout=subprocess.PIPE, text=True) for _ in range(2)]
    kids = [int(p.stdout.readline().split()[1]) for p in procs]
    yield procs, kids
    for p, kid in zip(procs, kids):
        for pid in (kid, p.pid):
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        p.wait(10)


def script_run(tmp_path, pids):
    cfg = from_dict({"name": "mine", "strategy": "script", "devices": 2, "script": {"path": "train.py"}})
    run = RunDir.create(cfg, tmp_path / "runs")
    run.pid_path.write_text(f"{os.getpid()}\n")  # a live "supervisor": this test
    now = time.time()
    cmd = ["python", "train.py", "--epochs", "3", "--data", "/datasets/some/rather/long/path/to/imagenet"]
    evs = [events.make("run_started", run=run.name, strategy="script", world_size=2, nproc_per_node=2, node_rank=0,
                       num_nodes=1, global_batch=None, devices=["cpu", "cpu"], master_addr="127.0.0.1",
                       master_port=29500, pid=os.getpid(), host="box", total_steps=None, run_kind="script",
                       command=cmd)]
    for r, pid in enumerate(pids):
        evs.append(events.make("rank_ready", rank=r, local_rank=r, device=None, pid=pid, host="box", threads=1,
                               cpus=None))
    # the step hook's events: steps and steps/s, no loss, no samples/s
    evs += [events.make("step", rank=0, step=40, steps_per_s=12.5, epoch=None, loss=None),
            events.make("step", rank=1, step=38, steps_per_s=3.25, epoch=None, loss=None)]
    with open(run.events_path, "w") as fh:
        for e in evs:
            e["t"] = now
            fh.write(events.dumps(e) + "\n")
    run.rank_log(0).write_text("epoch 1 starting on rank zero\n")
    run.rank_log(1).write_text("hello from rank one\n")
    return run


def rows(app) -> list[str]:
    return [ln for ln in screen_text(app).splitlines() if ln.startswith(("│ 0    ", "│ 1    "))]


def log_lines(screen) -> list[str]:
    from torchdeck.app.monitor.panes import LogPane

    return [strip.text.rstrip() for strip in screen.query_one(LogPane).lines]


async def test_a_script_runs_monitor_shows_steps_per_s_pids_children_and_one_ranks_log(tmp_path, ranks):
    procs, kids = ranks
    from torchdeck.app.monitor.screen import MonitorScreen

    run = script_run(tmp_path, [p.pid for p in procs])
    host = HostSource()
    app = TorchdeckApp(gpu_source=fake_gpu(), host_source=host, runs_root=tmp_path / "runs")
    async with app.run_test(size=SIZE) as pilot:
        await form_mounted(pilot, app)
        written = run.events_path.stat().st_mtime
        # the screen's clock stays a second after the events: on a busy machine the ranks are not stale
        screen = MonitorScreen(run.path, now=lambda: written + 1.0, sample_every=0.2)
        await app.push_screen(screen)
        await until(pilot, lambda: len(rows(app)) == 2 and "12.5" in "".join(rows(app)), 10, "both ranks' rows")
        r0, r1 = rows(app)
        assert "40" in r0 and "12.5" in r0 and str(procs[0].pid) in r0, r0  # step, steps/s from the hook, pid
        assert "38" in r1 and "3.25" in r1 and str(procs[1].pid) in r1, r1
        assert "None" not in r0 + r1 and "nan" not in (r0 + r1).lower()
        text = screen_text(app)
        assert "steps/s" in text and "pid" in text
        head = text.splitlines()[0]
        assert "python train.py --epochs 3" in head and head.rstrip().endswith("…"), head  # the command, cut
        assert "3.25 steps/s" in text  # the header's pace: the slowest rank's
        assert "rank balance: slowest rank 1 3.25 steps/s, fastest rank 0 12.5: 74% behind" in text
        await until(pilot, lambda: "l Rank log" in screen_text(app), 10, "the key in the key bar")
        # the host pane counts each rank's own worker with it
        await until(pilot, lambda: set(kids) <= {p.pid for p in (screen._host.procs if screen._host else [])},
                    10, "the ranks' children sampled")
        whose = {p.pid: (p.rank, p.child) for p in screen._host.procs}
        assert whose[kids[0]] == (0, True) and whose[kids[1]] == (1, True)
        assert whose[procs[0].pid] == (0, False) and whose[procs[1].pid] == (1, False)
        assert screen._family[kids[1]] == 1  # a child on a GPU is its rank's in the GPU pane too

        await until(pilot, lambda: any("hello from rank one" in ln for ln in log_lines(screen)), 10, "rank logs")
        every = log_lines(screen)
        assert any(ln.startswith("rank 0 │ epoch 1 starting") for ln in every), every
        assert any(ln.startswith("rank 1 │ hello from rank one") for ln in every), every
        await pilot.press("l")
        await pilot.pause(0.2)
        assert screen.query_one("#mon-log").border_title == "log: rank 0"
        # at 80x24 the pane is below the fold: l brings it on screen (it seemed to do nothing)
        await until(pilot, lambda: "log: rank 0" in screen_text(app), 10, "the log pane on screen")
        assert log_lines(screen) == ["epoch 1 starting on rank zero"]  # its file, as it reads: no prefix
        await pilot.press("l")
        await pilot.pause(0.2)
        assert screen.query_one("#mon-log").border_title == "log: rank 1"
        assert log_lines(screen) == ["hello from rank one"]
        with open(run.rank_log(1), "a") as fh:
            fh.write("rank one again\n")
        with open(run.rank_log(0), "a") as fh:
            fh.write("rank zero again\n")
        await until(pilot, lambda: "rank one again" in log_lines(screen), 10, "a new line of rank 1's log")
        await until(pilot, lambda: any(ln.text == "rank zero again" for ln in screen.run_state.logs), 10,
                    "rank 0's new line read")
        assert all("rank zero" not in ln for ln in log_lines(screen))
        await pilot.press("l")
        await pilot.pause(0.2)
        assert screen.query_one("#mon-log").border_title == "log: all ranks"
        every = log_lines(screen)
        assert any(ln.startswith("rank 1 │ rank one again") for ln in every), every
        assert any(ln.startswith("rank 0 │ epoch 1 starting") for ln in every), every
    host.close()


# ----------------------------------------------------------------------------- Configure


LOOP = ("model.name", "data.dataset", "train.batch_size", "optimizer.lr", "train.epochs", "checkpoint.dir",
        "train.precision", "backend")
SCRIPT = ("script.path", "script.module", "script.args", "script.env", "nodes.num_nodes", "devices",
          "train.threads_per_rank")


async def test_configure_a_script_run_shows_its_fields_saves_script_and_refuses_a_missing_script(
        tmp_path, presets_dir, monkeypatch):
    work = tmp_path / "project"
    work.mkdir()
    monkeypatch.chdir(work)
    app = configure_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot)
        shown = screen.form.is_shown
        assert all(shown(p) for p in LOOP[:-1]) and not shown("script.path")  # the loop's form as before
        await choose(pilot, "f-strategy", "scr")
        assert screen.form.value_of("strategy") == "script"
        assert [p for p in LOOP if shown(p)] == [] and all(shown(p) for p in SCRIPT), (
            [p for p in LOOP if shown(p)], [p for p in SCRIPT if not shown(p)])
        await type_into(pilot, "f-script-path", "train.py")
        await type_into(pilot, "f-script-args", "--epochs 3 --name 'a b'")
        await type_into(pilot, "f-script-env", "NCCL_DEBUG=INFO")
        await pilot.pause(0.2)
        assert screen.form.to_dict()["script"]["args"] == ["--epochs", "3", "--name", "a b"]
        # launch refuses a script that is not there, with the preflight's line, and starts nothing
        await pilot.press("f5")
        await pilot.pause(0.3)
        assert app.said(f"Cannot launch: script.path: no such script 'train.py' (looked in {work})"), app.messages
        assert type(app.screen).__name__ == "ConfigureScreen" and not (tmp_path / "runs").exists()
        # saving writes the script: section
        await pilot.press("ctrl+s")
        await pilot.pause(0.3)
        await pilot.press(*"mine", "enter")
        await until(pilot, lambda: (presets_dir / "mine.yaml").exists(), 10, "the preset written")
        saved = yaml.safe_load((presets_dir / "mine.yaml").read_text())
        assert saved["strategy"] == "script"
        assert saved["script"]["path"] == "train.py" and saved["script"]["args"] == ["--epochs", "3", "--name", "a b"]
        assert saved["script"]["env"] == {"NCCL_DEBUG": "INFO"}


@pytest.fixture
def presets_dir(tmp_path, monkeypatch):
    d = tmp_path / "presets"
    monkeypatch.setenv("TORCHDECK_PRESETS", str(d))
    return d
