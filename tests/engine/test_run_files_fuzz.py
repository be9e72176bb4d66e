"""Every file of a run directory is input: events.jsonl with malformed, truncated, reordered and
unknown lines, a garbled status.json, a stale pid file. The follower (torchdeck attach, the
Monitor), the reducer, the catalog (torchdeck runs, the Runs screen) and the Monitor's panes
never raise on them, and the CLI and the app report the same status for every case."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from torchdeck.engine import config as cfgmod
from torchdeck.engine import events
from torchdeck.engine.runs.catalog import collect, summarize
from torchdeck.engine.runs.follow import Follower
from torchdeck.engine.rundir.layout import RunDir

T0 = 1_700_000_000.0


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


DEAD = _dead_pid()


def _ev(kind, t, **f) -> dict:
    e = events.make(kind, **f)
    e["t"] = T0 + t
    return e


GOOD = [
    _ev("run_started", 0, run="r", strategy="ddp", world_size=2, nproc_per_node=2, node_rank=0, num_nodes=1,
        global_batch=64, devices=["cpu", "cpu"], master_addr="127.0.0.1", master_port=1, pid=DEAD, host="h",
        total_steps=10, epochs=2),
    _ev("rank_ready", 1, rank=0, local_rank=0, device="cpu", pid=DEAD, host="h", threads=1),
    _ev("step", 2, rank=0, epoch=0, step=3, total_steps=10, loss=1.0, samples_per_s=10.0, data_wait_s=0.1,
        compute_s=0.9, lr=0.1, accuracy=0.5),
    _ev("step", 3, rank=1, epoch=0, step=3, total_steps=10, loss=1.1, samples_per_s=9.0, data_wait_s=0.2,
        compute_s=0.8, lr=0.1, accuracy=None),
    _ev("epoch_end", 4, rank=0, epoch=0, step=5, train_loss=0.9, train_acc=0.6, val_loss=0.8, val_acc=0.7),
    _ev("checkpoint", 5, rank=0, epoch=0, step=5, path="checkpoints/ckpt-5.pt"),
    _ev("log", 6, rank=None, level="warning", message="hello"),
    _ev("error", 7, rank=1, host="h", pid=DEAD, exception="RuntimeError", message="boom", traceback="tb"),
    _ev("rank_exited", 8, rank=1, exitcode=1, signal=None),
    _ev("rank_report", 8, rank=0, reports=[{"rank": 2, "host": "o", "node_rank": 1, "epoch": 0, "step": 2,
                                            "samples_per_s": 3.0, "data_wait": 0.5, "device_mem_mb": 1.0, "t": T0}]),
    _ev("run_finished", 9, status="failed", exit_codes=[0, 1], root_cause="rank 1: boom", elapsed_s=9.0),
    _ev("run_finished", 9, status="stopped", exit_codes=[0, 0], root_cause=None, elapsed_s=9.0),
]

BAD_LINES = [
    '{"v":1,"kind":"step","t":1.0,"rank":"x","step":"a"}',  # the case from the issue
    "not json at all",
    "[1, 2, 3]",
    '"a string"',
    "{",
    '{"kind": null}',
    '{"v":1,"kind":"from_the_future","t":1,"rank":0}',
    '{"v":1,"kind":"step","t":"yesterday","rank":true,"step":null,"loss":"NaN","total_steps":-5}',
    '{"v":1,"kind":"epoch_end","t":1e400,"rank":[0],"epoch":{"a":1}}',
    '{"v":1,"kind":"rank_report","t":2,"reports":"nope"}',
    '{"v":1,"kind":"rank_report","t":2,"reports":[{"rank":"z"},7,null]}',
    '{"v":1,"kind":"run_started","t":0,"world_size":"two","devices":"cpu","pid":"p","global_batch":true}',
    '{"v":1,"kind":"run_finished","t":3,"status":"exploded","elapsed_s":"x"}',
    '{"v":1,"kind":"rank_exited","t":3,"rank":99999999999}',
    '{"v":1,"kind":"error","t":3,"rank":0,"traceback":{"no":"text"}}',
    '\x00\xff garbage',
]

line = st.one_of(st.sampled_from(GOOD).map(events.dumps), st.sampled_from(BAD_LINES),
                 st.text(max_size=40).filter(lambda s: "\n" not in s and "\r" not in s))
status_file = st.one_of(st.none(), st.sampled_from([
    {"status": "finished", "exit_codes": [0], "root_cause": None, "elapsed_s": 3.0},
    {"status": "failed", "root_cause": "x"}, {"status": "weird"}, [1, 2], "garbage-not-json", {"elapsed_s": "x"}]))
pid_file = st.sampled_from([None, "dead", "junk"])


def _write(root: Path, lines: list[str], cut_last: bool, status, pid) -> RunDir:
    rd = RunDir.create(cfgmod.RunConfig(name="fuzz"), root)
    text = "".join(ln + "\n" for ln in lines)
    if cut_last and text:
        text = text[: max(0, len(text) - 7)]  # a line cut mid-write
    rd.events_path.write_bytes(text.encode("utf-8", "surrogatepass"))
    if status is not None:
        rd.status_path.write_text(status if isinstance(status, str) else json.dumps(status))
    if pid == "dead":
        rd.pid_path.write_text(f"{DEAD}\n")
    elif pid == "junk":
        rd.pid_path.write_text("not-a-pid\n")
    old = time.time() - 3600  # not a young directory: no pid means it never started
    for p in rd.path.iterdir():
        os.utime(p, (old, old))
    return rd


def _paint(view, now: float) -> None:
    """What the Monitor draws from a view, without a terminal: must not raise either."""
    from torchdeck.app.monitor import panes

    panes.header_text(view, now, "x")
    for r in view.rank_list():
        panes.rank_text(view, r, now, 120)
        panes.rank_text(view, r, now, 60)
    panes.rank_spread_text(view)
    for ln in view.logs:
        panes.log_lines(ln)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=st.lists(line, max_size=25), shuffle=st.randoms(use_true_random=False), cut_last=st.booleans(),
       status=status_file, pid=pid_file)
def test_readers_never_raise_and_agree_on_every_events_file(tmp_path_factory, lines, shuffle, cut_last, status, pid):
    from torchdeck.cli.progress import Display

    root = tmp_path_factory.mktemp("runs")
    shuffle.shuffle(lines)
    rd = _write(root, lines, cut_last, status, pid)

    follower = Follower(rd)  # what `torchdeck attach` and the Monitor run
    for _ in follower.follow(interval=0.01):
        pass
    seen = follower.view
    assert seen.final  # a run with nothing alive is over, one way or another
    now = time.time()
    _paint(seen, now)
    import io
    d = Display(io.StringIO(), tty=True, width=80)
    d.show(seen, force=True)
    d.finish(seen)

    (row,) = collect(root)  # what `torchdeck runs` and the Runs screen list
    assert row.status == seen.status == summarize(rd).status
    assert row.cells()["status"] == str(seen.status)


def test_attach_on_a_malformed_line_shows_the_run_and_exits_0(tmp_path, capsys):
    """The line from the issue made `torchdeck attach` stop with ValueError; now it is skipped and said."""
    from torchdeck.cli.main import main

    good = [GOOD[0], GOOD[1], GOOD[2], GOOD[4],
            _ev("run_finished", 9, status="finished", exit_codes=[0, 0], root_cause=None, elapsed_s=9.0)]
    lines = [events.dumps(good[0]), BAD_LINES[0], "not json"] + [events.dumps(e) for e in good[1:]]
    rd = _write(tmp_path, lines, False, {"status": "finished", "exit_codes": [0, 0], "root_cause": None}, None)
    assert main(["attach", str(rd.path)]) == 0
    out = capsys.readouterr().out
    assert "run finished" in out and "val accuracy 70.0%" in out
    assert "2 line(s) of events.jsonl could not be read and were skipped" in out
