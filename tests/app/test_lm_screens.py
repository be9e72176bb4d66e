"""A language-model run (no accuracy: validation loss, perplexity, tokens/s, an extra metric) in
the Runs list and the Monitor at 80x24, as a user opens it: the list's column says loss, the
Monitor's header its loss with its best and its tokens/s, the Ranks pane tokens/s and no accuracy
column, the curves its own metrics. Hand-written events (tests/cli/test_task_views.py's)."""
from __future__ import annotations

import json

from textual.widgets import DataTable

from torchdeck.app.main import TorchdeckApp
from torchdeck.app.monitor.panes import Curves, metric_series
from torchdeck.app.monitor.screen import MonitorScreen
from torchdeck.app.runs.screen import RunsScreen
from torchdeck.app.sources.nvml import FakeGPUSource
from torchdeck.engine import config as cfgmod
from torchdeck.engine import events
from torchdeck.engine.rundir.layout import RunDir
from tests.app.screen_helpers import screen_text, until
from tests.cli.test_task_views import lm_events


async def test_a_language_model_run_in_the_runs_list_and_the_monitor_at_80x24(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHDECK_PRESETS", str(tmp_path / "presets"))
    root = tmp_path / "runs"
    rd = RunDir(root / "20260101-000000-lm")
    rd.path.mkdir(parents=True)
    cfgmod.save(cfgmod.from_dict({"name": "lm", "strategy": "ddp", "devices": 2, "backend": "gloo"}), rd.config_path)
    evs = lm_events() + [events.make("run_finished", status="finished", exit_codes=[0, 0], root_cause=None,
                                     elapsed_s=12.0)]
    evs[-1]["t"] = evs[-2]["t"] + 1
    rd.events_path.write_text("".join(events.dumps(e) + "\n" for e in evs))
    rd.status_path.write_text(json.dumps({"status": "finished", "exit_codes": [0, 0], "root_cause": None,
                                          "elapsed_s": 12.0}))
    app = TorchdeckApp(runs_root=root, gpu_source=FakeGPUSource([]))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("f2")
        assert await until(pilot, lambda: isinstance(app.screen, RunsScreen) and app.screen.loaded)
        table = app.screen.query_one(DataTable)
        labels = {c.key.value: str(c.label) for c in table.ordered_columns}
        assert labels.get("val") == "Val loss", labels
        assert "2.0000 (best 1.9000)" in screen_text(app)

        await pilot.press("enter")
        assert await until(pilot, lambda: isinstance(app.screen, MonitorScreen) and app.screen.run_state.final)
        screen = app.screen
        assert await until(pilot, lambda: "val loss" in screen_text(app))
        text = " ".join(screen_text(app).split())  # the header wraps at 80 columns
        assert "val loss 2.0000 (best 1.9000)" in text and "perplexity 7.3891" in text, text
        lines = screen_text(app).splitlines()  # the header wraps at 80 columns, between its items only
        assert any("mean 8,192 tokens/s" in ln for ln in lines) and any("MFU 35%" in ln for ln in lines), lines
        assert "tokens/s" in str(screen.query_one("#rank-head").render())
        assert "acc" not in text.replace("accum", "")  # no accuracy anywhere: not 'val acc', not 'tr.acc'
        curves = screen.query_one(Curves)
        assert await until(pilot, lambda: curves._drawn == screen.run_state.curve_version)
        assert curves.query_one("#plot-acc").display  # the metrics' plot, not an empty accuracy one
        ep = [screen.run_state.epochs[k] for k in sorted(screen.run_state.epochs)]
        assert list(metric_series(screen.run_state, ep)) == ["grad_norm", "perplexity"]


async def test_the_compare_dialogs_target_takes_a_metric_as_torchdeck_compare_does(tmp_path, monkeypatch):
    from textual.widgets import Input

    from torchdeck.app.compare.dialog import CompareDialog
    from torchdeck.engine.runs.metric import Target

    monkeypatch.setenv("TORCHDECK_PRESETS", str(tmp_path / "presets"))
    app = TorchdeckApp(gpu_source=FakeGPUSource([]), runs_root=tmp_path / "runs")
    async with app.run_test(size=(80, 24)) as pilot:
        assert await until(pilot, lambda: getattr(app.screen, "cfg", None) is not None)
        await pilot.press("f7")
        assert await until(pilot, lambda: isinstance(app.screen, CompareDialog))
        dialog = app.screen
        field = dialog.query_one("#cmp-target", Input)
        for text, want in (("val_loss<=1.6", Target("val_loss", "<=", 1.6)), ("60%", Target("val_acc", ">=", 0.6)),
                           ("", None)):
            field.value = text
            assert dialog.choice()["target"] == want, text
        field.value = "val_loss=1.6"
        assert dialog.choice().startswith("target: 'val_loss=1.6': write METRIC>=VALUE")
        await pilot.click("#go")
        assert "write METRIC>=VALUE" in screen_text(app) and isinstance(app.screen, CompareDialog)  # it stays open
