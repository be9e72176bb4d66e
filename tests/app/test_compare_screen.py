"""The Compare screen over a comparison directory written with fixed times (the layout
`torchdeck compare` writes), reached from the Runs list as a user reaches it.

Regenerate the pictures after a deliberate UI change with:
    .venv/bin/python -m pytest tests/app/test_compare_screen.py --snapshot-update
"""
from __future__ import annotations

import json
import math
import shutil
import time
from pathlib import Path

import pytest
from textual.widgets import DataTable

from torchdeck.app.compare.screen import CompareScreen
from torchdeck.app.main import TorchdeckApp
from torchdeck.app.runs.screen import RunsScreen
from torchdeck.app.sources.nvml import FakeGPUSource
from torchdeck.engine import config as cfgmod
from torchdeck.engine import events
from torchdeck.engine.runs import compare
from torchdeck.engine.runs.catalog import deletable
from torchdeck.engine.rundir.layout import RunDir
from tests.app.screen_helpers import screen_text, until

T0 = 1_761_998_400.0
# strategy, world, seconds per step, data wait share, peak RSS per rank, val acc at the end of each epoch
PLAN = (("cpu", 1, 0.040, 0.05, [700.0], (0.42, 0.61, 0.72)),
        ("ddp", 2, 0.025, 0.02, [690.0, 688.0], (0.40, 0.58, 0.70)),
        ("fsdp", 2, 0.045, 0.01, [720.0, 715.0], (0.39, 0.52, 0.58)))


def _events(strategy, world, step_s, wait, mem, accs) -> list[dict]:
    out = []

    def put(kind, dt, **f):
        e = events.make(kind, **f)
        e["t"] = T0 + dt
        out.append(e)

    start = 3.0 + world  # start-up: more ranks take longer to meet
    put("run_started", 0, run=strategy, strategy=strategy, world_size=world, nproc_per_node=world, node_rank=0,
        num_nodes=1, global_batch=128, devices=["cpu"] * world, master_addr="127.0.0.1", master_port=0, pid=1,
        host="box", total_steps=60)
    t = start
    for s in range(4, 61, 4):
        t += 4 * step_s * (3 if s == 4 else 1)  # the first window is warm-up: slower
        for r in range(world):
            put("step", t, rank=r, epoch=(s - 1) // 20, step=s, total_steps=60,
                loss=2.3 * math.exp(-s / (25 if strategy != "fsdp" else 35)) + 0.2, accuracy=0.5,
                samples_per_s=128 / world / step_s, data_wait_s=4 * step_s * wait, compute_s=4 * step_s * (1 - wait),
                lr=0.05)
        if s % 20 == 0:
            t += 0.5  # evaluation
            put("epoch_end", t, rank=0, epoch=s // 20 - 1, step=s, train_loss=1.0, train_acc=0.5, val_loss=1.0,
                val_acc=accs[s // 20 - 1])
    put("rank_report", t, rank=0, reports=[{"rank": r, "host": "box", "node_rank": 0, "epoch": 2, "step": 60,
                                            "samples_per_s": 1.0, "data_wait": wait, "device_mem_mb": m - 10,
                                            "peak_mem_mb": m, "t": T0 + t} for r, m in enumerate(mem)])
    put("run_finished", t + 0.1, status="finished", exit_codes=[0] * world, root_cause=None, elapsed_s=t + 0.1)
    return out


def make_comparison(root: Path) -> Path:
    where = root / "compare-20251101-120000-tiny"
    where.mkdir(parents=True)
    entries = []
    for i, (strategy, world, step_s, wait, mem, accs) in enumerate(PLAN):
        rd = RunDir(where / f"20251101-12000{i}-tiny-{strategy}")
        rd.path.mkdir()
        cfgmod.save(cfgmod.from_dict({"name": f"tiny-{strategy}", "strategy": strategy, "devices": world,
                                      "backend": "gloo" if world > 1 else "auto"}), rd.config_path)
        rd.events_path.write_text("".join(events.dumps(e) + "\n" for e in _events(strategy, world, step_s, wait,
                                                                                 mem, accs)))
        rd.status_path.write_text(json.dumps({"status": "finished", "exit_codes": [0] * world, "root_cause": None,
                                              "elapsed_s": 10.0}))
        entries.append({"strategy": strategy, "run": rd.name, "skipped": None, "world": world, "global_batch": 128})
    entries.append({"strategy": "dp", "run": None, "world": None, "global_batch": None,
                    "skipped": "accelerator: cuda needs an NVIDIA GPU and driver, and this host has none"})
    plan = {"version": 1, "preset": "tiny.yaml", "name": "tiny", "overrides": [], "target_acc": 0.6,
            "strategies": [e["strategy"] for e in entries], "entries": entries,
            "held_equal": {"model": "cnn", "data": "synthetic", "seed": 0, "global batch": 128, "optimizer": "sgd",
                           "lr": "0.05", "precision": "32-true", "length": "60 steps"}}
    (where / compare.PLAN_FILE).write_text(json.dumps(plan))
    return where


@pytest.fixture
def app(tmp_path, monkeypatch):
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    monkeypatch.chdir(tmp_path)
    make_comparison(Path("runs"))
    yield TorchdeckApp(runs_root=Path("runs"), gpu_source=FakeGPUSource([]))
    monkeypatch.undo()
    time.tzset()


async def open_comparison(pilot) -> CompareScreen:
    """F2, then c on a run of the comparison (none marked): the whole comparison opens."""
    await pilot.press("f2")
    assert await until(pilot, lambda: isinstance(pilot.app.screen, RunsScreen) and pilot.app.screen.loaded)
    await pilot.press("c")
    assert await until(pilot, lambda: isinstance(pilot.app.screen, CompareScreen) and pilot.app.screen.loaded)
    await pilot.pause(0.3)
    return pilot.app.screen


async def test_runs_list_marks_runs_and_c_compares_them(app):
    async with app.run_test(size=(140, 45)) as pilot:
        await pilot.press("f2")
        assert await until(pilot, lambda: isinstance(app.screen, RunsScreen) and app.screen.loaded)
        runs = app.screen
        assert len(runs.rows) == 3  # the comparison's runs are listed with the others
        await pilot.press("space", "down", "space")
        assert len(runs.marked) == 2 and "2 marked" in str(runs.query_one("#runs-header").render())
        await pilot.press("c")
        assert await until(pilot, lambda: isinstance(app.screen, CompareScreen) and app.screen.loaded)
        screen = app.screen
        assert len(screen.rows) == 2 and len(screen.curves) == 2
        assert {r.strategy for r in screen.rows} < {"cpu", "ddp", "fsdp"}
        await pilot.press("escape")
        assert await until(pilot, lambda: app.screen is runs)
        await pilot.press("space", "up", "space")  # unmark both: c opens the cursor run's comparison
        assert not runs.marked
        screen = await open_comparison_from_runs(pilot)
        table = screen.query_one(DataTable)
        assert table.row_count == 4
        rows = {r.strategy: r for r in screen.rows}
        assert rows["dp"].status == "skipped" and "GPU" in rows["dp"].reason
        # the numbers are engine.runs.compare's: ddp 0.025 s per step after warm-up, 128 samples a step
        assert rows["ddp"].samples_per_s == pytest.approx(128 / 0.025)
        assert rows["cpu"].ratio == 1.0 and rows["ddp"].ratio == pytest.approx(0.040 / 0.025)
        assert rows["fsdp"].time_to_target_s is None and rows["cpu"].time_to_target_s is not None
        assert [c.label for c in screen.curves] == ["cpu", "ddp", "fsdp"]
        assert screen.x_by == "step"
        await pilot.press("x")
        assert screen.x_by == "time"
    # a comparison's run may be deleted like any finished run; its row then says so
    fsdp = Path(rows["fsdp"].run)
    assert deletable(fsdp, Path("runs")) is None
    shutil.rmtree(fsdp)
    again = {r.strategy: r for r in compare.load(fsdp.parent).rows}
    assert again["fsdp"].status == "deleted" and again["ddp"].status == "finished"


async def open_comparison_from_runs(pilot) -> CompareScreen:
    await pilot.press("c")
    assert await until(pilot, lambda: isinstance(pilot.app.screen, CompareScreen) and pilot.app.screen.loaded)
    return pilot.app.screen


@pytest.mark.parametrize("size", [(80, 24), (140, 45)], ids=["80x24", "140x45"])
def test_compare_screen(snap_compare, app, size):
    assert snap_compare(app, terminal_size=size, run_before=open_comparison)


def test_compare_screen_by_wall_time_140x45(snap_compare, app):
    async def run_before(pilot):
        await open_comparison(pilot)
        await pilot.press("x")
        await pilot.pause(0.2)

    assert snap_compare(app, terminal_size=(140, 45), run_before=run_before)


@pytest.mark.slow
async def test_configure_compare_strategies_launches_a_comparison_and_shows_its_rows(tmp_path, monkeypatch):
    """F7 (the palette's "Compare strategies"): checkboxes pick cpu and dp; cpu runs for real in
    the background, dp is skipped on this host; the Compare screen follows it to the end."""
    from textual.widgets import Checkbox, Input

    from torchdeck.app.compare.dialog import CompareDialog

    monkeypatch.setenv("TORCHDECK_PRESETS", str(tmp_path / "presets"))
    preset = tmp_path / "tiny.yaml"
    preset.write_text("name: tiny\nstrategy: cpu\nmodel: {name: mlp, hidden: 32}\n"
                      "data: {dataset: synthetic, train_size: 256, val_size: 64, image_size: 16}\n"
                      "train: {batch_size: 32, epochs: 1}\n")
    app = TorchdeckApp(preset=str(preset), gpu_source=FakeGPUSource([]), runs_root=tmp_path / "runs")
    async with app.run_test(size=(120, 40)) as pilot:
        assert await until(pilot, lambda: getattr(app.screen, "cfg", None) is not None)
        await pilot.press("f7")
        assert await until(pilot, lambda: isinstance(app.screen, CompareDialog))
        dialog = app.screen
        for s, on in (("ddp", False), ("fsdp", False), ("zero", False), ("dp", True)):
            dialog.query_one(f"#cmp-{s}", Checkbox).value = on
        dialog.query_one("#cmp-steps", Input).value = "1"
        await pilot.click("#go")
        assert "at least 2" in str(dialog.query_one("#cmp-error").render())  # said there; nothing started
        assert not (tmp_path / "runs").exists()
        dialog.query_one("#cmp-steps", Input).value = "6"
        await pilot.pause(0.2)
        await pilot.click("#go")
        assert await until(pilot, lambda: isinstance(app.screen, CompareScreen) and app.screen.loaded), (
            app.screen, [n.message for n in app._notifications], str(dialog.query_one("#cmp-error").render()))
        screen = app.screen
        assert await until(pilot, lambda: [r.status for r in screen.rows] == ["finished", "skipped"], timeout=120)
        cpu, dp = screen.rows
        assert cpu.samples_per_s > 0 and cpu.global_batch == 32 and "GPU" in dp.reason
        # The background runner writes its table after the last run's own files say it finished.
        assert await until(pilot, lambda: (screen.comparison / compare.TABLE_FILE).is_file(), timeout=60)


async def test_s_stops_a_comparison_started_from_the_app(tmp_path, monkeypatch):
    """A live comparison that runs in the background (it has its job.yaml): the header says which
    strategy runs, and s leaves the stop file its runner polls."""
    import os

    where = make_comparison(tmp_path / "runs")
    (where / compare.JOB_FILE).write_text("name: tiny\n")
    live = RunDir(where / "20251101-120001-tiny-ddp")
    live.status_path.unlink()
    live.pid_path.write_text(f"{os.getpid()}\n")  # this process: the run reads as alive
    with open(live.events_path) as fh:
        kept = [ln for ln in fh if '"run_finished"' not in ln]
    live.events_path.write_text("".join(kept))
    app = TorchdeckApp(runs_root=tmp_path / "runs", gpu_source=FakeGPUSource([]))
    async with app.run_test(size=(140, 45)) as pilot:
        await app.push_screen(CompareScreen(comparison=where))
        screen = app.screen
        assert await until(pilot, lambda: screen.loaded)
        assert [r.status for r in screen.rows] == ["finished", "running", "finished", "skipped"]
        assert "running ddp (2 of 3)" in str(screen.query_one("#cmp-header").render())
        await pilot.press("s")
        assert (where / compare.STOP_FILE).exists()
        await pilot.press("escape")


# ------------------------------------------------------------------------------ issue 27


async def test_at_80_columns_the_table_leaves_columns_out_and_says_which(app):
    """The table cut mid-word at 80 columns ('DATA WAI', '3.7' without '%') with no sign that it
    scrolled: columns are left out in `torchdeck compare`'s order until a row fits, and a line
    says which."""
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await open_comparison(pilot)
        table = screen.query_one(DataTable)
        assert table.virtual_size.width <= table.size.width, (table.virtual_size, table.size)
        shown = [c.key.value for c in table.ordered_columns]
        left = [k for k in compare.NARROW_DROP if k not in shown]
        assert left == list(compare.NARROW_DROP[:len(left)]) and "target" in shown  # the asked-for column stays
        text = screen_text(app)
        assert "TO 60%" in text and "00:06" in text
        assert f"{len(left)} columns left out: GLOBAL BATCH" in str(screen.query_one("#cmp-left-out").render())


async def test_the_compare_dialog_reads_whole_at_80_columns_and_says_on_or_off(tmp_path, monkeypatch):
    """F7 at 80x24: the checkboxes read 'deeps…' and 'model…', the target's placeholder 'e.g.',
    and every checkbox showed the same ▐X▌, on or off, told apart by colour alone (lost over SSH)."""
    from textual.widgets import Checkbox

    from torchdeck.app.compare.dialog import CompareDialog

    monkeypatch.setenv("TORCHDECK_PRESETS", str(tmp_path / "presets"))
    app = TorchdeckApp(gpu_source=FakeGPUSource([]), runs_root=tmp_path / "runs")
    async with app.run_test(size=(80, 24)) as pilot:
        assert await until(pilot, lambda: getattr(app.screen, "cfg", None) is not None)
        await pilot.press("f7")
        assert await until(pilot, lambda: isinstance(app.screen, CompareDialog))
        await pilot.pause(0.2)
        text = screen_text(app)
        for s in compare.ALL_STRATEGIES:
            on = app.screen.query_one(f"#cmp-{s}", Checkbox).value
            assert f"▐{'✓' if on else ' '}▌ {s}" in text, (s, text)
        assert "e.g. 0.6" in text
        app.screen.query_one("#cmp-model-parallel", Checkbox).focus()
        await pilot.press("space")
        assert "▐✓▌ model-parallel" in screen_text(app)


def _same_name_runs(root: Path) -> list[Path]:
    """Two ddp runs both named 'mine', started a minute apart, and one named 'other'."""
    out = []
    for stamp, name in (("20251101-120000", "mine"), ("20251101-120100", "mine"), ("20251101-120200", "other")):
        rd = RunDir(root / f"{stamp}-{name}")
        rd.path.mkdir(parents=True)
        cfgmod.save(cfgmod.from_dict({"name": name, "strategy": "ddp", "devices": 2, "backend": "gloo"}),
                    rd.config_path)
        rd.events_path.write_text("".join(events.dumps(e) + "\n" for e in _events(*PLAN[1])))
        rd.status_path.write_text(json.dumps({"status": "finished", "exit_codes": [0, 0], "root_cause": None,
                                              "elapsed_s": 10.0}))
        out.append(rd.path)
    return out


async def test_runs_with_the_same_name_are_told_apart(tmp_path, monkeypatch):
    """Two compared runs named the same read 'ddp mine' twice, in the rows and the legend: the
    start time tells them apart (engine.runs.compare.tell_apart, as in `torchdeck compare`)."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    try:
        paths = _same_name_runs(tmp_path / "runs")
        app = TorchdeckApp(runs_root=tmp_path / "runs", gpu_source=FakeGPUSource([]))
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.press("f2")
            assert await until(pilot, lambda: isinstance(app.screen, RunsScreen) and app.screen.loaded)
            await pilot.press("space", "down", "space", "down", "space")
            await pilot.press("c")
            assert await until(pilot, lambda: isinstance(app.screen, CompareScreen) and app.screen.loaded)
            screen = app.screen
            names = ["ddp other", "ddp mine 12:01:00", "ddp mine 12:00:00"]  # the list is newest first
            assert [c.label for c in screen.curves] == names
            table = screen.query_one(DataTable)
            assert [str(table.get_row_at(i)[0]) for i in range(3)] == names
            legend = str(screen.query_one("#cmp-legend").render())
            assert all(n in legend for n in names)
    finally:
        monkeypatch.undo()
        time.tzset()
    assert {str(p) for p in paths} == {r.run for r in screen.rows}


async def test_a_comparison_stopped_on_an_error_says_it_first(tmp_path, monkeypatch):
    """`torchdeck compare` stops with exit 2 when no run reports the target's metric and records why in
    the plan (`error`); the Compare screen showed the rows without that reason."""
    monkeypatch.chdir(tmp_path)
    where = make_comparison(Path("runs"))
    plan = json.loads((where / compare.PLAN_FILE).read_text())
    plan["error"] = "target: no run reports val_bleu (the runs report val_loss, val_acc)"
    (where / compare.PLAN_FILE).write_text(json.dumps(plan))
    app = TorchdeckApp(runs_root=Path("runs"), gpu_source=FakeGPUSource([]))
    async with app.run_test(size=(80, 24)) as pilot:
        await app.push_screen(CompareScreen(where))
        assert await until(pilot, lambda: app.screen.loaded)
        why = str(app.screen.query_one("#cmp-why").render())
        assert why.startswith("stopped: target: no run reports val_bleu"), why
        assert "dp: skipped" in why and app.screen.query_one("#cmp-why").display
