"""The screen model and latency rule the fleet benchmark times the Monitor with: what a terminal
shows after a program's output, frame by frame, and which events count (bench/ptyterm.py,
bench/fleet_views.py)."""
from __future__ import annotations

from bench.fake_run import BASE
from bench.fleet_views import SHOWN, latencies
from bench.ptyterm import SYNC_END, Screen

START = b"\x1b[?2026h"
END = SYNC_END.encode()


def test_a_synchronized_frame_ends_at_its_end_even_when_reads_cut_it():
    s = Screen(30, 3)
    assert s.feed(b"\x1b[2;4H\x1b[1;38;2;0;255;0mrank 3\x1b[0m 100003/9999999")  # no sync: every read
    assert not s.feed(START + b"\x1b[2;11H")  # synchronized from here: a frame ends at SYNC_END only
    assert not s.feed(b"100011/99")  # a number cut by the read
    assert not s.feed(b"99999\x1b[2;")  # and a sequence
    assert s.feed(b"1H" + b"x" + END)
    text = s.text()
    assert text[1] == "x  rank 3 100011/9999999      "
    assert [m.group(1) for m in SHOWN.finditer(text[1])] == ["100011"]


def test_erases_and_wide_characters_keep_the_cells_in_place():
    s = Screen(12, 2)
    s.feed("\x1b[1;1Habcdefghijkl\x1b[1;5H\x1b[K\x1b[2;1H中x".encode())
    assert s.text() == ["abcd        ", "中x" + " " * 9]  # 中 takes two cells
    s.feed(b"\x1b[2J")
    assert s.text() == [" " * 12, " " * 12]


def frames(*shown):
    """(t, {rank: step}) every 0.1 s."""
    return [(round(0.1 * i, 3), d) for i, d in enumerate(shown)]


def step(rank, k, world=256):
    return BASE + world * k + rank


def test_latency_counts_shown_ranks_and_sets_apart_those_that_leave_the_screen():
    w = 256
    fs = frames({3: step(3, 0)}, {3: step(3, 0)}, {3: step(3, 1)}, {}, {9: step(9, 5)}, {9: step(9, 5)})
    written = {step(3, 1): 0.05,  # on screen at 0.0, shown at step 1 at 0.2: 150 ms
               step(3, 2): 0.25,  # on screen at 0.2, gone at 0.3 before showing it: left, not timed
               step(9, 6): 0.45,  # on screen from 0.4 to the end without it: never reflected
               step(7, 1): 0.05}  # never on screen: not timed
    lat, missing, left = latencies(written, fs, w, 0.0, 1.0)
    assert [round(x, 3) for x in lat] == [0.15]
    assert (missing, left) == (1, 1)
