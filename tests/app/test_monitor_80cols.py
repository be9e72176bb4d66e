"""The Monitor at 80x24, read as a person reads it (issue 35 bugs 5 and 14): each item of the header
whole on one line (wrapped between items, never inside one), 256 silent ranks said as attach says
them ('0-255'), the balance line whole or shortened with intent, units on every rate."""
from __future__ import annotations

import pytest

from torchdeck.app.monitor.screen import MonitorScreen
from tests.app.screen_helpers import screen_text
from tests.app.test_snapshots_monitor import GPUS, H100, NOW, app, fleet_run, make_run  # noqa: F401 (fixture)

SIZE = (80, 24)


async def open_monitor(pilot, run, n_events, now):
    screen = MonitorScreen(run.path, now=lambda: now, sample_every=3600)
    await pilot.app.push_screen(screen)
    for _ in range(300):
        if screen.run_state.events == n_events:
            break
        await pilot.pause(0.05)
    assert screen.run_state.events == n_events
    screen.repaint()
    await pilot.pause(0.3)
    return screen


async def test_a_silent_fleet_is_named_as_a_range_in_two_header_lines_not_256_numbers(app, tmp_path):
    """Every one of 256 ranks silent a minute after the last event: `STALLED: ranks 0-255 silent`,
    as `torchdeck attach` says it, and the header keeps to its lines (it took 15 of 24)."""
    from torchdeck.app.sources.nvml import FakeGPUSource

    app._gpu_source = FakeGPUSource(H100)
    run, n_events, last = fleet_run(tmp_path, seconds=8)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_monitor(pilot, run, n_events, last + 120)
        assert len(screen.run_state.stale_ranks(last + 120)) == 256
        text = screen_text(app)
        assert "STALLED: ranks 0-255 silent" in text, text
        assert "0,1,2" not in text, text
        head = screen.query_one("#mon-header")
        lines = text.splitlines()[:head.region.height]
        assert head.region.height <= 4, (head.region.height, text)  # 15 of 24 before
        assert any("STALLED: ranks 0-255 silent" in ln for ln in lines), lines


def header_lines(app, screen) -> list[str]:
    return screen_text(app).splitlines()[:screen.query_one("#mon-header").region.height]


async def test_the_header_wraps_between_items_never_inside_one(app, tmp_path):
    """At 80 columns `val acc⏎ 70.0%` and `1,187⏎ samples/s` were cut in two by the wrap."""
    run, n_events = make_run(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_monitor(pilot, run, n_events, NOW)
        lines = header_lines(app, screen)
        for item in ("RUNNING  20250615-101500-ddp-a100", "global batch 256", "elapsed 01:35", "ETA 01:01",
                     "2,300 samples/s", "step 180/300", "val acc 70.0%"):
            assert any(item in ln for ln in lines), (item, lines)
        assert all(ln.rstrip().endswith(("·", "·  ")) is False for ln in lines), lines  # no dangling separator
        assert len(lines) == 3, lines


def test_flow_breaks_lines_only_between_items():
    from rich.text import Text

    from torchdeck.app.monitor.panes import flow

    items = [Text(w) for w in ("elapsed 01:35", "ETA 01:01", "1,187 samples/s", "val acc 70.0%")]
    assert flow(items).plain == "elapsed 01:35  ·  ETA 01:01  ·  1,187 samples/s  ·  val acc 70.0%"
    assert flow(items, 40).plain.split("\n") == ["elapsed 01:35  ·  ETA 01:01", " 1,187 samples/s  ·  val acc 70.0%"]
    assert flow(items, 40, start=20).plain.split("\n")[0] == "elapsed 01:35"  # the line's start counts
