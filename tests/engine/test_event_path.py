"""The supervisor's path for rank events (issue 29's torchdeck.log cost): the ranks' pipes read by
engine.launch.ranks.EventReader into engine.supervisor.EventWriter, wired as the supervisor wires
them (reader hands lines to EventWriter.take, then calls flush_taken), fed by the ranks' real
channel (engine.launch.channel.Channel). Every event lands once, in order, in events.jsonl and
metrics.csv, and reaches the file soon enough for a follower; and it does so in rounds, not a
thread wake-up and a flush per event (each wake-up costs the CPU the ranks train on)."""
from __future__ import annotations

import os
import queue
import time

from torchdeck.engine import events
from torchdeck.engine.launch import ranks as launch_ranks
from torchdeck.engine.launch.channel import Channel
from torchdeck.engine.metrics import MetricsSink
from torchdeck.engine.supervisor import EventWriter

from tests.engine.helpers import wait_for


def _on_disk(path) -> list[dict]:
    """What a follower reads: the file itself, not the writer's buffer."""
    return events.read_all(path)


def test_rank_events_are_all_written_flushed_soon_and_read_in_rounds(tmp_path, monkeypatch):
    path = tmp_path / "events.jsonl"
    writer = EventWriter(path, queue.Queue())
    writer.metrics = MetricsSink(tmp_path / "metrics.csv")
    writer.start()
    pipes = [os.pipe() for _ in range(2)]
    reader = launch_ranks.EventReader([r for r, _ in pipes], writer.take, host="here", flush=writer.flush_taken)
    reader.start()
    chans = [Channel(w) for _, w in pipes]
    try:
        # A lone event reaches the file (flushed) within the reader's round and the writer's flush:
        # READ_EVERY_S (0.1 s) and a flush at the round's end; never if nothing flushed it.
        monkeypatch.setenv("RANK", "0")
        t0 = time.monotonic()
        assert chans[0].send("rank_ready", pid=os.getpid(), device="cpu")
        while not _on_disk(path) and time.monotonic() - t0 < 5:
            time.sleep(0.01)
        took = time.monotonic() - t0
        assert took < 0.8, f"first event reached the file after {took:.2f} s"
        assert _on_disk(path)[0]["host"] == "here"  # a rank_ready without a host gets the reader's

        # 2 ranks x 150 step events, one every 2 ms each (a logging loop's pace): every one written,
        # in order per rank, one metrics.csv row each, read and flushed in rounds.
        os.write(pipes[1][1], b"not an event\n")  # a stray line in the pipe: refused, not written
        n = 150
        for i in range(n):
            for rank, ch in enumerate(chans):
                monkeypatch.setenv("RANK", str(rank))
                assert ch.send("step", step=i + 1, epoch=None, loss=1.0 / (i + 1), metrics={}, steps_per_s=None,
                               samples_per_s=64.0, tokens_per_s=None)
            time.sleep(0.002)
        wait_for(lambda: len(_on_disk(path)) == 1 + 2 * n, timeout=10, what="every step event on disk")
        evs = _on_disk(path)
        for rank in (0, 1):
            assert [e["step"] for e in evs if e["kind"] == "step" and e["rank"] == rank] == list(range(1, n + 1))
        assert reader.refused == 1 and writer.count == 1 + 2 * n
        wait_for(lambda: len((tmp_path / "metrics.csv").read_text().splitlines()) == 1 + 2 * n, timeout=5,
                 what="a metrics.csv row per step event")
        # ~0.3 s of events at 1,000/s: a handful of rounds (one every READ_EVERY_S), each flushed once;
        # a wake-up or a flush per event would be ~300 (the bound leaves room for a loaded machine)
        assert reader.wakeups <= 40, f"{reader.wakeups} reads for {2 * n} events"
        assert writer.flushes <= reader.wakeups + 2, f"{writer.flushes} flushes in {reader.wakeups} rounds"
    finally:
        for _, w in pipes:
            os.close(w)
        reader.stop()
        writer.stop()
        writer.close()
    assert not reader.is_alive() and not writer.is_alive()


def test_a_rounds_lines_are_written_in_the_order_the_ranks_made_them(tmp_path):
    """Rank 1 raises, rank 0's error (its peer gone) follows 1 ms later, both read in one round:
    pipe order put rank 0's first in events.jsonl (CI: test_failures' first error was rank 0's)."""
    got = []
    pipes = [os.pipe() for _ in range(2)]
    first = events.make("error", rank=1, exception="RuntimeError", message="boom")
    later = dict(events.make("error", rank=0, exception="RuntimeError", message="peer gone"), t=first["t"] + 0.001)
    os.write(pipes[0][1], (events.dumps(later) + "\n").encode())  # pipe 0 is read first
    os.write(pipes[1][1], (events.dumps(first) + "\n").encode())
    reader = launch_ranks.EventReader([r for r, _ in pipes], got.append, host="here")
    reader.start()
    try:
        wait_for(lambda: len(got) == 2, timeout=5, what="both lines")
    finally:
        for _, w in pipes:
            os.close(w)
        reader.stop()
    assert [events.parse(x.encode())["rank"] for x in got] == [1, 0]
