"""The Monitor offers what applies to the run it shows (issue 35 bugs 8 and 9): a script run's stop
is SIGTERM then SIGKILL after script.stop_grace_s (not "rank 0 checkpoints"), and it has no
Resume; a run that is over has no Stop or Kill in the key bar (the keys still say why)."""
from __future__ import annotations

import json
import os

from torchdeck.app.monitor.screen import MonitorCommands, MonitorScreen
from torchdeck.engine import events
from torchdeck.engine.config import from_dict
from torchdeck.engine.rundir.layout import RunDir
from tests.app.screen_helpers import screen_text
from tests.app.test_configure import RecordingApp
from tests.app.test_monitor import fake_gpu, fake_host, form_mounted, until
from tests.app.test_script_runs import script_run

SIZE = (80, 24)


def make_app(tmp_path):
    return RecordingApp(gpu_source=fake_gpu(), host_source=fake_host(), runs_root=tmp_path / "runs")


def key_bar(app) -> str:
    return screen_text(app).splitlines()[-1]


async def palette(screen) -> list[str]:
    return [h.text for h in [h async for h in MonitorCommands(screen).discover()]]


async def test_a_script_runs_stop_says_sigterm_and_it_offers_no_resume(tmp_path):
    run = script_run(tmp_path, [os.getpid(), os.getpid()])  # live: its "supervisor" is this test
    app = make_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await form_mounted(pilot, app)
        screen = MonitorScreen(run.path)
        await app.push_screen(screen)
        await until(pilot, lambda: screen.run_state.run_kind == "script", 10, "the run read")
        await until(pilot, lambda: "s Stop" in key_bar(app), 10, "the key bar drawn")  # 0.2 s was not, under load
        bar = key_bar(app)
        assert "s Stop" in bar and "k Kill" in bar and "R Resume" not in bar, bar
        assert await palette(screen) == ["Stop run", "Kill run", "Show stacks", "Leave monitor"]
        stop = next(h for h in [h async for h in MonitorCommands(screen).discover()] if h.text == "Stop run")
        assert stop.help == "Graceful stop: ranks get SIGTERM, then SIGKILL after 30 s (s)"
        await pilot.press("R")  # not in the bar, and says why
        await pilot.pause(0.2)
        assert app.said("Cannot resume: resume does not apply to a script run"), app.messages
        await pilot.press("s")
        await until(pilot, lambda: app.screen is not screen, 5, "the stop dialog")
        question = str(app.screen.query_one("#question").render())
        assert question.endswith("Ranks get SIGTERM, then SIGKILL after 30 s."), question
        assert "checkpoint" not in question
        await pilot.press("y")
        await until(pilot, lambda: run.stop_path.exists(), 5, "the stop requested")
        assert app.said("Stop requested: ranks get SIGTERM, then SIGKILL after 30 s (k kills at once)"), app.messages
        assert not any("checkpoint" in m for m in app.messages if m.startswith("Stop")), app.messages
        await pilot.press("k")
        await until(pilot, lambda: app.screen is not screen, 5, "the kill dialog")
        question = str(app.screen.query_one("#question").render())
        assert "checkpoint" not in question and "The script gets no chance to save anything." in question
        await pilot.press("n")


async def test_a_run_that_is_over_has_no_stop_or_kill_in_the_key_bar(tmp_path):
    run = RunDir.create(from_dict({"name": "over", "strategy": "cpu"}), tmp_path / "runs")
    with open(run.events_path, "w") as fh:
        fh.write(events.dumps(events.make("run_finished", status="stopped", exit_codes=[0], root_cause=None,
                                          elapsed_s=1.0)) + "\n")
    run.status_path.write_text(json.dumps({"status": "stopped", "exit_codes": [0], "root_cause": None}))
    app = make_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await form_mounted(pilot, app)
        screen = MonitorScreen(run.path)
        await app.push_screen(screen)
        await until(pilot, lambda: screen.run_state.final, 10, "final")
        await until(pilot, lambda: "R Resume" in key_bar(app), 5, "the key bar redrawn")
        bar = key_bar(app)
        assert "s Stop" not in bar and "k Kill" not in bar, bar
        assert await palette(screen) == ["Show stacks", "Resume run", "Leave monitor"]
        await pilot.press("s")  # not offered, and still says why
        await pilot.pause(0.2)
        assert app.screen is screen and app.said("Cannot stop: the run is not running (status stopped)")


async def test_r_on_a_script_run_in_the_runs_list_says_resume_does_not_apply(tmp_path, monkeypatch):
    """The Runs list's R on a script run advised checkpoint.every_n_steps (a loop setting)."""
    from tests.app.test_runs import open_runs, select

    monkeypatch.setenv("TORCHDECK_PRESETS", str(tmp_path / "presets"))
    run = script_run(tmp_path, [os.getpid(), os.getpid()])
    run.pid_path.unlink()
    run.write_final("stopped", exit_codes=[143, 143])
    app = make_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_runs(pilot)
        select(screen, run.path)
        # a script run's row: R is not in the key bar (QA after issue 35: the Runs list still offered it)
        await until(pilot, lambda: "d Delete" in key_bar(app) and "R Resume" not in key_bar(app), 10,
                    "the key bar without R")
        await pilot.press("R")
        await until(pilot, lambda: app.said("Cannot resume:"), 10, "the answer")
        said = next(m for m in app.messages if m.startswith("Cannot resume:"))
        assert said.startswith(f"Cannot resume: resume does not apply to a script run ({run.name}): "), said
        assert "checkpoint.every_n_steps" not in said
        assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == [run.name]  # nothing started
