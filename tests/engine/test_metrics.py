"""metrics.csv beside events.jsonl, TensorBoard when installed (or one line saying it is not),
and `torchdeck metrics` rebuilding both from a past run."""
from __future__ import annotations

import csv

import pytest

from torchdeck.cli.main import main as cli_main
from torchdeck.engine import metrics
from torchdeck.engine.events import read_all
from torchdeck.engine.rundir.layout import RunDir
from tests.engine.helpers import run_supervised, small_cfg


def test_a_run_writes_metrics_csv_live_and_metrics_converts_it(tmp_path, capsys):
    run = tmp_path / "runs" / "m"
    cfg = small_cfg(strategy="ddp", devices=2, **{"train.eval_every_epoch": True, "train.max_steps": 0,
                                                  "train.epochs": 2, "data.train_size": 128,
                                                  "logging.tensorboard": True})
    proc = run_supervised(run, cfg)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rd = RunDir(run)
    evs = read_all(rd.events_path)
    # every rank's steps; an epoch end once (the ranks send the same reduced figures: rank 0's row)
    want = [e for e in evs if e["kind"] == "step" or e["kind"] == "epoch_end" and e.get("rank") in (0, None)]
    with open(rd.metrics_path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == len(want) > 4
    assert [r["epoch"] for r in rows if r["kind"] == "epoch_end"] == ["1", "2"]
    assert {r["rank"] for r in rows if r["kind"] == "step"} == {"0", "1"}
    for r, e in zip(rows, want):
        assert (r["kind"], int(r["rank"]), int(r["step"])) == (e["kind"], e["rank"], e["step"])
        key = "loss" if e["kind"] == "step" else "val_loss"
        assert float(r[key]) == e[key]
    notes = [e["message"] for e in evs if e["kind"] == "log" and "tensorboard" in e["message"]]
    if metrics.tensorboard_available():
        assert not notes and any(rd.tensorboard_dir.glob("events.out.tfevents.*"))
    else:  # Lightning's fallback: say so once, keep the CSV
        assert notes == [metrics.TB_MISSING]
        assert metrics.TB_MISSING in proc.stdout  # supervisor.log, when launched

    out = tmp_path / "again.csv"
    assert cli_main(["metrics", str(run), "--csv", str(out)]) == 0
    assert out.read_text() == rd.metrics_path.read_text()
    assert f"{len(want)} metric rows" in capsys.readouterr().out
    code = cli_main(["metrics", str(run), "--tensorboard", str(tmp_path / "tb")])
    if metrics.tensorboard_available():
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        acc = EventAccumulator(str(tmp_path / "tb"))
        acc.Reload()
        losses = [s.value for s in acc.Scalars("rank1/loss")]
        assert code == 0 and losses == pytest.approx([float(r["loss"]) for r in rows if r["kind"] == "step" and r["rank"] == "1"], rel=1e-6)  # float32
    else:
        assert code == 2 and "tensorboard package is not installed" in capsys.readouterr().err


def test_metrics_csv_counts_epochs_from_1_live_and_rebuilt(tmp_path, capsys):
    """Issue 27: an 8-epoch run's metrics.csv had epoch_end rows 0-7 (the events' 0-based index)
    while the README, the Monitor and the log count from 1. Both the supervisor's live sink and
    `torchdeck metrics` over a past run's events (written by the engine as it always did) say 1-2."""
    from torchdeck.engine import config as cfgmod
    from torchdeck.engine import events
    from tests.run_events import ev

    run = tmp_path / "old-run"
    run.mkdir()
    cfgmod.save(cfgmod.from_dict(small_cfg()), run / "config.yaml")
    evs = [ev("step", 1, rank=0, epoch=0, step=4, total_steps=8, loss=1.0),
           ev("epoch_end", 2, rank=0, epoch=0, step=4, train_loss=1.0, train_acc=0.5, val_loss=None, val_acc=None),
           ev("step", 3, rank=0, epoch=1, step=8, total_steps=8, loss=0.9),
           ev("epoch_end", 4, rank=0, epoch=1, step=8, train_loss=0.9, train_acc=0.6, val_loss=None, val_acc=None)]
    lines = [events.dumps(e) for e in evs]
    (run / "events.jsonl").write_text("".join(ln + "\n" for ln in lines))

    live = tmp_path / "live.csv"
    sink = metrics.MetricsSink(live)
    for ln in lines:
        sink.add_line(ln)  # what the supervisor's event writer does as the run goes
    sink.close()
    rebuilt = tmp_path / "rebuilt.csv"
    assert cli_main(["metrics", str(run), "--csv", str(rebuilt)]) == 0
    for path in (live, rebuilt):
        with open(path, newline="") as fh:
            rows = list(csv.DictReader(fh))
        assert [(r["kind"], r["epoch"]) for r in rows] == [("step", "1"), ("epoch_end", "1"),
                                                           ("step", "2"), ("epoch_end", "2")], path
