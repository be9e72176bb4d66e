"""Following a run from outside (engine.runs.follow): events, log tails, process liveness."""
from __future__ import annotations

import pytest


def test_worker_output_tail_reads_new_lines_only(tmp_path):
    from torchdeck.engine.runs.follow import FIRST_BYTES, OutputTail
    from torchdeck.engine.rundir.layout import RunDir

    (tmp_path / "supervisor.log").write_text("supervisor 1: ddp x2\n")
    (tmp_path / "rank0.log").write_text("x" * (FIRST_BYTES + 10) + "\nold line 1\nold line 2\npart")
    tail = OutputTail(RunDir(tmp_path))
    assert [x[:2] for x in tail.poll()] == [(None, "supervisor 1: ddp x2"), (0, "old line 1"), (0, "old line 2")]
    with open(tmp_path / "rank0.log", "a") as fh:
        fh.write("ial line\n")
    (tmp_path / "rank1.log").write_text("hello from rank 1\n")
    assert [x[:2] for x in tail.poll()] == [(0, "partial line"), (1, "hello from rank 1")]
    assert tail.poll() == []


def test_a_resumed_runs_curves_continue_the_old_ones(tmp_path):
    """The follower of a run resumed from another's checkpoint starts with the old run's curve up
    to that checkpoint (and nothing else of it), then the new run's own points."""
    import json

    from torchdeck.engine import config as cfgmod
    from torchdeck.engine import events
    from torchdeck.engine.runs.follow import Follower
    from torchdeck.engine.rundir.layout import RunDir

    def write(rd, evs):
        rd.events_path.write_text("".join(events.dumps(e) + "\n" for e in evs))

    def step(s, loss):
        return events.make("step", rank=0, epoch=0, step=s, total_steps=30, loss=loss, accuracy=0.1 * s,
                           samples_per_s=1.0, data_wait_s=0.0, compute_s=1.0, lr=0.1)

    old = RunDir.create(cfgmod.RunConfig(name="x"), tmp_path)
    write(old, [events.make("run_started", strategy="cpu", world_size=1, total_steps=30)]
          + [step(s, 3.0 - 0.1 * s) for s in range(1, 13)]  # stopped at 12, checkpoint at 10
          + [events.make("epoch_end", rank=0, epoch=0, step=10, train_loss=2.0, train_acc=0.5, val_loss=2.1,
                         val_acc=0.6)])
    new = RunDir.create(cfgmod.RunConfig(name="x"), tmp_path)
    new.origin_path.write_text(json.dumps({"preset": "x", "overrides": [], "resumed_from": str(old.path),
                                           "checkpoint": str(old.checkpoint_dir / "ckpt-00000010.pt")}))
    write(new, [events.make("run_started", strategy="cpu", world_size=1, total_steps=30), step(11, 1.5)])
    f = Follower(new)
    f.poll(force=True)
    xs = [x for x, _ in f.view.steps.points]
    assert xs == list(range(1, 11)) + [11]  # old steps 1-10, not 11-12 (after its checkpoint), then new 11
    assert f.view.steps.points[-1] == (11, 1.5)
    assert f.view.epochs[1].val_acc == 0.6 and f.view.best_val_acc == 0.6
    assert f.view.status == "running" or f.view.status == "starting" or f.view.final  # its own status only
    assert len(f.view.ranks) == 1 and f.view.ranks[0].step == 11


def test_every_reader_of_an_events_file_reads_one_rule(tmp_path):
    """Issue 28: engine.events.read_all parsed lines by a rule of its own, so a line holding JSON
    that is not an object reached its users (torchdeck metrics, tune, stacks, the worker's error
    summary), which call .get on each event. One parser now, the follower's: such a line, an
    empty one and a last line cut mid-write are not events."""
    from torchdeck.engine import events
    from torchdeck.engine.runs.follow import EventTail

    p = tmp_path / "events.jsonl"
    p.write_bytes(b'{"kind":"log","t":1}\n[1]\n"x"\n\n{"kind":"step"')
    assert events.read_all(p) == list(events.iter_events(p)) == [{"kind": "log", "t": 1}]
    tail = EventTail(p)
    assert tail.poll() == [{"kind": "log", "t": 1}] and tail.malformed == 2


def _state(x, seen=None):
    """Everything a view holds, as plain values that compare (NaN equal to NaN): two views built
    from one file must hold the same."""
    import dataclasses
    import math

    if isinstance(x, float):
        return "nan" if math.isnan(x) else x
    if isinstance(x, dict):
        return {k: _state(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_state(v) for v in x]
    if isinstance(x, (set, frozenset)):
        return sorted(map(repr, x))
    if dataclasses.is_dataclass(x) or hasattr(x, "__dict__"):
        return {type(x).__name__: {k: _state(v) for k, v in vars(x).items() if not callable(v)}}
    if hasattr(x, "__iter__") and not isinstance(x, (str, bytes)):
        return [_state(v) for v in x]
    return x


def _mixed_run(tmp_path):
    """A finished 2-rank run's events with what a reader must get right at any cut: multibyte
    UTF-8 (a message and a path), malformed lines, an unknown kind, and a last line cut mid-write."""
    import json

    from torchdeck.engine import config as cfgmod
    from torchdeck.engine import events
    from torchdeck.engine.rundir.layout import RunDir

    rd = RunDir.create(cfgmod.RunConfig(name="chunks"), tmp_path)
    evs = [events.make("run_started", run="chunks", strategy="ddp", world_size=2, total_steps=40, epochs=2)]
    for s in range(1, 41):
        for r in (0, 1):
            evs.append(events.make("step", rank=r, epoch=(s - 1) // 20, step=s, total_steps=40, loss=3.0 / s,
                                   accuracy=s / 40, samples_per_s=100.0 + r, data_wait_s=0.01, compute_s=0.1,
                                   lr=0.1, metrics={"ppl": 2.0 + 1 / s}))
        if s % 20 == 0:
            evs.append(events.make("epoch_end", rank=0, epoch=s // 20 - 1, step=s, train_loss=1.0 / s,
                                   train_acc=0.5, val_loss=1.2 / s, val_acc=0.6 + s / 200))
            evs.append(events.make("log", rank=0, level="warning", message=f"GPU à 84 °C, über heiß 🔥 at {s}"))
    evs.append(events.make("checkpoint", rank=0, epoch=2, step=40, path="checkpoints/ckpt-é.pt"))
    evs.append(events.make("run_finished", status="finished", exit_codes=[0, 0], root_cause=None, elapsed_s=9.0))
    # events.dumps writes ASCII (\u escapes); another writer may not: UTF-8 as it is
    lines = [json.dumps(e, ensure_ascii=False) if e["kind"] in ("log", "checkpoint") else events.dumps(e) for e in evs]
    lines[5:5] = ["not json", "[1,2]", '{"v":1,"kind":"from_the_future","t":1}', "{\"kind\":\"log\",\"message\":\"é"]
    data = ("\n".join(lines) + "\n").encode() + '{"v":1,"kind":"log","message":"cut mid-wri'.encode()
    rd.events_path.write_bytes(data)
    rd.status_path.write_text(json.dumps({"status": "finished", "exit_codes": [0, 0], "root_cause": None,
                                          "elapsed_s": 9.0}))
    return rd, data


def _follow(rd, chunk_bytes):
    from torchdeck.engine.runs.follow import Follower

    f = Follower(rd, outputs=False)
    if chunk_bytes is not None:
        f.events.chunk_bytes = chunk_bytes
    for _ in f.follow(interval=0.01):
        pass
    return f


def test_a_file_read_in_chunks_of_any_size_gives_the_view_read_whole(tmp_path):
    """Issue 37: readers go through events.jsonl a bounded chunk at a time; a chunk may end anywhere,
    inside a line or a multibyte character, and the view (and the count of skipped lines) must be
    the one the whole file gives in one read."""
    rd, data = _mixed_run(tmp_path)
    whole = _follow(rd, len(data) + 1)
    assert whole.view.status == "finished" and whole.events.malformed == 3 and whole.view.skipped == 1
    assert whole.view.ranks[0].step == 40 and len(whole.view.epochs) == 2
    first_e = data.index("é".encode())
    sizes = [1, 2, 3, 7, 64, 1000, first_e + 1, data.index("🔥".encode()) + 2]
    for n in sizes:
        part = _follow(rd, n)
        assert (part.events.malformed, part.view.skipped) == (whole.events.malformed, whole.view.skipped), n
        assert _state(part.view) == _state(whole.view), f"chunks of {n} bytes give another view"


def test_a_live_file_written_in_pieces_gives_the_view_read_whole(tmp_path):
    """The live tail: the file grows a few bytes at a time (a line, and a character, cut mid-write)
    and is polled between writes; the view it ends with is the whole file's."""
    from torchdeck.engine.runs.follow import EventTail
    from torchdeck.engine.runs.view import RunView

    rd, data = _mixed_run(tmp_path)
    whole = RunView()
    EventTail(rd.events_path).feed(whole.feed)
    p = tmp_path / "growing.jsonl"
    p.write_bytes(b"")
    tail, view = EventTail(p, chunk_bytes=4), RunView()
    for i in range(0, len(data), 5):
        with open(p, "ab") as fh:
            fh.write(data[i:i + 5])
        tail.feed(view.feed)
    assert tail.malformed == 3 and _state(view) == _state(whole)


def _long_run(tmp_path, steps: int):
    """A finished 2-rank run of `steps` step events a rank, as quickstart's supervisor writes them."""
    from torchdeck.engine import config as cfgmod
    from torchdeck.engine import events
    from torchdeck.engine.rundir.layout import RunDir

    rd = RunDir.create(cfgmod.RunConfig(name="long"), tmp_path)
    with open(rd.events_path, "w") as fh:
        fh.write(events.dumps(events.make("run_started", run="long", strategy="ddp", world_size=2)) + "\n")
        for s in range(1, steps + 1):
            for r in (0, 1):
                fh.write(events.dumps(events.make(
                    "step", rank=r, epoch=0, step=s * 10, total_steps=steps * 10, loss=2.0 / s, accuracy=0.5,
                    metrics={}, samples_per_s=1916.06, tokens_per_s=None, mfu=None, data_wait_s=0.0043,
                    compute_s=0.3296, lr=0.05, comm_s=0.1153, pause=False, device_mem_mb=1060.17,
                    peak_mem_mb=1081.36, data_wait=0.0130, comm_wait=0.3454)) + "\n")
        fh.write(events.dumps(events.make("stacks", reason="hang", groups=[], files=[])) + "\n")
        fh.write(events.dumps(events.make("run_finished", status="finished", exit_codes=[0, 0],
                                          root_cause=None, elapsed_s=9.0)) + "\n")
    return rd


def _peak(fn):
    import tracemalloc

    tracemalloc.start()
    try:
        out = fn()
        return out, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


CHUNK = 64 * 1024


@pytest.fixture
def long_run(tmp_path, monkeypatch):
    """A 2.2 MB run read in 64 KiB chunks (the readers' 1 MiB scaled down with the file)."""
    from torchdeck.engine import events

    monkeypatch.setattr(events, "CHUNK_BYTES", CHUNK, raising=False)
    rd = _long_run(tmp_path, 3000)
    assert rd.events_path.stat().st_size > 2e6
    _read_all_ways(_long_run(tmp_path / "warm", 2), tmp_path)  # the modules each way imports: not in a peak
    return rd


def _read_all_ways(rd, tmp_path):
    from torchdeck.engine import metrics
    from torchdeck.engine.rundir import stacks

    return _follow(rd, None), metrics.convert(rd.events_path, tmp_path / "m.csv"), stacks.last_recorded(rd)


CHUNKS_WORTH = 20 * CHUNK  # a chunk, its lines and the view: what a reader may hold, however long the file


def test_following_a_long_finished_run_holds_neither_the_file_nor_its_events(long_run):
    """Issue 37: attach read the whole events.jsonl in one read() and parsed every line into a list
    before folding (~3.7 KB a step event: GBs for a day-long run, 19 MB for this file). Folded a
    chunk at a time, reading it holds a few chunks' worth."""
    f, peak = _peak(lambda: _follow(long_run, None))
    assert f.view.status == "finished" and f.view.ranks[1].step == 30000
    assert peak < CHUNKS_WORTH, f"reading a 2.2 MB file peaked at {peak / 1e6:.2f} MB"


def test_metrics_and_stacks_read_a_long_run_a_chunk_at_a_time(long_run, tmp_path):
    """`torchdeck metrics --csv/--tensorboard`, `torchdeck stacks` and the Monitor's stacks pane read
    every event of a run that is over: as a list of all of them before (~15 MB for this file)."""
    from torchdeck.engine import metrics
    from torchdeck.engine.rundir import stacks

    sink, peak = _peak(lambda: metrics.convert(long_run.events_path, tmp_path / "m.csv"))
    assert sink.rows == 6000 and peak < CHUNKS_WORTH, f"metrics of a 2.2 MB file peaked at {peak / 1e6:.1f} MB"
    last, peak = _peak(lambda: stacks.last_recorded(long_run))
    assert last["reason"] == "hang" and peak < CHUNKS_WORTH, f"stacks of it peaked at {peak / 1e6:.1f} MB"


def test_every_reader_reads_in_chunks_and_drops_a_line_without_end(tmp_path, monkeypatch):
    """events.iter_events (compare, metrics, tune, stacks) and EventTail (attach, the Monitor) split
    lines with one rule at any chunk size; a "line" longer than events.MAX_LINE (garbage: no event
    is 16 MiB) is dropped up to its newline, counted once as malformed by the tail, instead of
    being gathered whole in memory."""
    from torchdeck.engine import events
    from torchdeck.engine.runs.follow import EventTail

    rd, data = _mixed_run(tmp_path)
    whole = list(events.iter_events(rd.events_path))
    assert len(whole) > 80 and whole[-1]["kind"] == "run_finished"
    for n in (1, 3, 64, data.index("é".encode()) + 1):
        assert list(events.iter_events(rd.events_path, chunk_bytes=n)) == whole, n

    monkeypatch.setattr(events, "MAX_LINE", 100)
    p = tmp_path / "garbage.jsonl"
    good = events.dumps({"kind": "log", "t": 1}).encode()
    p.write_bytes(good + b"\n" + b"x" * 1000 + b'{"kind":"log"}\n' + good + b"\n" + b"y" * 500)
    for n in (1, 7, 64, 4096):
        assert list(events.iter_events(p, chunk_bytes=n)) == [{"kind": "log", "t": 1}] * 2, n
        tail = EventTail(p, chunk_bytes=n)
        assert tail.poll() == [{"kind": "log", "t": 1}] * 2 and tail.malformed == 2, n
        assert tail._split.partial == b"", n  # the endless last "line" is not kept either


def test_a_poll_stops_at_the_next_chunk_once_asked_and_reads_on_from_there(tmp_path):
    """A day's events take minutes to read: the Monitor left while its reader thread polls (or the
    app quitting, which waits for that thread) must not wait for the whole file. Stopped, a poll
    ends after the chunk it is in; a later poll goes on from there and the view is the whole one."""
    from torchdeck.engine.runs.follow import Follower

    rd, data = _mixed_run(tmp_path)
    whole = _follow(rd, None)
    left = [False]
    f = Follower(rd, outputs=False, stop=lambda: left[0])
    f.events.chunk_bytes = 100
    folded = []
    feed = f.view.feed
    f.view.feed = lambda ev: (folded.append(ev), left.__setitem__(0, True), feed(ev))[-1]
    f.poll()
    assert len(folded) == 1 and f.events._pos <= 300 and not f.view.final, (len(folded), f.events._pos)
    left[0] = False
    f.view.feed = feed
    for _ in f.follow(interval=0.01):
        pass
    assert f.events._pos == len(data) and _state(f.view) == _state(whole.view)
