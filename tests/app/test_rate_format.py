"""One rate format (issue 36 item 5): steps/s was `3.4` in `torchdeck launch`/`attach` and `3.40`
in the Monitor for the same number. The CLI's lines and the Monitor's panes now say a rate alike
(engine.fmt.steps_rate: three significant figures), read here from their own text functions."""
from __future__ import annotations

import re

from torchdeck.app.monitor import panes
from torchdeck.engine import events
from torchdeck.engine.runs.progress import script_header, script_rank_line
from torchdeck.engine.runs.view import RunView

T = 1000.0
WIDTH = 100


def _script_run(paces: list[float]) -> RunView:
    """A user's script on len(paces) ranks, rank r stepping at paces[r] optimizer steps/s."""
    n = len(paces)
    evs = [events.make("run_started", strategy="script", run_kind="script", world_size=n, total_steps=None,
                       epochs=None, end_epoch=None, devices=["cpu"] * n, command=["python", "train.py"]),
           *[events.make("rank_ready", rank=r, local_rank=r, device=None, pid=100 + r) for r in range(n)],
           *[events.make("step", rank=r, step=120, steps_per_s=p, loss=None, samples_per_s=None)
             for r, p in enumerate(paces)]]
    for e in evs:
        e["t"] = T
    return RunView.replay(evs)


def _said(text: str) -> str:
    m = re.search(r"(\S+) steps/s", text)
    assert m, text
    return m.group(1)


def _monitor_cell(view: RunView, rank: int) -> str:
    """The steps/s column of the Monitor's rank row (rank, step, loss, steps/s, samples/s, pid, seen)."""
    header = panes.script_rank_header(WIDTH).plain
    row = panes.script_rank_text(view, view.ranks[rank], T + 1, WIDTH).plain
    end = header.index("steps/s") + len("steps/s")  # the column is right-aligned under its name
    return row[:end].split()[-1]


def test_the_cli_and_the_monitor_write_a_rank_s_steps_per_s_alike():
    expected = {3.4217: "3.42", 34.217: "34.2", 0.0523: "0.0523", 1234.7: "1,235", 12.5: "12.5"}
    for pace, text in expected.items():
        view = _script_run([pace])
        cli = _said(script_rank_line(view, view.ranks[0], T + 1, WIDTH))
        assert cli == _monitor_cell(view, 0) == text, (pace, cli, _monitor_cell(view, 0))


def test_the_cli_and_the_monitor_headers_say_the_run_s_pace_alike():
    view = _script_run([3.4217, 8.1])  # the pace is the slowest rank's
    cli = _said(script_header(view, T + 1, WIDTH))
    monitor = _said(panes.header_text(view, T + 1, "run", WIDTH).plain)
    assert cli == monitor == "3.42", (cli, monitor)
