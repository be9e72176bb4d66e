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


def rows_of(app, title: str) -> list[str]:
    """The lines inside a bordered pane, found by its title."""
    lines = screen_text(app).splitlines()
    start = next((i for i, ln in enumerate(lines) if f"─ {title} " in ln), None)
    if start is None:  # not drawn (yet)
        return []
    out = []
    for ln in lines[start + 1:]:
        if ln.lstrip().startswith("╰"):
            break
        out.append(ln.strip().strip("│▏▕▇▆▅▄▃▂▁").strip())
    return out


async def test_the_balance_line_and_the_fleet_rows_are_whole_at_80_columns(app, tmp_path):
    """The balance line was cut (`all-re…`), a node's flags too (`hot GP…`), and the ranks' summary
    ended in `steps…`: each is shortened on purpose, every word whole."""
    from torchdeck.app.sources.nvml import FakeGPUSource

    app._gpu_source = FakeGPUSource(H100)
    run, n_events, last = fleet_run(tmp_path, seconds=8)
    async with app.run_test(size=(80, 40)) as pilot:  # 40 rows: the nodes pane in view too
        screen = await open_monitor(pilot, run, n_events, last + 0.5)
        title = "nodes: ranks and GPUs (n opens one)"
        for _ in range(600):  # under load the panes are painted after open_monitor's pause
            if len(rows_of(app, "ranks")) > 1 and any(ln.startswith("▸  17 ") for ln in rows_of(app, title)):
                break
            await pilot.pause(0.05)
        ranks = rows_of(app, "ranks")
        assert not any(ln.endswith("…") for ln in ranks), ranks
        assert "rank 203 (node 25) holds the others back: 95% compute" in ranks, ranks
        assert any(ln.startswith("rank 5 (node 0) waits ") and ln.endswith("% in the all-reduce") for ln in ranks), ranks
        assert ranks[1] == "256 ranks on 32 nodes  ·  samples/s min 352, median 636, max 640", ranks
        nodes = rows_of(app, title)
        assert not any(ln.endswith("…") for ln in nodes), nodes
        five = next((ln for ln in nodes if ln.startswith("▸   5 ")), "")
        assert five.endswith("g3 84°C data wait, hot GPU"), nodes  # the wait and the GPU are in their columns
        assert next((ln for ln in nodes if ln.startswith("▸  17 ")), "").endswith("slow 20%, idle GPUs"), nodes


def test_node_flags_at_80_columns_keep_whole_words_and_count_the_rest():
    from torchdeck.app.monitor.nodes import narrow_flags

    flags = ["stale 8", "data wait 32%", "hot GPU 3 84°C", "GPU 2 memory 97%", "slow rank 203"]
    assert narrow_flags(flags, 80) == ["stale 8", "data wait", "hot GPU", "g2 mem 97%", "slow r203"]
    assert narrow_flags(flags, 24) == ["stale 8", "data wait", "+3"]
    assert narrow_flags(["idle GPU 5%"], 20) == ["idle GPU"]


async def test_a_one_node_balance_line_and_the_rate_spread_say_their_units(app, tmp_path):
    from torchdeck.app.monitor.panes import rank_spread_text

    run, n_events = make_run(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_monitor(pilot, run, n_events, NOW)
        for _ in range(600):  # under load the pane is painted after open_monitor's pause
            if any("holds the others back" in ln for ln in rows_of(app, "ranks")):
                break
            await pilot.pause(0.05)
        ranks = rows_of(app, "ranks")
        assert ranks[-2:] == ["rank 1 holds the others back: 73% compute", "rank 0 waits 30% in the all-reduce"], ranks
        # without all-reduce timings the spread of the rates: a unit on each rate (it said `1,010/s`)
        st = screen.run_state
        st.balance = lambda: None
        said = rank_spread_text(st).plain
        assert said.startswith("rank balance: slowest rank 1 1,010 samples/s, fastest rank 0 1,290: "), said


async def test_checkpoint_paths_in_the_log_are_shown_whole_at_80_columns(app, tmp_path):
    """A checkpoint path in the run's folder is said relative to it; a long one elsewhere by its tail,
    never folded inside a word."""
    from torchdeck.engine import events
    from torchdeck.app.monitor.panes import LogPane

    run, n_events = make_run(tmp_path)
    far = "/scratch/project/team/experiments/a-rather-long-folder-name/of/checkpoints/for/this/run/ckpt-200.pt"
    with open(run.events_path, "a") as fh:
        for step, path in ((190, str(run.path / "checkpoints" / "ckpt-190.pt")), (200, far)):
            e = events.make("checkpoint", rank=0, epoch=2, step=step, path=path)
            e["t"] = NOW - 1
            fh.write(events.dumps(e) + "\n")
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_monitor(pilot, run, n_events + 2, NOW)
        pane = screen.query_one(LogPane)
        width = pane.scrollable_content_region.width
        lines = [strip.text.rstrip() for strip in pane.lines]
        assert "[info] rank 0: checkpoint saved: checkpoints/ckpt-190.pt (step 190)" in lines, lines
        tail = next(ln for ln in lines if "ckpt-200.pt" in ln)
        assert tail.startswith("…/") and len(tail) <= width and "/this/run/ckpt-200.pt" in tail, (tail, lines)
