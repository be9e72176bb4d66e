"""The Monitor on a run of hours (issue 37): its reader thread folds events.jsonl a chunk at a time,
and stops at its next chunk once the screen is left."""
from __future__ import annotations

import json
import threading

from torchdeck.engine import events
from torchdeck.engine.config import from_dict
from torchdeck.engine.rundir.layout import RunDir
from tests.app.test_monitor import form_mounted, make_app, until
from tests.run_events import started, step

STEPS = 3000  # x 2 ranks: ~600 chunks of 1 KiB


async def test_leaving_the_monitor_of_a_long_run_stops_its_reader(tmp_path, monkeypatch):
    """A day's events take the reader thread minutes; left (Escape, or ctrl+q: the app waits for the
    thread as it exits) it read on to the end: ctrl+q on the Monitor of a 2-hour 8-rank run exited
    after 8-11 s, now 0.5-0.7 s. Here the reader is held after its 50th event while the screen is
    left: the poll then ends within the chunk it was in, not after the run's 6,000 events."""
    from torchdeck.app.monitor.screen import MonitorScreen
    from torchdeck.engine.runs import follow
    from torchdeck.engine.runs.view import RunView

    monkeypatch.setattr(events, "CHUNK_BYTES", 1024)
    run = RunDir.create(from_dict({"name": "long", "strategy": "ddp", "accelerator": "cpu", "devices": 2,
                                   "backend": "gloo"}), tmp_path / "runs")
    evs = [started(total=STEPS)] + [step(r, s, s * 0.1, total=STEPS) for s in range(1, STEPS + 1) for r in (0, 1)]
    evs.append(events.make("run_finished", status="finished", exit_codes=[0, 0], root_cause=None, elapsed_s=1.0))
    run.events_path.write_text("".join(events.dumps(e) + "\n" for e in evs))
    run.status_path.write_text(json.dumps({"status": "finished", "exit_codes": [0, 0], "root_cause": None}))

    folded, held, go, returned = [0], threading.Event(), threading.Event(), threading.Event()
    feed, poll = RunView.feed, follow.Follower.poll

    def slow_feed(self, ev):
        folded[0] += 1
        if folded[0] == 50:
            held.set()
            go.wait(30)
        return feed(self, ev)

    def watched_poll(self, *a, **k):
        try:
            return poll(self, *a, **k)
        finally:
            if held.is_set():
                returned.set()

    monkeypatch.setattr(RunView, "feed", slow_feed)
    monkeypatch.setattr(follow.Follower, "poll", watched_poll)
    app = make_app(tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await form_mounted(pilot, app)
        screen = MonitorScreen(run.path)
        await app.push_screen(screen)
        await until(pilot, held.is_set, 20, "the Monitor's reader at its 50th event")
        app.pop_screen()
        await until(pilot, screen._quit_evt.is_set, 10, "the Monitor left")
        go.set()
        await until(pilot, returned.is_set, 20, "the reader's poll returned")
    per_chunk = 1024 // min(len(events.dumps(e)) for e in evs) + 1
    assert folded[0] <= 50 + per_chunk, f"the reader folded {folded[0]} of {len(evs)} events after it was left"
