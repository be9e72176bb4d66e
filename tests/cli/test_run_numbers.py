"""The numbers a run's front ends print, asked one question each and compared: the best epoch
(`runs` and the Runs list vs the Monitor's replay), the rates and steps of the rank lines, the
metrics files (issue 35 bugs 6, 7, 12, 13)."""
import json
import pytest
import os
import subprocess
import sys
from pathlib import Path

from torchdeck.engine import config as cfgmod
from torchdeck.engine import events
from torchdeck.engine.runs import catalog, metric
from torchdeck.engine import fmt
from torchdeck.engine.rundir.layout import RunDir
from torchdeck.engine.runs.view import RunView

TORCHDECK = Path(sys.executable).with_name("torchdeck")
T0 = 1_700_000_000.0


def torchdeck(*args, cwd, timeout=120):
    cmd = [str(TORCHDECK)] if TORCHDECK.exists() else [sys.executable, "-m", "torchdeck.cli"]
    env = dict(os.environ, TORCHDECK_RUNS=str(Path(cwd) / "runs"), COLUMNS="200")
    return subprocess.run(cmd + list(args), cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def _ev(kind, t, **f):
    e = events.make(kind, **f)
    e["t"] = T0 + t
    return e


# the regression run of the issue: val loss falls to its minimum at epoch 20, then creeps up
VAL = [0.05 - 0.0018 * e for e in range(20)] + [0.0149 + 0.0003 * (e - 20) for e in range(20, 30)]
VAL[19] = 0.0147  # epoch 20: the true best, in the middle of the file
VAL[-1] = 0.0175


def regression_events(epochs=30, steps_per_epoch=20, world=2):
    evs = [_ev("run_started", 0, run="reg", strategy="ddp", world_size=world, nproc_per_node=world, node_rank=0,
               num_nodes=1, global_batch=64, devices=["cpu"] * world, total_steps=epochs * steps_per_epoch)]
    t, step = 1.0, 0
    for e in range(epochs):
        for _ in range(steps_per_epoch):
            step += 1
            t += 0.1
            for r in range(world):
                evs.append(_ev("step", t, rank=r, epoch=e, step=step, total_steps=epochs * steps_per_epoch,
                               loss=0.02, samples_per_s=320.0, data_wait_s=0.01, compute_s=0.09, lr=0.1,
                               accuracy=None))
        for r in range(world):  # every rank sends its epoch_end (the ranks agree on the figures)
            evs.append(_ev("epoch_end", t, rank=r, epoch=e, step=step, train_loss=0.02, train_acc=None,
                           val_loss=VAL[e], val_acc=None))
    evs.append(_ev("run_finished", t + 0.5, status="finished", exit_codes=[0] * world, root_cause=None,
                   elapsed_s=t + 0.5))
    return evs


def write_run(root, evs, name="reg", status="finished", **cfg):
    run = RunDir.create(cfgmod.from_dict({"name": name, **cfg}), Path(root))
    run.events_path.write_text("".join(events.dumps(e) + "\n" for e in evs))
    if status:
        run.status_path.write_text(json.dumps({"status": status, "exit_codes": [0], "root_cause": None}))
    return run


def test_runs_shows_the_best_epoch_the_monitor_shows_even_mid_file(tmp_path):
    """Bug 6: the catalog folded the head and tail only, so `runs` said (best 0.0149) where the
    Monitor's replay of the whole file says 0.0147 (epoch 20, in the middle)."""
    evs = regression_events()
    run = write_run(tmp_path / "runs", evs)
    assert run.events_path.stat().st_size > catalog.HEAD_BYTES + catalog.TAIL_BYTES + 100_000  # a middle
    whole = RunView.replay(events.read_all(run.events_path))
    name, value, best = whole.main()
    assert (name, metric.show(name, value), metric.show(name, best)) == ("val_loss", "0.0175", "0.0147")
    r = torchdeck("runs", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert f"0.0175 (best {metric.show(name, best)})" in r.stdout, r.stdout  # the same answer as the Monitor
    (row,) = catalog.collect(tmp_path / "runs")  # the Runs list's rows
    assert (row.main, row.main_value, row.main_best) == (name, value, best)


def test_the_runs_list_reads_a_growing_file_on_and_agrees_with_a_whole_replay(tmp_path):
    """The catalog's cache scans a live run's file on from where it stopped, never again from the
    start; after each growth its best is the whole replay's."""
    evs = regression_events()
    cut = len(evs) * 2 // 3
    run = write_run(tmp_path, evs[:cut], status=None)
    cache = {}
    catalog.collect(tmp_path, cache)
    scan = cache[run.name][2]
    upto = scan.upto
    with open(run.events_path, "a") as fh:
        fh.write(events.dumps(evs[cut])[:40])  # a line cut mid-write: read once whole, not now
    catalog.collect(tmp_path, cache)
    assert cache[run.name][2] is scan and scan.upto >= upto
    with open(run.events_path, "a") as fh:
        fh.write(events.dumps(evs[cut])[40:] + "\n" + "".join(events.dumps(e) + "\n" for e in evs[cut + 1:]))
    (row,) = catalog.collect(tmp_path, cache)
    whole = RunView.replay(events.read_all(run.events_path))
    assert (row.main, row.main_value, row.main_best) == whole.main()
    head, middle, tail = catalog.read_parts(run.events_path)  # a fresh scan from the start
    assert scan.events == middle  # each once, in order
    assert sum(e["kind"] == "epoch_end" for e in head + middle + tail) == 60


TINY = """\
name: tiny
strategy: cpu
model: {name: mlp, hidden: 16}
data: {dataset: synthetic, train_size: 64, val_size: 32, image_size: 8}
train: {batch_size: 16, epochs: 1, log_every_n_steps: 1}
"""


def test_compare_refuses_a_misspelt_target_metric_before_running(tmp_path):
    """Bug 7: `--target 'val_los<=5'` ran, exited 0 and said `not reached`."""
    (tmp_path / "tiny.yaml").write_text(TINY)
    r = torchdeck("compare", "tiny.yaml", "--strategies", "cpu", "--steps", "2", "--target", "val_los<=5",
                  cwd=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    err = r.stderr.strip()
    assert err.count("\n") == 0 and "unknown metric 'val_los' (did you mean val_loss?)" in err, err
    assert "known: val_acc, val_loss" in err, err
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())  # nothing started


def test_a_target_metric_is_known_a_near_miss_or_possibly_the_runs_own():
    import pytest

    from torchdeck.engine.errors import UsageError

    for ok in ("val_loss<=1", "val_acc>=0.9", "perplexity<=5", "train_loss<1"):
        metric.check_target_metric(metric.parse_target(ok))
    with pytest.raises(UsageError, match="unknown metric 'mae'; known"):
        metric.check_target_metric(metric.parse_target("mae<=0.1"))  # a built-in loss reports no mae
    metric.check_target_metric(metric.parse_target("mae<=0.1"), own=True)  # a loss callable's may
    with pytest.raises(UsageError, match="did you mean perplexity"):
        metric.check_target_metric(metric.parse_target("perplexty<=5"), own=True)  # a near miss, even then
    cfg = cfgmod.from_dict({"name": "x", "train": {"loss": "mypkg.losses:with_mae"}})
    assert metric.may_report_own(cfg) and not metric.may_report_own(cfgmod.from_dict({"name": "x"}))


# ----------------------------------------------------------------------------- bug 12: a script run's numbers

def script_events(status="stopped", signal="SIGTERM"):
    """Two ranks of a user's script: the step hook's first event, then torchdeck.log every 0.1 s at
    900 samples/s with 0-based steps (step=i), the last merged log event 1 step over 72 ms
    (441 samples/s), and the hook's count of optimizer steps (30) at exit."""
    evs = [_ev("run_started", 0, run="s", strategy="script", world_size=2, nproc_per_node=2, node_rank=0,
               num_nodes=1, global_batch=None, devices=["cpu", "cpu"], total_steps=None, run_kind="script",
               command=["python", "train.py"])]
    for r in (0, 1):
        evs.append(_ev("step", 1.0, rank=r, step=1, steps_per_s=None, epoch=None, loss=None))
    for i in range(1, 30):  # log(step=i) after optimizer step i + 1
        for r in (0, 1):
            extra = {} if i > 1 else {}
            evs.append(_ev("step", 1.0 + 0.1 * i, rank=r, step=i, epoch=None, loss=1.0 / i, metrics={"mae": 0.5 / i},
                           steps_per_s=10.0, samples_per_s=None if i == 1 else 900.0 * (1 + 0.1 * r),
                           tokens_per_s=None, **extra))
    for r in (0, 1):  # the merged last call: a few ms
        evs.append(_ev("step", 1.0 + 2.9 + 0.072, rank=r, step=29, epoch=None, loss=0.03, metrics={"mae": 0.01},
                       steps_per_s=10.0, samples_per_s=441.0, tokens_per_s=None))
        evs.append(_ev("step", 4.0, rank=r, step=30, steps_per_s=10.0, epoch=None, loss=None))  # the hook's flush
    for r in (0, 1):
        evs.append(_ev("rank_exited", 4.5, rank=r, exitcode=-15, signal=signal))
    evs.append(_ev("run_finished", 4.6, status=status, exit_codes=[-15, -15], root_cause=None, elapsed_s=4.6))
    return evs


def test_a_finished_script_runs_rank_rate_is_its_mean_not_its_last_merged_event():
    view = RunView.replay(script_events())
    r0, r1 = view.rank_list()
    # windows of 0.1 s at 900 (28 of them) and one of 72 ms at 441: samples / time
    mean0 = (900.0 * 0.1 * 28 + 441.0 * 0.072) / (0.1 * 28 + 0.072)
    assert r0.samples_per_s == pytest.approx(mean0) and r0.samples_per_s > 880, r0.samples_per_s
    assert r1.samples_per_s > 960  # rank 1 logged 990/s
    assert view.rate_text() == f"mean {fmt.rate(r0.samples_per_s + r1.samples_per_s)} samples/s"


def test_without_torchdeck_log_the_final_pace_is_the_mean_steps_per_s_not_the_last_window():
    evs = [_ev("run_started", 0, run="s", strategy="script", world_size=1, nproc_per_node=1, node_rank=0, num_nodes=1,
               global_batch=None, devices=["cpu"], total_steps=None, run_kind="script", command=["python", "t.py"])]
    evs += [_ev("step", 1.0, rank=0, step=1, steps_per_s=None, epoch=None, loss=None),
            _ev("step", 2.0, rank=0, step=10, steps_per_s=9.0, epoch=None, loss=None),
            _ev("step", 3.0, rank=0, step=31, steps_per_s=21.0, epoch=None, loss=None),  # the last instant
            _ev("run_finished", 3.1, status="finished", exit_codes=[0], root_cause=None, elapsed_s=3.1)]
    (r,) = RunView.replay(evs).rank_list()
    assert r.steps_per_s == pytest.approx(15.0)  # (31 - 1) steps over 2 s


def test_a_ranks_step_is_the_highest_it_reported_whatever_the_order():
    """The hook counts optimizer steps from 1, a script's torchdeck.log(step=i) from 0: the rank
    that did 30 steps shows 30 (it showed 29), and the events read in another order say the same."""
    evs = script_events()
    view = RunView.replay(evs)
    assert [r.step for r in view.rank_list()] == [30, 30] and view.progress()[0] == 30
    shuffled = RunView.replay(sorted(evs, key=lambda e: (-e["step"] if e["kind"] == "step" else 0)))
    assert [r.step for r in shuffled.rank_list()] == [30, 30]


def test_a_stop_ending_a_scripts_ranks_leaves_their_pace_in_the_balance():
    """'rank balance: 0 of 2 ranks timing their optimizer steps' on a stopped script run: the
    stop's SIGTERM is not a failure of the rank; a crash's signal is."""
    from torchdeck.app.monitor.panes import script_spread_text

    view = RunView.replay(script_events("stopped", "SIGTERM"))
    assert not any(view.ended_badly(r) for r in view.rank_list())
    assert script_spread_text(view).plain.startswith("rank balance: slowest rank"), script_spread_text(view).plain
    failed = RunView.replay(script_events("failed", "SIGSEGV"))
    assert all(failed.ended_badly(r) for r in failed.rank_list())


def test_the_extra_metrics_say_whose_last_value_they_are():
    view = RunView.replay(script_events())
    assert view.metrics_text() == "rank 0 last: mae 0.01"


def test_attach_and_the_monitor_show_the_same_steps_and_rates_of_a_script_run(tmp_path):
    """One question, one answer: the CLI (`attach`, a real subprocess) and the Monitor's Ranks pane
    (its Follower and row text) read the same run directory and say the same step and rate."""
    import re

    from torchdeck.app.monitor.panes import script_rank_text
    from torchdeck.engine.runs.follow import Follower

    run = write_run(tmp_path / "runs", script_events(), name="s", status="stopped", strategy="script",
                    script={"path": "train.py"})
    r = torchdeck("attach", run.name, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    cli = {int(m[0]): (int(m[1]), m[2]) for m in re.findall(r"rank +(\d+) +step +(\d+) .*?([\d,]+) samples/s",
                                                            r.stdout)}
    follower = Follower(run)
    while follower.poll(force=True):
        pass
    view = follower.view
    app = {}
    for st in view.rank_list():
        cells = script_rank_text(view, st, T0 + 10, 80).plain.split()
        app[st.rank] = (int(cells[1].replace(",", "")), cells[4])
    assert cli == app == {0: (30, app[0][1]), 1: (30, app[1][1])}, (cli, app, r.stdout)
    assert app[0][1] == fmt.rate(view.ranks[0].samples_per_s) and int(app[0][1].replace(",", "")) > 880


# ----------------------------------------------------------------------------- bug 13: blame and files

def test_a_bad_loss_callable_from_set_is_blamed_on_set_not_the_preset(tmp_path):
    (tmp_path / "reg.py").write_text("def fn(out, batch):\n    return out.sum()\n")
    for cmd in ("validate", "run"):
        r = torchdeck(cmd, "quickstart", "--set", "train.loss=reg:nosuchfn", cwd=tmp_path)
        assert r.returncode == 2, r.stdout + r.stderr
        assert r.stderr.strip() == "--set: train.loss: reg (%s) defines no 'nosuchfn'; it defines fn" % (
            tmp_path / "reg.py"), r.stderr
    (tmp_path / "mine.yaml").write_text("name: mine\ntrain: {loss: 'reg:nosuchfn'}\n")
    r = torchdeck("validate", "mine.yaml", cwd=tmp_path)  # the preset's own value: the preset's to answer for
    assert r.returncode == 2 and r.stderr.startswith("mine.yaml: train.loss: reg"), r.stderr


def test_metrics_csv_dash_is_stdout_and_an_epoch_is_one_row(tmp_path):
    """`--csv -` wrote a file named '-'; every rank's copy of an epoch end was a row of its own."""
    import csv
    import io

    run = write_run(tmp_path / "runs", regression_events(epochs=3, steps_per_epoch=2))
    r = torchdeck("metrics", run.name, "--csv", "-", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert not (tmp_path / "-").exists()
    rows = list(csv.DictReader(io.StringIO(r.stdout)))
    epochs = [(row["epoch"], row["rank"], row["val_loss"]) for row in rows if row["kind"] == "epoch_end"]
    assert [(e, k) for e, k, _ in epochs] == [("1", "0"), ("2", "0"), ("3", "0")], epochs
    assert len([row for row in rows if row["kind"] == "step"]) == 3 * 2 * 2  # every rank's steps stay
    assert "metric rows written to stdout" in r.stderr and r.stdout.startswith("t,kind,rank")
    r = torchdeck("metrics", run.name, "--csv", "m.csv", cwd=tmp_path)
    assert r.returncode == 0 and (tmp_path / "m.csv").read_text() == (
        "".join(io.StringIO(torchdeck("metrics", run.name, "--csv", "-", cwd=tmp_path).stdout)))


def test_a_finished_script_runs_pace_is_its_mean_in_attach_and_the_monitor_header(tmp_path):
    """Without torchdeck.log the pace is the step hook's: once over, the CLI said the last window's
    steps/s and the Monitor '- steps/s'; both say the mean now."""
    from torchdeck.app.monitor.panes import header_text
    from torchdeck.engine.runs.follow import Follower

    evs = [_ev("run_started", 0, run="s", strategy="script", world_size=2, nproc_per_node=2, node_rank=0,
               num_nodes=1, global_batch=None, devices=["cpu", "cpu"], total_steps=None, run_kind="script",
               command=["python", "t.py"])]
    for r in (0, 1):
        evs += [_ev("step", 1.0, rank=r, step=1, steps_per_s=None, epoch=None, loss=None),
                _ev("step", 2.0, rank=r, step=10, steps_per_s=9.0, epoch=None, loss=None),
                _ev("step", 3.0, rank=r, step=31, steps_per_s=21.0, epoch=None, loss=None)]
    evs.append(_ev("run_finished", 3.1, status="finished", exit_codes=[0, 0], root_cause=None, elapsed_s=3.1))
    run = write_run(tmp_path / "runs", evs, name="s", strategy="script", script={"path": "t.py"})
    r = torchdeck("attach", run.name, cwd=tmp_path)
    assert r.returncode == 0 and "| mean 15.0 steps/s" in r.stdout, r.stdout + r.stderr
    follower = Follower(run)
    while follower.poll(force=True):
        pass
    assert "mean 15.0 steps/s" in header_text(follower.view, T0 + 10, run.name, 140).plain
