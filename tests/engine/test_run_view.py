"""The reducer of a run's events (engine.runs.view): hand-made event streams in, what the CLI and
the Monitor show out."""
from __future__ import annotations

import pytest

from torchdeck.engine.runs.view import STEP_HISTORY, RunView
from tests.run_events import T0, ev, started, step

# ----------------------------------------------------------------------------- the reducer


def test_ranks_throughput_and_eta_from_steps():
    st = RunView()
    st.feed_all([started(total=101)]
                + [ev("rank_ready", 0.5, rank=r, local_rank=r, device="cpu", pid=4001 + r, host="box", threads=1)
                   for r in range(2)])
    # rank 0 at 2 steps/s, rank 1 (the slow one) at 1 step/s, from t=10
    st.feed_all([step(0, 1 + 2 * i, 10 + i, sps=200.0, total=101) for i in range(11)])
    st.feed_all([step(1, 1 + i, 10 + i, sps=100.0, wait=0.03, comp=0.07, total=101) for i in range(11)])
    assert st.status == "running"
    r0, r1 = st.rank_list()
    assert (r0.step, r1.step) == (21, 11)
    assert r1.data_wait == pytest.approx(0.3)
    assert st.global_samples_per_s() == 300.0
    # the slowest rank did 10 steps in 10 s and has 90 to go
    assert st.eta(T0 + 20) == pytest.approx(90.0)
    slow, fast = st.rank_spread()
    assert (slow.rank, fast.rank) == (1, 0)
    assert st.rank_pids() == {4000: None, 4001: 0, 4002: 1}
    assert st.elapsed(T0 + 20) == 20.0
    assert st.rate_text(T0 + 20) == "300 samples/s"
    st.feed(ev("run_finished", 25, status="finished", exit_codes=[0, 0], root_cause=None, elapsed_s=25.0))
    assert st.final and st.eta(T0 + 30) is None and st.elapsed(T0 + 99) == 25.0
    assert st.rate_text(T0 + 30) == "mean 300 samples/s"  # not the 0 of a run with no rank stepping


def test_a_finished_runs_rate_is_its_mean_over_the_step_windows():
    """A rank's mean rate is its samples over its windows' time: windows of 30 samples at 100
    then 300 samples/s (0.3 s and 0.1 s, as the loop's wait + compute say) is 60 / 0.4 = 150."""
    st = RunView()
    st.feed(started(total=4))
    st.feed_all([step(0, 1, 1, sps=100.0, total=4, wait=0.03, comp=0.27),
                 step(0, 2, 2, sps=300.0, total=4, wait=0.01, comp=0.09),
                 step(1, 1, 1, sps=200.0, total=4, wait=0.05, comp=0.1),
                 step(1, 2, 2, sps=200.0, total=4, wait=0.05, comp=0.1)])
    assert st.rate_text(T0 + 2) == "500 samples/s"  # the latest: 300 + 200
    st.feed(ev("run_finished", 3, status="finished", exit_codes=[0, 0], root_cause=None, elapsed_s=3.0))
    assert st.mean_samples_per_s() == pytest.approx(350.0)
    assert st.rate_text(T0 + 4) == "mean 350 samples/s"


def test_stale_rank_is_flagged_only_while_running():
    st = RunView()
    st.feed(started())
    st.feed_all([step(r, i, i) for i in range(1, 21) for r in (0, 1)])  # both every 1 s until t=20
    st.feed_all([step(0, i, i) for i in range(21, 41)])  # rank 1 falls silent at t=20
    r0, r1 = st.rank_list()
    now = T0 + 40.5
    assert not st.is_stale(r0, now)
    assert st.is_stale(r1, now)  # 20 s of silence > max(10 s, 5 x 1 s)
    assert not st.is_stale(r1, T0 + 29)  # 9 s: not yet
    st.feed(ev("run_finished", 41, status="stopped", exit_codes=[0, 0], root_cause=None, elapsed_s=41))
    assert not st.is_stale(r1, T0 + 100)  # a run that is over has no stale ranks


def test_a_rank_still_starting_when_another_steps_is_not_silent_until_the_rule_says_so():
    """A script's rank says rank_ready before it imports torch (13 s on a busy host), then nothing
    until its first step: when another rank steps first, its start-up is not silence (seen:
    'STALLED: rank 1 silent' for one second before rank 1's first step)."""
    st = RunView()
    st.feed(started())
    st.feed_all([ev("rank_ready", 0.0, rank=r, local_rank=r, device="cpu", pid=100 + r, host="box", threads=1,
                    cpus=None) for r in (0, 1)])
    st.feed(step(0, 1, 13.0))
    r1 = st.rank_list()[1]
    assert not st.is_stale(r1, T0 + 13.5)
    assert not st.is_stale(r1, T0 + 22.9)  # 9.9 s after the run began stepping
    assert st.is_stale(r1, T0 + 23.5)  # then the rule holds as for any rank


def test_stale_threshold_follows_a_slow_log_interval():
    st = RunView()
    st.feed(started())
    st.feed_all([step(0, i, 8 * i) for i in range(1, 6)])  # one event every 8 s
    (r0,) = st.rank_list()
    assert st.stale_after(r0) == pytest.approx(40.0)
    assert not st.is_stale(r0, T0 + 40 + 30)
    assert st.is_stale(r0, T0 + 40 + 41)


def test_a_step_window_far_over_its_median_is_slow_but_not_an_evaluation_or_a_save():
    """The watchdog's second trigger: a window of steps in progress over SLOW_MULTIPLE x the rank's
    median window (and SLOW_MIN_S), long before the rank is stale; a pause the rank announced in
    its step event (evaluation, a checkpoint) is not timed."""
    st = RunView()
    st.feed(started())
    st.feed_all([step(r, i, 0.1 * i) for i in range(1, 11) for r in (0, 1)])  # windows of 0.1 s
    r0, r1 = st.rank_list()
    assert st.median_window(r1) == pytest.approx(0.1)
    assert st.slow_ranks(T0 + 1.0 + 1.9) == []  # under SLOW_MIN_S
    assert [(r.rank, round(took, 1)) for r, took, _ in st.slow_ranks(T0 + 1.0 + 2.5)] == [(0, 2.5), (1, 2.5)]
    assert not st.is_stale(r1, T0 + 3.5)  # the stale rule would wait 10 s
    st.feed(step(0, 11, 1.1))
    assert [r.rank for r, _, _ in st.slow_ranks(T0 + 3.05)] == [1]  # rank 0 was heard from at 1.1
    # rank 1 announces an evaluation: its silence is not a slow step, and the window after it
    # does not count towards the median
    st.feed(ev("step", 1.1, rank=1, epoch=0, step=11, total_steps=100, loss=1.0, accuracy=0.5,
               samples_per_s=100.0, data_wait_s=0.01, compute_s=0.09, lr=0.1, pause=True))
    assert st.slow_ranks(T0 + 3.05) == []
    st.feed(step(1, 12, 9.0))
    assert st.median_window(r1) == pytest.approx(0.1) and max(r1._windows) < 1
    assert st.slow_ranks(T0 + 9.5) == [(r0, pytest.approx(8.4), pytest.approx(0.1))]
    # too few windows: no median, no verdict (the first windows include warm-up)
    fresh = RunView()
    fresh.feed(started())
    fresh.feed_all([step(0, i, 0.1 * i) for i in range(1, 5)])
    assert fresh.slow_ranks(T0 + 60) == []
    st.feed(ev("run_finished", 10, status="finished", exit_codes=[0, 0], root_cause=None, elapsed_s=10))
    assert st.slow_ranks(T0 + 60) == []


def test_errors_keep_rank_host_and_traceback():
    tb = 'Traceback (most recent call last):\n  File "model.py", line 3, in build\nRuntimeError: boom\n'
    st = RunView()
    st.feed_all([started(), step(0, 1, 1), step(1, 1, 1),
                 ev("error", 2, rank=1, host="gpu-node-7", pid=4002, exception="RuntimeError", message="boom",
                    traceback=tb),
                 ev("rank_exited", 3, rank=1, exitcode=1, signal=None),
                 ev("rank_exited", 3, rank=0, exitcode=-9, signal="SIGKILL"),
                 ev("run_finished", 4, status="failed", exit_codes=[-9, 1], root_cause="rank 1 raised RuntimeError: boom",
                    elapsed_s=4.0)])
    (err,) = st.errors
    assert err.rank == 1 and "gpu-node-7" in err.text and "RuntimeError: boom" in err.text
    assert err.detail.endswith("RuntimeError: boom") and 'File "model.py"' in err.detail
    assert st.status == "failed" and st.root_cause == "rank 1 raised RuntimeError: boom"
    assert st.ranks[1].exited == "exit 1" and st.ranks[0].exited == "signal SIGKILL"
    assert [ln.level for ln in st.logs][-1] == "error"


def test_rank_report_updates_ranks_of_other_nodes_only():
    st = RunView()
    st.feed_all([started(world=4, total=50),
                 ev("rank_ready", 0, rank=0, local_rank=0, device="cuda:0", pid=4001, host="box", threads=1),
                 step(0, 10, 5, sps=500.0)])
    st.feed(ev("rank_report", 6, reports=[
        {"rank": 0, "host": "box", "node_rank": 0, "epoch": 0, "step": 3, "samples_per_s": 1.0, "data_wait": 0.5,
         "device_mem_mb": 1234.0, "t": T0 + 6},
        {"rank": 2, "host": "node-b", "node_rank": 1, "epoch": 0, "step": 9, "samples_per_s": 480.0,
         "data_wait": 0.25, "device_mem_mb": 2000.0, "t": T0 + 5.5},
        {"rank": 3, "host": "node-b", "node_rank": 1, "epoch": 0, "step": 7, "samples_per_s": 300.0,
         "data_wait": 0.6, "device_mem_mb": 2100.0, "t": T0 + 5.5, "peak_mem_mb": 2500.0},
    ]))
    r0 = st.ranks[0]
    assert (r0.step, r0.samples_per_s, r0.device_mem_mb) == (10, 500.0, 1234.0)  # own events win; memory taken
    r2, r3 = st.ranks[2], st.ranks[3]
    assert (r2.host, r2.node_rank, r2.step, r2.samples_per_s, r2.data_wait) == ("node-b", 1, 9, 480.0, 0.25)
    assert r3.from_report and r3.last_seen == T0 + 5.5 and r3.total_steps == 50
    assert st.rank_spread()[0].rank == 3  # the straggler on the other node is the slowest
    assert 2 not in st.rank_pids().values()  # no local pid for remote ranks
    st.feed(ev("rank_report", 7, reports=[{"rank": 3, "step": 8, "device_mem_mb": 1900.0, "peak_mem_mb": 2400.0,
                                           "t": T0 + 6.5}]))
    assert (st.ranks[3].device_mem_mb, st.ranks[3].peak_mem_mb) == (1900.0, 2500.0)  # the peak never goes down


def test_unknown_and_malformed_events_are_skipped():
    st = RunView()
    st.feed(started())
    v = st.version
    assert st.feed({"v": 9, "kind": "telemetry_from_the_future", "t": T0 + 1, "rank": 0, "x": [1, 2]}) is False
    assert st.feed({"kind": "step", "t": T0 + 1, "rank": "zero?", "step": {"not": "a number"}}) is False
    assert st.feed(["not", "a", "dict"]) is False
    assert st.version == v and st.ranks == {}
    assert st.feed(step(0, 1, 2)) is True and st.ranks[0].step == 1


def test_step_curve_stays_bounded_and_keeps_the_whole_run():
    st = RunView()
    st.feed(started(total=10_000))
    n = 5 * STEP_HISTORY
    st.feed_all([step(0, i, i * 0.01, loss=1.0 / i) for i in range(1, n + 1)])
    pts = st.steps.points
    assert STEP_HISTORY // 2 <= len(pts) <= STEP_HISTORY
    assert pts[0][0] == 1 and pts[-1][0] == n  # first and newest step both kept
    assert [x for x, _ in pts] == sorted(x for x, _ in pts)


def test_epoch_history_prefers_rank_0_and_snapshot_is_independent():
    st = RunView()
    st.feed(started())
    st.feed(ev("epoch_end", 5, rank=1, epoch=0, step=10, train_loss=0.9, train_acc=0.7, val_loss=0.8, val_acc=0.75))
    st.feed(ev("epoch_end", 5, rank=0, epoch=0, step=10, train_loss=1.0, train_acc=0.6, val_loss=0.85, val_acc=0.7))
    assert st.epochs[1].train_loss == 1.0  # epochs count from 1 for people
    snap = st.snapshot()
    st.feed(step(0, 11, 6))
    assert 0 not in snap.ranks or snap.ranks[0].step != 11
    assert sum("epoch 1 done" in ln.text for ln in st.logs) == 1  # once, not once per rank


def test_a_failing_ranks_traceback_is_shown_once_not_again_from_its_log():
    st = RunView()
    tb = 'Traceback (most recent call last):\n  File "m.py", line 2, in build\n    raise RuntimeError("boom")\nRuntimeError: boom'
    st.feed_all([started(), ev("error", 2, rank=0, host="box", pid=7, exception="RuntimeError", message="boom",
                                traceback=tb)])
    for line in tb.splitlines() + ["rank 0 printed this itself"]:
        st.add_output(0, line)
    st.add_output(1, "RuntimeError: boom")  # another rank's output is its own
    out = [(ln.rank, ln.text) for ln in st.logs if ln.level == "output"]
    assert out == [(0, "rank 0 printed this itself"), (1, "RuntimeError: boom")]
    assert st.errors[0].detail == tb


def test_observed_lost_supervisor_marks_lost_once_and_keeps_the_first_cause():
    st = RunView()
    st.feed_all([started(), step(0, 1, 3)])
    st.observe(None, alive=False, has_pid=True, quiet_s=500.0, now=T0 + 600)
    assert st.status == "lost" and st.final and st.finished_t == T0 + 3
    cause = st.root_cause
    assert "supervisor exited without a final status" in cause
    st.observe(None, alive=False, has_pid=True, quiet_s=900.0, now=T0 + 900)
    assert st.root_cause == cause and sum(ln.text.startswith("run lost") for ln in st.logs) == 1


def test_status_json_ends_a_run_whose_events_did_not_but_an_event_has_the_last_word():
    st = RunView()
    st.feed_all([started(), step(0, 1, 3)])
    st.observe({"status": "stopped", "root_cause": None}, alive=False, has_pid=False, quiet_s=3.0, now=T0 + 12)
    assert st.status == "stopped"
    st.feed(ev("run_finished", 13, status="failed", exit_codes=[], root_cause="x", elapsed_s=13))
    assert st.status == "failed" and st.root_cause == "x"
    st.observe({"status": "finished"}, alive=False, has_pid=False, quiet_s=3.0, now=T0 + 14)
    assert st.status == "failed"


def test_starting_until_the_first_step_and_young_dirs_without_pid_are_starting():
    st = RunView()
    st.observe(None, alive=False, has_pid=False, quiet_s=5.0, now=T0 + 5)
    assert st.status == "starting"
    st.feed(started())
    st.observe(None, alive=True, has_pid=True, quiet_s=0.1, now=T0 + 6)
    assert st.status == "starting"
    st.feed(step(0, 1, 7))
    assert st.status == "running"
    old = RunView()
    old.observe(None, alive=False, has_pid=False, quiet_s=3600.0, now=T0 + 3600)
    assert old.status == "lost" and "never started" in old.root_cause


def test_a_stale_rank_stops_the_eta_and_the_rate():
    st = RunView()
    st.feed(started())
    st.feed_all([step(r, i, i) for i in range(1, 21) for r in (0, 1)])
    assert st.eta(T0 + 20.2) is not None and st.global_samples_per_s(T0 + 20.2) == 200.0
    st.feed_all([step(0, i, i) for i in range(21, 41)])
    assert st.eta(T0 + 41) is None and st.global_samples_per_s(T0 + 41) == 0.0  # rank 1 silent 21 s
    assert [r.rank for r in st.stale_ranks(T0 + 41)] == [1]


def test_logs_stay_in_time_order_whatever_order_they_arrive_in():
    st = RunView()
    st.feed_all([started(t=1.0), step(0, 1, 2), ev("run_finished", 9, status="finished", exit_codes=[0],
                                                   root_cause=None, elapsed_s=8.0)])
    rewrites = st.log_rewrites
    st.add_output(None, "supervisor said this at the start", T0 + 0.5)
    assert [ln.text for ln in st.logs][0] == "supervisor said this at the start"
    assert st.logs[-1].text.startswith("run finished") and st.log_rewrites == rewrites + 1


def test_start_up_phases_are_shown_while_starting_and_summed_at_the_first_step():
    st = RunView()
    assert st.startup(T0) == "starting the supervisor"
    st.feed(started(t=1.0))
    assert st.startup(T0 + 3) == "ranks importing torch (2 s)"
    st.feed_all([ev("phase", 4, rank=r, phase="rendezvous") for r in (0, 1)])
    st.feed(ev("phase", 5, rank=0, phase="data"))
    assert st.startup(T0 + 6) == "meeting the other ranks (1/2 ranks, 2 s)"  # the rank behind says
    st.feed(ev("phase", 5.5, rank=1, phase="data"))
    st.feed_all([ev("phase", 8, rank=r, phase="model") for r in (0, 1)])
    assert st.startup(T0 + 8.5) == "building the model (2/2 ranks, 0 s)"
    st.feed_all([ev("phase", 8.5, rank=r, phase="batch") for r in (0, 1)])
    st.feed(ev("phase", 11, rank=0, phase="steps"))
    assert st.startup(T0 + 11.5) == "waiting for the first batch (1/2 ranks, 3 s)"  # loader workers starting
    st.feed(ev("phase", 11.5, rank=1, phase="steps"))
    assert st.startup(T0 + 12) == "taking the first steps (2/2 ranks, 1 s)"
    st.feed(step(0, 10, 13))
    assert st.startup(T0 + 13) is None and st.status == "running"
    assert st.startup_breakdown() == [("torch import", 3.0), ("rendezvous", 1.0), ("data", 3.0), ("model", 0.5),
                                      ("first batch", 2.5), ("steps 1-10", 2.0)]
    assert any(ln.text == "first steps (1-10) done 12.0 s after the supervisor started: torch import 3.0 s, "
                          "rendezvous 1.0 s, data 3.0 s, model 0.5 s, first batch 2.5 s, steps 1-10 2.0 s"
               for ln in st.logs)
    assert st.feed(ev("phase", 10, rank=0, phase="dancing")) is False  # unknown phase: skipped


def test_a_rank_bound_to_cores_is_placed_as_device_at_cores_in_both_front_ends():
    """rank_ready's cpus (train.cpu_affinity) shows next to the device: `cpu@1` in the CLI's rank
    line and the Monitor's rank table, both through RankState.place."""
    from rich.console import Console

    from torchdeck.app.monitor.panes import rank_text
    from torchdeck.cli.progress import rank_line

    st = RunView()
    st.feed_all([started(total=10),
                 ev("rank_ready", 0.5, rank=0, local_rank=0, device="cpu", pid=4001, host="box", threads=1, cpus="0"),
                 ev("rank_ready", 0.5, rank=1, local_rank=1, device="cpu", pid=4002, host="box", threads=2,
                    cpus=None)])
    r0, r1 = st.rank_list()
    assert (r0.place, r1.place) == ("cpu@0", "cpu")
    assert "cpu@0" in rank_line(st, r0, T0 + 1, 80) and "cpu@" not in rank_line(st, r1, T0 + 1, 80)
    assert "cpu@0" in rank_text(st, r0, T0 + 1, 140).plain  # at 80 columns the table leaves devices out


def test_a_stopped_runs_step_is_where_it_stopped_not_its_last_step_event(tmp_path):
    """Issue 27: stopped between two step events (log_every_n_steps 4, stopped at step 1), the log
    and the checkpoint said step 1 while every view said the last step event's 0. The ranks send
    their final position; the reducer (and so the catalog, `torchdeck runs`, the Monitor) uses it."""
    import json

    from torchdeck.engine import config as cfgmod
    from torchdeck.engine import events
    from torchdeck.engine.runs.catalog import summarize
    from torchdeck.engine.rundir.layout import RunDir
    from torchdeck.engine.worker import RankJob, train_rank
    from tests.engine.helpers import small_cfg

    out: list[dict] = []
    cfg = cfgmod.from_dict(small_cfg(**{"train.max_steps": 12, "train.log_every_n_steps": 4}))
    stopped = train_rank(RankJob(cfg, tmp_path, 0, 0, 1), lambda kind, **f: out.append(events.make(kind, rank=0, **f)),
                         stop_requested=lambda: True)  # the stop file is there from the first check
    assert stopped
    said = [e["message"] for e in out if e["kind"] == "log" and "stopped on request" in e["message"]]
    saved = [e["step"] for e in out if e["kind"] == "checkpoint"]
    assert said == ["stopped on request at epoch 1, step 1"] and saved == [1]
    view = RunView()
    view.feed_all(out)
    assert view.progress() == (1, 12), [e for e in out if e["kind"] == "step"]
    # the run directory as the Runs list and `torchdeck runs` read it
    cfgmod.save(cfg, tmp_path / "config.yaml")
    out.append(events.make("run_finished", status="stopped", exit_codes=[0], root_cause=None, elapsed_s=1.0))
    (tmp_path / "events.jsonl").write_text("".join(events.dumps(e) + "\n" for e in out))
    (tmp_path / "status.json").write_text(json.dumps({"status": "stopped", "exit_codes": [0], "elapsed_s": 1.0}))
    row = summarize(RunDir(tmp_path))
    assert (row.status, row.progress) == ("stopped", "1/12")


def test_a_resumed_run_shows_its_checkpoints_step_from_the_start(tmp_path):
    """Issue 27: a run resumed at step 750 showed `step 0/1500` until its first step event. The
    follower knows the checkpoint from origin.json (`torchdeck resume`, the app's R); a run resumed
    by checkpoint.resume says it in its ranks' "batch" phase event. Rank rows start in the epoch
    the header names (they said `ep 0` under `epoch 1`)."""
    import json

    from torchdeck.engine import events
    from torchdeck.engine.runs.follow import Follower
    from torchdeck.engine.rundir.layout import RunDir

    old, new = tmp_path / "old", tmp_path / "new"
    for d in (old, new):
        d.mkdir()
        (d / "config.yaml").write_text("name: x\n")
    write = lambda d, evs: (d / "events.jsonl").write_text("".join(events.dumps(e) + "\n" for e in evs))  # noqa: E731
    write(old, [started(total=750), step(0, 750, 5, total=750)])
    (new / "origin.json").write_text(json.dumps({"resumed_from": str(old),
                                                 "checkpoint": str(old / "checkpoints" / "ckpt-00000750.pt")}))
    write(new, [started(total=1500)] + [ev("rank_ready", 1, rank=r, local_rank=r, device="cpu", pid=9 + r,
                                           host="box", threads=1) for r in (0, 1)])
    f = Follower(RunDir(new), outputs=False)
    f.poll(force=True)
    assert f.view.progress() == (750, 1500)
    assert [r.step for r in f.view.rank_list()] == [750, 750]

    view = RunView()  # checkpoint.resume in the config: the ranks say where they train from
    view.feed_all([started(total=1500), ev("rank_ready", 1, rank=0, local_rank=0, device="cpu", pid=9, host="b",
                                           threads=1)])
    assert view.rank_list()[0].epoch == 1  # not 0, while the header says epoch 1
    view.feed(ev("phase", 2, rank=0, phase="batch", step=750, epoch=5))
    r0 = view.rank_list()[0]
    assert (view.progress(), r0.epoch, view.status) == ((750, 1500), 6, "starting")


def test_one_number_rule_for_the_monitor_and_compare():
    """fmt.real is the one parser (RunView, compare, the Monitor's panes): a number written as text
    counts, NaN and booleans do not. A diverged NaN loss shows as missing and is no curve point;
    compare's rate reads the same windows the Monitor does."""
    from torchdeck.engine import fmt

    assert [fmt.real(v) for v in (None, True, "0.5", "abc", float("nan"), 3, 2.5, [1])] == \
        [None, None, 0.5, None, None, 3.0, 2.5, None]
    v = RunView.replay([started(), step(0, 10, 1.0, loss=2.0), ev("step", 2.0, rank=0, epoch=0, step=20, loss=float("nan"),
                                                                    data_wait_s="0.1", compute_s=0.4),
                        step(0, 30, 3.0, loss="1.5", wait=0.1, comp=0.4)])
    st = v.ranks[0]
    assert st.loss == 1.5 and [y for _, y in v.steps.points] == [2.0, 1.5]
    assert (st.warmup_steps, st.timed_steps) == (10, 20) and st.timed_s == pytest.approx(1.0)


def test_only_this_nodes_ranks_give_pids_to_sample_here():
    """Node 0's file holds node 1's streamed rank_ready (pid 4003 on node-b): sampling pid 4003 on
    node 0 would show some other process's CPU and GPU use as that rank's."""
    st = RunView()
    st.feed_all([started(world=4),
                 ev("rank_ready", 0.5, rank=0, local_rank=0, device="cpu", pid=4001, host="box", threads=1),
                 ev("rank_ready", 0.5, rank=1, local_rank=1, device="cpu", pid=4002, host="box", threads=1),
                 ev("rank_ready", 0.6, rank=2, local_rank=0, device="cpu", pid=4003, host="node-b", threads=1,
                    node_rank=1),
                 ev("rank_ready", 0.6, rank=3, local_rank=1, device="cpu", pid=4002, host="node-b", threads=1,
                    node_rank=1)])
    assert st.rank_pids() == {4000: None, 4001: 0, 4002: 1}
