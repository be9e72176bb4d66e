"""`torchdeck attach` of a run of hours (issue 37): Ctrl-C is answered while its events are read."""
from __future__ import annotations

import json
import os
import signal

from torchdeck.engine import events
from torchdeck.engine.config import from_dict
from torchdeck.engine.rundir.layout import RunDir
from tests.run_events import started, step

STEPS = 3000


def test_ctrl_c_detaches_while_a_long_runs_events_are_read(tmp_path, monkeypatch, capsys):
    """attach read a finished run's whole events.jsonl before it looked at Ctrl-C: minutes for a
    day-long run (190-215 s for 24 h x 8 ranks on this machine). Now the press ends the read at the
    next chunk: here Ctrl-C comes at the 50th of 6,002 events and attach detaches within that
    1 KiB chunk."""
    from torchdeck.cli.main import main
    from torchdeck.engine.runs.view import RunView

    monkeypatch.setattr(events, "CHUNK_BYTES", 1024)
    run = RunDir.create(from_dict({"name": "long", "strategy": "ddp", "accelerator": "cpu", "devices": 2,
                                   "backend": "gloo"}), tmp_path)
    evs = [started(total=STEPS)] + [step(r, s, s * 0.1, total=STEPS) for s in range(1, STEPS + 1) for r in (0, 1)]
    evs.append(events.make("run_finished", status="finished", exit_codes=[0, 0], root_cause=None, elapsed_s=1.0))
    run.events_path.write_text("".join(events.dumps(e) + "\n" for e in evs))
    run.status_path.write_text(json.dumps({"status": "finished", "exit_codes": [0, 0], "root_cause": None}))
    folded, feed = [0], RunView.feed

    def feed_and_press(self, ev):
        folded[0] += 1
        if folded[0] == 50:
            os.kill(os.getpid(), signal.SIGINT)  # attach's own handler counts it (main thread)
        return feed(self, ev)

    monkeypatch.setattr(RunView, "feed", feed_and_press)
    assert main(["attach", str(run.path)]) == 0
    out = capsys.readouterr().out
    assert "detached" in out, out[-800:]
    per_chunk = 1024 // min(len(events.dumps(e)) for e in evs) + 1
    assert folded[0] <= 50 + per_chunk, f"attach read {folded[0]} of {len(evs)} events after Ctrl-C"
