"""Headless progress (cli.progress): a RunView drawn as text, in a pipe and on a terminal of any width."""
from __future__ import annotations

import io
import re

from torchdeck.cli.progress import Display, block
from torchdeck.engine import events
from torchdeck.engine.runs.view import RunView

_ESC = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")


def screen_of(raw: str, cols: int, rows: int = 60) -> list[str]:
    """What a terminal of `cols` shows after `raw` (bench.ptyterm's model of one), blank rows dropped."""
    from bench.ptyterm import Screen

    scr = Screen(cols, rows)
    scr.feed(raw.replace("\n", "\r\n").encode())  # the tty driver's onlcr
    return [ln.rstrip() for ln in scr.text() if ln.strip()]


def _step(rank, step, sps, wait=0.1, total=100):
    return events.make("step", rank=rank, epoch=0, step=step, total_steps=total, loss=1.0 / (rank + 1),
                       samples_per_s=sps, data_wait_s=wait, compute_s=1.0 - wait, lr=0.1, accuracy=None)


def _started(n, total=100):
    return events.make("run_started", strategy="ddp", world_size=n, total_steps=total, global_batch=8 * n,
                       devices=["cpu"] * n, epochs=3)


def view_of(evs) -> RunView:
    v = RunView()
    v.feed_all(evs)
    return v


def test_progress_one_line_per_rank_then_compact_beyond_8():
    def shown(n):
        buf = io.StringIO()
        d = Display(buf, tty=False, interval=0)
        v = view_of([_started(n)] + [_step(r, 10 + r, 100.0 + r, wait=0.5 if r == 3 else 0.1) for r in range(n)])
        d.show(v)
        d.finish(v)
        return buf.getvalue()

    out = shown(4)
    assert sum(ln.startswith("rank ") for ln in out.splitlines()) == 4
    assert "rank  3" in out and "wait  50%" in out and "13/100" in out
    assert "world 4" in out and f"{sum(100 + r for r in range(4)):,} samples/s" in out

    out = shown(16)
    assert not any(ln.startswith("rank ") for ln in out.splitlines())
    assert "16 ranks  steps 10-25/100" in out
    assert "min 100  median 108  max 115  slowest rank 0" in out


def test_progress_on_node_0_shows_other_nodes_ranks_from_rank_reports():
    """`torchdeck run --node-rank 0` sees only its own ranks' events; rank 0's rank_report carries
    the others. Local ranks keep their own (newer, richer) step events."""
    rows = [{"rank": r, "host": "a" if r < 2 else "b", "node_rank": r // 2, "epoch": 0, "step": 7,
             "samples_per_s": 50.0 + r, "data_wait": 0.25, "device_mem_mb": 1.0, "t": 1.0} for r in range(4)]
    v = view_of([_started(4)]
                + [events.make("rank_ready", rank=r, local_rank=r, device="cpu", pid=1, host="a", threads=1)
                   for r in (0, 1)]
                + [_step(0, 20, 100.0), _step(1, 20, 90.0), events.make("rank_report", rank=0, reports=rows)])
    buf = io.StringIO()
    d = Display(buf, tty=False, interval=0)
    d.finish(v)
    lines = {int(ln.split()[1]): ln for ln in buf.getvalue().splitlines() if ln.startswith("rank ")}
    assert sorted(lines) == [0, 1, 2, 3]
    assert "20/100" in lines[0] and "20/100" in lines[1] and "wait  10%" in lines[0]
    for r in (2, 3):
        assert "node 1" in lines[r] and " 7/100" in lines[r] and "wait  25%" in lines[r]


def test_progress_redraws_in_place_on_a_tty_at_most_4_hz_and_at_least_once():
    buf = io.StringIO()
    d = Display(buf, tty=True, width=100)
    v = RunView()
    v.feed(_started(2))
    for i in range(50):  # a burst of events: far more than 4 frames' worth
        v.feed_all([_step(0, i, 10.0), _step(1, i, 10.0)])
        d.show(v)
    drawn = d.frames
    assert 1 <= drawn <= 2  # the first frame comes at once; the burst takes well under 0.5 s
    d.show(v, force=True)
    shown = screen_of(buf.getvalue(), 100)
    assert [ln[:7] for ln in shown] == ["run sta", "first s", "RUNNING", "rank  0", "rank  1"], shown  # in place
    assert "49/100" in shown[-1]


def test_progress_failure_summary_names_the_root_cause():
    v = view_of([_started(2, total=10),
                 events.make("error", rank=1, host="node7", pid=42, exception="ValueError", message="bad batch",
                             traceback="Traceback (most recent call last):\n  File \"x.py\", line 1\nValueError: bad batch"),
                 events.make("rank_exited", rank=1, exitcode=1, signal=None),
                 events.make("run_finished", status="failed", exit_codes=[0, 1],
                             root_cause="rank 1 (node7): ValueError: bad batch")])
    buf = io.StringIO()
    d = Display(buf, tty=False)
    d.show(v)
    d.finish(v)
    out = buf.getvalue()
    assert len([ln for ln in out.splitlines() if ln.startswith("FAILED |")]) == 1  # not once per draw
    assert "[error] rank 1 on node7 (pid 42): ValueError: bad batch" in out
    assert "run failed" in out and "root cause: rank 1 (node7): ValueError: bad batch" in out
    assert '    File "x.py", line 1' in out


def test_every_line_of_the_live_block_fits_the_terminal_at_80_and_40_columns():
    """An 80-column SSH terminal must never wrap a line of the block: a wrapped line breaks the
    in-place redraw (the header and rank lines then repeat down the screen)."""
    v = view_of([_started(2, total=12_345)]
                + [events.make("rank_ready", rank=r, local_rank=r, device="cuda:1234567", pid=1, host="a",
                               threads=1) for r in (0, 1)]
                + [_step(0, 10_000, 123_456.0, total=12_345), _step(1, 9_999, 99_999.0, total=12_345)])
    for width in (200, 120, 80, 60, 40):
        buf = io.StringIO()
        d = Display(buf, tty=True, width=width)
        d.show(v, force=True)
        lines = [ln for ln in _ESC.sub("", buf.getvalue()).replace("\r", "\n").split("\n")
                 if ln and not ln.startswith(("run started", "first step", "  "))]  # the block, not the messages
        assert len(lines) == 3, lines
        for ln in lines:
            assert len(ln) < width, (width, ln)
    buf = io.StringIO()
    Display(buf, tty=True, width=200).show(v, force=True)
    assert "cuda:12345" in buf.getvalue() and "wait" in buf.getvalue()  # wide: every column
    buf = io.StringIO()
    Display(buf, tty=True, width=60).show(v, force=True)
    assert "cuda" not in buf.getvalue() and "10000/12345" in buf.getvalue()  # narrow: device dropped first


def test_a_resize_redraws_at_once_and_moves_up_over_the_rewrapped_block():
    v = view_of([_started(2)] + [_step(0, 5, 10.0), _step(1, 5, 10.0)])

    class Term(io.StringIO):
        cols = 120

    buf = Term()
    d = Display(buf, tty=True, interval=3600)
    d._fixed_width = None
    d.__class__ = type("D", (Display,), {"width": property(lambda self: buf.cols)})
    d.show(v, force=True)
    first = [ln for ln in _ESC.sub("", buf.getvalue()).split("\n") if ln.startswith(("RUNNING", "rank"))]
    widest = max(len(ln) for ln in first)
    buf.cols = 40  # the terminal shrank: the old lines now take more rows each
    d._on_resize()
    before = len(buf.getvalue())
    d.show(v)  # within the interval, but a resize redraws at once
    redraw = buf.getvalue()[before:]
    assert redraw, "no redraw after the resize"
    rows_before = sum(-(-len(ln) // 40) for ln in first)
    assert widest > 40 and redraw.count("\x1b[1A") == rows_before - 1, repr(redraw)  # up over every rewrapped row
    new = [ln for ln in _ESC.sub("", redraw).replace("\r", "\n").split("\n") if ln]
    assert new and all(len(ln) < 40 for ln in new), new


def test_lines_that_arrive_out_of_time_order_are_all_printed_once():
    v = view_of([_started(2)])
    buf = io.StringIO()
    d = Display(buf, tty=False, interval=0)
    d.show(v)
    late = events.make("log", rank=None, level="warning", message="said early, read late")
    late["t"] = v.logs[0].t - 5  # goes in before "run started"
    v.feed_all([late, events.make("log", rank=0, level="warning", message="and then this")])
    d.show(v)
    d.show(v)
    out = buf.getvalue()
    assert out.count("said early, read late") == 1 and out.count("and then this") == 1


def test_messages_wrap_at_the_terminal_under_an_indent_and_keep_tracebacks():
    """A long message wrapped by the terminal broke at column 80 mid-number (`acc 88.9` / `%`) and
    its rest read as a new line; on a TTY it now wraps between words under a 2-space indent."""
    buf = io.StringIO()
    d = Display(buf, tty=True, width=40)
    d.message("epoch 1/3 done at step 64: train loss 1.6634 acc 40.9%, val loss 0.3350 acc 88.9%")
    d.message('[error] rank 1: ValueError: bad\n  File "x.py", line 1, in f\n    raise ValueError("bad")')
    lines = buf.getvalue().splitlines()
    assert all(len(ln) <= 40 for ln in lines), lines
    assert lines[0].startswith("epoch 1/3") and all(ln.startswith("  ") for ln in lines[1:3])
    assert "88.9%" in buf.getvalue() and "40.9%," in buf.getvalue()  # no number cut in two
    assert lines[-3:] == ["[error] rank 1: ValueError: bad", '  File "x.py", line 1, in f',
                          '    raise ValueError("bad")']  # lines that fit are kept as they are
    plain = io.StringIO()
    Display(plain, tty=False).message("x " * 60)
    assert plain.getvalue() == "x " * 60 + "\n"  # a log file gets the line whole


# ----------------------------------------------------------------------------- torchdeck launch


def _script_run(n=2, logged=False, t0=1000.0):
    """A script run's events as the supervisor and the shim write them: no epochs, no total steps;
    the step hook's events carry step and steps_per_s (loss null) and, with torchdeck.log, loss and
    samples/s."""
    evs = [events.make("run_started", strategy="script", run_kind="script", world_size=n, total_steps=None,
                       epochs=None, end_epoch=None, devices=["cpu"] * n,
                       command=["python", "train.py", "--lr", "0.1", "--data", "/very/long/path/" + "x" * 80]),
           *[events.make("rank_ready", rank=r, local_rank=r, device=None, pid=100 + r) for r in range(n)]]
    for r in range(n):
        evs.append(events.make("step", rank=r, step=120 + r, steps_per_s=3.4 + r, loss=None, samples_per_s=None))
        if logged:
            evs.append(events.make("step", rank=r, step=121 + r, steps_per_s=3.4 + r, loss=0.25 + r,
                                   samples_per_s=320.0))
    for e in evs:
        e["t"] = t0
    return evs


def test_a_script_runs_display_has_steps_and_steps_per_s_no_epochs_or_totals():
    """torchdeck launch / attach on a user's script: per rank its step and steps/s, the command in the
    header, no `ep 1 [????]` or `0/?` (the loop's columns mean nothing without epochs or a total)."""
    v = view_of(_script_run())
    for width in (100, 80, 40):
        lines = block(v, 1001.0, width)
        assert all(len(ln) < width for ln in lines), lines
        text = "\n".join(lines)
        assert "?" not in text and not re.search(r"\bep |/ ", text) and "[" not in text, text
    lines = block(v, 1001.0, 100)
    assert lines[0].startswith("RUNNING | script | world 2 | step 120 | 00:01 elapsed | 3.40 steps/s | "
                               "python train.py --lr 0.1 --"), lines[0]
    assert lines[0].endswith("…") and len(lines[0]) == 99  # the command, cut to the width
    assert lines[1] == "rank  0  step   120   3.40 steps/s"
    assert lines[2] == "rank  1  step   121   4.40 steps/s"


def test_a_script_that_calls_torchdeck_log_shows_loss_and_samples_per_s():
    v = view_of(_script_run(logged=True))
    lines = block(v, 1001.0, 100)
    assert lines[1] == "rank  0  step   121   3.40 steps/s  loss 0.2500  320 samples/s"
    assert "640 samples/s" in lines[0]
    v.feed(events.make("step", rank=0, step=140, steps_per_s=3.0, loss=None, samples_per_s=None, t=1002.0))
    assert block(v, 1002.0, 100)[1] == "rank  0  step   140   3.00 steps/s  loss 0.2500  320 samples/s"
    v.feed(events.make("step", rank=1, step=130, steps_per_s=2.0, loss=1.5, tokens_per_s=51200.0, t=1002.0))
    v.ranks[1].samples_per_s = 0.0  # a script that logs tokens only
    assert block(v, 1002.0, 100)[2] == "rank  1  step   130   2.00 steps/s  loss 1.5000  51,200 tokens/s"
    v.feed_all([events.make("rank_exited", rank=1, exitcode=7, signal=None, t=1003.0),
                events.make("rank_exited", rank=0, exitcode=-15, signal="SIGTERM", t=1003.0),
                events.make("run_finished", status="failed", exit_codes=[-15, 7], t=1003.0)])
    assert "| 51,200 tokens/s |" in block(v, 1003.0, 100)[0]  # not '0 samples/s': those ranks are over


def test_a_script_runs_summary_says_steps_per_rank_elapsed_and_exit_code():
    evs = _script_run()
    evs += [events.make("rank_exited", rank=1, exitcode=7, signal=None, t=1003.0),
            events.make("rank_exited", rank=0, exitcode=-15, signal="SIGTERM", t=1003.0),
            events.make("run_finished", status="failed", exit_codes=[-15, 7], failed_local_rank=1,
                        root_cause="rank 1 exited with code 7", elapsed_s=3.0, t=1003.0)]
    buf = io.StringIO()
    d = Display(buf, tty=False, interval=0, clock=lambda: 1003.0)
    v = view_of(evs)
    d.finish(v)
    out = buf.getvalue().splitlines()
    assert "?" not in "\n".join(out) and not re.search(r"\bep ", "\n".join(out)), out
    assert out[0] == "run started: python train.py --lr 0.1 --data /very/long/path/" + "x" * 80 + ", world size 2, " \
                     "devices cpu, cpu"
    assert "rank  1  step   121   4.40 steps/s  (exit 7)" in out
    assert out[-3:] == ["run failed after 00:03, exit code 7",
                        "steps done: rank 0 120 (signal SIGTERM), rank 1 121 (exit 7)",
                        "root cause: rank 1 exited with code 7"], out


def test_many_script_ranks_compact_to_steps_per_s_spread():
    v = view_of(_script_run(n=12))
    text = "\n".join(block(v, 1001.0, 100))
    assert "12 ranks  steps 120-131" in text and "steps/s per rank: min 3.40  median 8.90  max 14.4  slowest rank 0" \
        in text and "?" not in text, text


# ----------------------------------------------------------------------------- 256 ranks on 32 nodes (issue 31)


def _fleet_view(seconds=12, now_after=1.0):
    """bench.fake_run's recorded fleet: 32 nodes x 8 ranks, node 17 at 80 % of the pace with its GPUs
    at ~60 %, rank 203 at 55 %, ranks 44/45/130 waiting for data, node 5's GPU 3 at 84 °C."""
    from bench import fake_run

    t0 = 1_750_000_000.0
    evs = fake_run.fleet_events("fleet", 32, 8, t0, seconds)
    return view_of(evs), max(e["t"] for e in evs) + now_after


def test_256_ranks_on_32_nodes_fit_80_columns_with_the_slowest_the_waiting_and_every_gpu():
    """A 256-rank run printed a line per question, not per rank: the median rank as the reference,
    the slowest (rank 203, then node 17's), the ranks that wait most for data, the slowest node, and
    every GPU in two lines (the straggler node's idle GPUs named); the nodes worth a look, a line each;
    no `devices cpu, cpu, ...`."""
    v, now = _fleet_view()
    for width in (80, 140):
        lines = block(v, now, width)
        assert all(len(ln) < width for ln in lines), [ln for ln in lines if len(ln) >= width]
        assert len(lines) <= 20, lines  # a screenful at 24 rows, with room for log lines above
        text = "\n".join(lines)
        assert "256 ranks on 32 nodes" in text
        rows = [ln.split() for ln in lines if ln.startswith("  ") and " rank " in ln]
        kinds = [(r[0] if r[0] != "data" else "wait", int(r[r.index("rank") + 1])) for r in rows]
        assert kinds[0][0] == "median" and kinds[1] == ("slowest", 203), kinds
        assert {r for k, r in kinds if k == "slowest"} <= {203} | set(range(136, 144))
        assert [r for k, r in kinds if k == "wait"] == [44, 45, 130], kinds
        assert "nodes to look at (4 of 32):" in text and "node 17 (gpu-node-17, ranks 136-143): slow 20%, idle GPUs" in text
        assert "node 5 (gpu-node-05, ranks 40-47): data wait 32%, hot GPU 3 84°C" in text
        assert "GPUs: 256 on 32 nodes" in text and "hottest node 5 GPU 3 84°C" in text
        assert "GPU imbalance: util" in text and "node 17 GPU" in text
    out = io.StringIO()
    d = Display(out, tty=False, interval=0)
    d.finish(v)
    printed = out.getvalue()
    assert "cpu, cpu" not in printed and "devices cuda:0, cuda:1" in printed
    by_node = [ln for ln in printed.splitlines() if ln.startswith("  node ")]
    assert len(by_node) == 32 and "ranks 136-143" in by_node[17] and "512/512/512" in by_node[17]


def test_a_64_rank_node_says_its_devices_once():
    v = view_of([_started(64)])
    assert "devices ranks 0-63: cpu" in v.logs[0].text and "cpu, cpu" not in v.logs[0].text


def test_256_ranks_redraw_on_a_terminal_at_most_4_times_a_second():
    """A busy 256-rank run (an event per rank per tick) redraws its block at most 4 times a second."""
    import time

    v, now = _fleet_view(seconds=4)
    buf = io.StringIO()
    d = Display(buf, tty=True, width=80, clock=lambda: now)
    from bench import fake_run

    t0 = time.monotonic()
    k = 100
    while time.monotonic() - t0 < 1.2:  # events as fast as they come, a show after each batch
        for r in range(0, 256, 16):
            v.feed(fake_run.step_event(r, k, 256, 8, 32, t=now))
        d.show(v)
        k += 1
    took = time.monotonic() - t0
    assert 2 <= d.frames <= 1 + 4 * took + 1, (d.frames, took, k)  # the first at once, then 4/s at most
    assert "256 ranks on 32 nodes" in buf.getvalue()


def test_a_silent_node_of_32_comes_first_named_as_a_span_of_ranks():
    """Node 3's 8 ranks fall silent: the header names them as one span, their rows come first (4 of
    them, then how many more), and node 3 heads the nodes to look at."""
    from bench import fake_run

    t0 = 1_750_000_000.0
    evs = [e for e in fake_run.fleet_events("fleet", 32, 8, t0, 40)
           if not (e.get("kind") == "step" and 24 <= e["rank"] < 32 and e["t"] > t0 + 10)]
    v = view_of(evs)
    now = max(e["t"] for e in evs) + 1
    lines = block(v, now, 100)
    text = "\n".join(lines)
    assert "STALLED: ranks 24-31 silent" in lines[0]
    rows = [ln.split() for ln in lines if ln.startswith("  ") and " rank " in ln]
    assert [(r[0], int(r[2])) for r in rows[:4]] == [("stale", 24), ("stale", 25), ("stale", 26), ("stale", 27)]
    assert "... and 4 more stale or exited ranks" in text
    assert "  node 3 (gpu-node-03, ranks 24-31): stale 8" in text


def test_two_nodes_of_two_ranks_list_every_rank_and_every_gpu():
    """A small run on two nodes keeps a line per rank (its device, node 1's as `node 1` where it has
    none) and adds the GPUs of both nodes in two lines."""
    from bench import fake_run

    v = view_of(fake_run.fleet_events("two", 2, 2, 1_750_000_000.0, 6))
    lines = block(v, 1_750_000_000.0 + 9, 120)
    assert sum(ln.startswith("rank ") and "holds the others back" not in ln for ln in lines) == 4
    assert any(ln.startswith("GPUs: 16 on 2 nodes") for ln in lines)
    assert any(ln.startswith("GPU imbalance: util") for ln in lines)


def test_rank_lines_say_the_unit_of_their_rate_at_80_columns():
    """At 80 columns a rank line said `1,000/s`: samples/s of what? It says samples/s (the fleet's
    picked ranks too)."""
    v = view_of([_started(4)] + [_step(r, 10 + r, 1000.0 + r) for r in range(4)])
    for width in (140, 80, 60):
        ranks = [ln for ln in block(v, v.last_t + 1, width) if ln.startswith("rank ")]
        assert len(ranks) == 4 and all(re.search(r"1,00\d samples/s", ln) for ln in ranks), ranks
    fleet, now = _fleet_view()
    picks = [ln for ln in block(fleet, now, 80) if re.match(r"  (median|slowest|data wait) ", ln)]
    assert picks and all(" samples/s" in ln for ln in picks), picks


def test_the_piped_status_line_of_a_script_run_is_short():
    """In a pipe a script run's status line repeated the whole command every 5 s (~500 characters
    for nanoGPT's); the command is said once, in `run started`."""
    v = view_of(_script_run())
    buf = io.StringIO()
    d = Display(buf, tty=False, interval=0, clock=lambda: 1001.0)
    d.show(v)
    (status,) = [ln for ln in buf.getvalue().splitlines() if ln.startswith("RUNNING")]
    assert status == "RUNNING | script | world 2 | step 120 | 00:01 elapsed | 3.40 steps/s", status
    assert buf.getvalue().count("/very/long/path/") == 1  # in `run started` only


def test_the_ranks_lines_print_above_the_live_block_colours_kept():
    v = view_of([_started(2)] + [_step(0, 5, 10.0), _step(1, 5, 10.0)])
    buf = io.StringIO()
    d = Display(buf, tty=True, width=80)
    d.show(v, force=True)
    d.output(["[default0]:plain", "[default1]:\x1b[31mred\x1b[0m text"])
    d.show(v, force=True)
    shown = screen_of(buf.getvalue(), 80)
    assert shown[-5:-3] == ["[default0]:plain", "[default1]:red text"], shown
    assert [ln[:7] for ln in shown[-3:]] == ["RUNNING", "rank  0", "rank  1"], shown
    assert "\x1b[31mred" in buf.getvalue()
