"""The app's SLURM path at 80x24 (issue 38): the Configure form's where choice, F5 submitting to the real
local two-node cluster (tests/slurm/cluster.sh), the Runs list showing the held job PENDING with SLURM's
reason, and the Monitor following it from the queue to its end."""
from __future__ import annotations

import importlib.util
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from textual.widgets import DataTable, Select

from screen_helpers import screen_text
from test_configure import make_app, presets_dir, ready, type_into  # noqa: F401  (presets_dir: a fixture)

ROOT = Path(__file__).resolve().parents[2]
SIZE = (80, 24)


def _slurm_fixtures():
    """tests/slurm/conftest.py's fixtures, taken into this module (pytest finds fixtures in a test
    module's namespace; conftest files of sibling folders it does not read)."""
    spec = importlib.util.spec_from_file_location("slurm_conftest", ROOT / "tests" / "slurm" / "conftest.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.slurm_cluster, mod.jobs


slurm_cluster, jobs = _slurm_fixtures()


async def wait_until(pilot, cond, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        await pilot.pause(0.2)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


async def pick(pilot, wid: str, value: str) -> None:
    """Choose a Select's value with the keyboard: open it, move to the option, enter."""
    w = pilot.app.screen.query_one("#" + wid, Select)
    w.focus()
    await pilot.pause()
    await pilot.press("enter")
    await pilot.pause(0.1)
    values = [v for _, v in w._options]
    steps = values.index(value) - values.index(w.value)
    await pilot.press(*(["down"] * steps if steps > 0 else ["up"] * -steps), "enter")
    await pilot.pause(0.2)
    assert w.value == value


def header(app) -> str:
    return str(app.screen.query_one("#mon-header").render_line(0).text) + "\n" + \
        str(app.screen.query_one("#mon-header").render_line(1).text)


async def test_without_slurm_the_choice_says_why_and_f5_refuses(tmp_path, presets_dir, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no sinfo, no sbatch: a laptop, not a login node
    app = make_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot)
        await wait_until(pilot, lambda: screen.form.slurm_why is not None, 30, "the SLURM probe")
        where = screen.query_one("#f-where", Select)
        labels = dict((v, str(label)) for label, v in where._options)
        assert labels["slurm"].startswith("SLURM (unavailable: no sinfo/sbatch on PATH"), labels
        assert not screen.form.is_shown("slurm.partition")
        assert screen_text(app).splitlines()[-1].startswith("f5 Launch ")
        await pick(pilot, "f-where", "slurm")
        assert screen.form.is_shown("slurm.partition") and screen.form.is_shown("slurm.time")
        assert screen_text(app).splitlines()[-1].startswith("f5 Submit "), screen_text(app)
        await pilot.press("f5")
        await pilot.pause(0.3)
        assert app.said("Cannot submit: where: SLURM cannot be used from here: no sinfo/sbatch on PATH"), app.messages
        assert app.screen is screen and app.focused.id == "f-where"
        assert "--slurm" in str(screen.query_one("#command").render())
        assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def _tiny_preset(folder: Path) -> Path:
    """Two nodes of one gloo rank each, a few steps on synthetic data, held in the queue by sbatch."""
    data = {"schema_version": 1, "name": "slurm-tiny", "strategy": "ddp", "accelerator": "cpu", "devices": 1,
            "backend": "gloo", "model": {"name": "mlp"},
            "data": {"dataset": "synthetic", "train_size": 256, "val_size": 64, "num_workers": 0},
            "train": {"batch_size": 32, "epochs": 1, "max_steps": 4},
            "nodes": {"num_nodes": 2}, "slurm": {"time": "00:10:00", "sbatch_args": ["--hold"]}}
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "slurm-tiny.yaml"
    path.write_text(yaml.safe_dump(data))
    return path



@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_f5_submits_the_runs_list_shows_it_pending_and_the_monitor_follows_it(tmp_path, presets_dir, jobs):
    from torchdeck.engine.rundir.layout import RunDir

    app = make_app(tmp_path, preset=_tiny_preset(presets_dir))
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot)
        await wait_until(pilot, lambda: screen.form.slurm_why == "", 60, "sinfo's partitions")
        await pick(pilot, "f-where", "slurm")
        assert [v for _, v in screen.query_one("#f-slurm-partition", Select)._options] == ["", "debug"]
        assert screen.form.is_shown("nodes.num_nodes") and not screen.form.is_shown("nodes.node_rank")
        assert not screen.problems, screen.problems
        await pilot.press("f5")
        mon = await wait_until(pilot, lambda: app.screen if app.screen.__class__.__name__ == "MonitorScreen"
                               else None, 60, "the Monitor")
        job = RunDir(mon.run_dir.path).slurm
        jobs.append(job["job_id"])
        await wait_until(pilot, lambda: "PENDING" in header(app) and "JobHeldUser" in header(app), 60,
                         "the Monitor's header to say PENDING and why")
        await pilot.press("r")  # the Runs list
        runs = await wait_until(pilot, lambda: app.screen if app.screen.id == "runs" and app.screen.loaded
                                else None, 60, "the Runs list")
        table = runs.query_one(DataTable)
        await wait_until(pilot, lambda: table.row_count and table.get_row_at(0)[0].plain == "pending (JobHeldUser)",
                         30, "the Runs list to show the job PENDING with its reason")
        text = screen_text(app)
        assert "pending (JobHeldUser)" in text.split("\n")[2], text  # the first row, at 80 columns (as torchdeck runs)
        assert f"SLURM job {job['job_id']}: PENDING (JobHeldUser)" in text, text
        subprocess.run(["scontrol", "release", str(job["job_id"])], check=True, capture_output=True, timeout=30)
        await wait_until(pilot, lambda: f"SLURM job {job['job_id']}: RUNNING on n[1-2]" in screen_text(app), 120,
                         "the Runs list to say SLURM runs the job on both nodes")
        # node 0 reports: the run's own status (a 4-step run may be over by the next poll)
        await wait_until(pilot, lambda: runs.rows and runs.rows[0].status.value in ("running", "finished")
                         and "waiting for node 0" not in runs.job_words[runs.rows[0].key].detail, 240,
                         f"the Runs list to show the run running ({mon.run_dir.path})")
        await pilot.press("enter")  # opens the run: its Monitor, already on the stack
        await wait_until(pilot, lambda: app.screen is mon, 30, "the Monitor again")
        assert "PENDING" not in header(app)
        await wait_until(pilot, lambda: mon.run_state.final, 300, "the run's end")
        assert str(mon.run_state.status) == "finished", (header(app), mon.run_state.root_cause)
        assert "FINISHED" in header(app)
        await pilot.press("r")  # the Runs list again: the run's end, and SLURM's
        await wait_until(pilot, lambda: app.screen.id == "runs" and f"SLURM job {job['job_id']}: COMPLETED" in
                         screen_text(app), 60, "the Runs list to say SLURM's end of the job")
        assert app.screen.query_one(DataTable).get_row_at(0)[0].plain == "finished"


async def test_what_slurm_would_refuse_is_refused_on_f5_at_its_field(tmp_path, presets_dir, slurm_cluster):
    """A partition sinfo does not list, more nodes than the partition has: one line each, on F5, before
    anything is submitted, with the focus on the field to change."""
    path = _tiny_preset(presets_dir)
    data = yaml.safe_load(path.read_text())
    data["slurm"]["partition"] = "nope"
    path.write_text(yaml.safe_dump(data))
    app = make_app(tmp_path, preset=path)
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot)
        await wait_until(pilot, lambda: screen.form.slurm_why == "", 60, "sinfo's partitions")
        await pick(pilot, "f-where", "slurm")
        part = screen.query_one("#f-slurm-partition", Select)
        assert part.value == "nope" and "nope (not in sinfo)" in [str(label) for label, _ in part._options]
        await pilot.press("f5")
        await wait_until(pilot, lambda: app.said("Cannot submit: slurm.partition: no partition 'nope'"), 60,
                         "the refusal")
        assert app.focused.id == "f-slurm-partition"
        await pick(pilot, "f-slurm-partition", "")  # cluster default: debug, 2 nodes
        await type_into(pilot, "f-nodes-num_nodes", "3")
        await pilot.press("f5")
        await wait_until(pilot, lambda: app.said("Cannot submit: nodes.num_nodes: 3 nodes, but partition debug has 2"),
                         60, "the refusal")
        assert app.focused.id == "f-nodes-num_nodes" and app.screen is screen
        assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
