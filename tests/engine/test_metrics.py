"""metrics.csv beside events.jsonl, TensorBoard when installed (or one line saying it is not),
and `torchdeck metrics` rebuilding both from a past run. TensorBoard is in the test extra: its
files are read back by TensorBoard's own reader, and 'not installed' is the interpreter's own
answer with the package hidden (sys.modules[name] = None: find_spec None, import fails)."""
from __future__ import annotations

import csv
import io
import json
import sys

import pytest

from torchdeck.cli.main import main as cli_main
from torchdeck.engine import metrics
from torchdeck.engine.events import read_all
from torchdeck.engine.rundir.layout import RunDir
from tests.engine.helpers import run_supervised, small_cfg

# a venv made before tensorboard joined the test extra: these skip, naming it, as test_tasks' do
needs_tb = pytest.mark.skipif(not metrics.tensorboard_available(),
                              reason="tensorboard is not installed (pip install -e '.[test]' brings it)")


@needs_tb
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
    assert not [e for e in evs if e["kind"] == "log" and "tensorboard" in e["message"]]
    # the live TensorBoard files hold what metrics.csv holds: the same tags, steps and values
    assert _tb_scalars(rd.tensorboard_dir) == _csv_scalars(rows)
    assert set(_tb_scalars(rd.tensorboard_dir)) == {f"rank{r}/{k}" for r in (0, 1) for k in _STEP_TAGS} | {
        f"epoch/{k}" for k in ("train_loss", "train_acc", "val_loss", "val_acc")}

    out = tmp_path / "again.csv"
    assert cli_main(["metrics", str(run), "--csv", str(out)]) == 0
    assert out.read_text() == rd.metrics_path.read_text()
    assert f"{len(want)} metric rows" in capsys.readouterr().out
    # rebuilt from events.jsonl: TensorBoard files that say what `metrics --csv -` says
    assert cli_main(["metrics", str(run), "--tensorboard", str(tmp_path / "tb")]) == 0
    assert f"{len(want)} metric rows written to {tmp_path / 'tb'}" in capsys.readouterr().out
    assert cli_main(["metrics", str(run), "--csv", "-"]) == 0
    printed = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert len(printed) == len(rows) and _tb_scalars(tmp_path / "tb") == _csv_scalars(printed)
    # the same folder again would hold two files and TensorBoard would show every step twice
    files = list((tmp_path / "tb").iterdir())
    assert cli_main(["metrics", str(run), "--tensorboard", str(tmp_path / "tb")]) == 2
    assert "already holds TensorBoard event files" in capsys.readouterr().err
    assert cli_main(["metrics", str(run), "--tensorboard", str(out)]) == 2  # a file, not a folder
    assert "that is a file" in capsys.readouterr().err
    assert list((tmp_path / "tb").iterdir()) == files and out.read_text() == rd.metrics_path.read_text()


_STEP_TAGS = ("loss", "accuracy", "lr", "samples_per_s", "data_wait_s", "compute_s")  # tokens_per_s: LMs only


def _tb_scalars(logdir) -> dict:
    """{tag: [(step, value)]} as TensorBoard's own reader loads the folder."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0})  # 0: every point, not a sample
    acc.Reload()
    return {tag: [(s.step, pytest.approx(s.value, rel=1e-6)) for s in acc.Scalars(tag)]  # float32 in the file
            for tag in acc.Tags()["scalars"]}


def _csv_scalars(rows) -> dict:
    """What TensorBoard should show for metrics.csv rows (docs/runs.md): a step row's numbers as
    rankN/<column>, an epoch's as epoch/<column>; the task's own ({name: value} columns) as
    rankN/<name>, epoch/train_<name>, epoch/val_<name>."""
    out: dict = {}
    for r in rows:
        step = r["kind"] == "step"
        group = f"rank{r['rank']}/" if step else "epoch/"
        named = {k: r[k] for k in (_STEP_TAGS + ("tokens_per_s",) if step else
                                   ("train_loss", "train_acc", "val_loss", "val_acc")) if r[k] != ""}
        for col, prefix in ((("metrics", ""),) if step else (("train_metrics", "train_"), ("val_metrics", "val_"))):
            named.update({prefix + k: v for k, v in json.loads(r[col] or "{}").items()})
        for k, v in named.items():
            out.setdefault(group + k, []).append((int(r["step"]), float(v)))
    return out


def test_without_tensorboard_a_run_and_metrics_say_so_once(tmp_path, monkeypatch, capsys):
    """Lightning's fallback: the run says so once (supervisor.log, a warning on its plan) and keeps
    the CSV; `metrics --tensorboard` stops with what to do."""
    from torchdeck.engine import config as cfgmod
    from torchdeck.engine.supervisor.loop import _open_metrics
    from torchdeck.engine.supervisor.writer import EventWriter

    monkeypatch.setitem(sys.modules, "tensorboard", None)  # as if never installed
    assert not metrics.tensorboard_available()
    run = tmp_path / "r"
    run.mkdir()
    cfgmod.save(cfgmod.from_dict(small_cfg(**{"logging.tensorboard": True})), run / "config.yaml")
    (run / "events.jsonl").write_text("")
    rd, writer = RunDir(run), EventWriter(run / "events.jsonl", None)
    try:
        assert _open_metrics(writer, cfgmod.load(run / "config.yaml"), rd) == metrics.TB_MISSING
    finally:
        writer.close()
    assert capsys.readouterr().out == metrics.TB_MISSING + "\n"
    assert rd.metrics_path.is_file() and not rd.tensorboard_dir.exists()
    assert cli_main(["metrics", str(run), "--tensorboard", str(tmp_path / "tb")]) == 2
    assert "tensorboard package is not installed" in capsys.readouterr().err
    assert not (tmp_path / "tb").exists()


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


@needs_tb
def test_a_tasks_own_metrics_are_tensorboard_tags_of_their_own(tmp_path, capsys, monkeypatch):
    """A loss callable's extras and perplexity (engine/sums.py) have names only the run knows: each
    is its own tag beside the fixed ones, with the steps and values of the CSV's JSON columns.
    Records go out two at a time here, so that batches join up in the file (a day's run: 1,700 batches)."""
    monkeypatch.setattr(metrics, "_TB_BATCH", 2)
    from torchdeck.engine import config as cfgmod
    from torchdeck.engine import events
    from tests.run_events import ev

    run = tmp_path / "lm-run"
    run.mkdir()
    cfgmod.save(cfgmod.from_dict(small_cfg()), run / "config.yaml")
    evs = [ev("step", 1, rank=r, epoch=0, step=10, loss=4.0 + r, tokens_per_s=900.0 + r, metrics={"ppl": 54.6 + r})
           for r in (0, 1)]
    evs += [ev("epoch_end", 2, rank=r, epoch=0, step=10, train_loss=4.0, val_loss=3.9, train_metrics={"ppl": 54.6},
               val_metrics={"ppl": 49.4, "aux": 0.25}) for r in (0, 1)]
    evs += [ev("step", 3, rank=0, epoch=1, step=20, loss=3.5, metrics={"ppl": 33.1, "aux": 0.5})]
    (run / "events.jsonl").write_text("".join(events.dumps(e) + "\n" for e in evs))

    assert cli_main(["metrics", str(run), "--tensorboard", str(tmp_path / "tb"), "--csv", "-"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    got = _tb_scalars(tmp_path / "tb")
    assert got == _csv_scalars(rows)
    assert got["rank0/ppl"] == [(10, 54.6), (20, 33.1)] and got["rank1/ppl"] == [(10, 55.6)]
    assert got["rank0/aux"] == [(20, 0.5)] and got["rank1/tokens_per_s"] == [(10, 901.0)]
    assert got["epoch/train_ppl"] == [(10, 54.6)] and got["epoch/val_ppl"] == [(10, 49.4)]
    assert got["epoch/val_aux"] == [(10, 0.25)]  # one epoch end: rank 1's copy is not a second point
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    (file,) = (tmp_path / "tb").iterdir()
    assert file.name.startswith("events.out.tfevents.")
    assert next(EventFileLoader(str(file)).Load()).file_version == "brain.Event:2"  # as tensorboard's own writer


@needs_tb
def test_tfrecord_checksums_are_the_ones_tensorboard_checks():
    """Our CRC-32C against the tensorboard package's own, byte by byte, on chunks of every length
    an event has (and none: the empty chunk), many at once and a few."""
    import random

    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

    rng = random.Random(7)
    chunks = [bytes(rng.randrange(256) for _ in range(n)) for n in range(0, 400, 3)] + [b"\xff" * 8, b""]
    rng.shuffle(chunks)
    assert metrics.masked_crc32c(chunks) == [masked_crc32c(c) for c in chunks]  # numpy's way: many at once
    assert metrics.masked_crc32c(chunks[:5]) == [masked_crc32c(c) for c in chunks[:5]]  # a few: a loop
    assert metrics.masked_crc32c([]) == []


@needs_tb
def test_after_a_restart_tensorboard_shows_the_redone_steps_once(tmp_path, capsys):
    """A restart resumes our loop at its checkpoint (step 20 here) and redoes steps 30-40: the CSV
    keeps every event, TensorBoard drops the lost attempt's points after the checkpoint (its own
    session-start sign), so a curve does not run back over itself."""
    from torchdeck.engine import config as cfgmod
    from torchdeck.engine import events
    from tests.run_events import ev

    run = tmp_path / "restarted"
    run.mkdir()
    cfgmod.save(cfgmod.from_dict(small_cfg()), run / "config.yaml")
    evs = [ev("step", i, rank=0, epoch=0, step=s, loss=loss) for i, (s, loss) in enumerate([(10, 3.0), (20, 2.0), (30, 1.5)])]
    evs += [ev("restart", 4, rank=None, attempt=1, max_restarts=2, cause="rank 1 failed", lost_s=1.0, resume_step=20,
               checkpoint="ckpt-00000020.pt")]
    evs += [ev("step", 5 + i, rank=0, epoch=0, step=s, loss=loss) for i, (s, loss) in enumerate([(30, 1.25), (40, 1.0)])]
    (run / "events.jsonl").write_text("".join(events.dumps(e) + "\n" for e in evs))

    assert cli_main(["metrics", str(run), "--tensorboard", str(tmp_path / "tb"), "--csv", "-"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [(r["step"], r["loss"]) for r in rows] == [("10", "3.0"), ("20", "2.0"), ("30", "1.5"), ("30", "1.25"),
                                                      ("40", "1.0")]
    assert _tb_scalars(tmp_path / "tb")["rank0/loss"] == [(10, 3.0), (20, 2.0), (30, 1.25), (40, 1.0)]
    assert _tb_plugin_scalars(tmp_path / "tb", "rank0/loss") == [(10, 3.0), (20, 2.0), (30, 1.25), (40, 1.0)]

    # a requeued run's second supervisor (SLURM): a second file in the run's folder, resumed at 20
    live = tmp_path / "live"
    for attempt in (evs[:3], evs[4:]):
        sink = metrics.MetricsSink(None, live)
        for e in attempt:
            sink.add(e)
        sink.close()
    assert len(list(live.iterdir())) == 2
    assert _tb_scalars(live)["rank0/loss"] == [(10, 3.0), (20, 2.0), (30, 1.25), (40, 1.0)]
    assert _tb_plugin_scalars(live, "rank0/loss") == [(10, 3.0), (20, 2.0), (30, 1.25), (40, 1.0)]
    # and rebuilt from that run's one events.jsonl, where each supervisor began with run_started
    again = [ev("run_started", 0, run="restarted"), *evs[:3], ev("run_started", 4, run="restarted"), *evs[4:]]
    (run / "events.jsonl").write_text("".join(events.dumps(e) + "\n" for e in again))
    assert cli_main(["metrics", str(run), "--tensorboard", str(tmp_path / "tb2")]) == 0
    assert _tb_scalars(tmp_path / "tb2")["rank0/loss"] == [(10, 3.0), (20, 2.0), (30, 1.25), (40, 1.0)]


def _tb_plugin_scalars(logdir, tag) -> list:
    """[(step, value)] as the TensorBoard server reads the folder without its Rust data server
    (--load_fast=false: the plugin event multiplexer, which keeps a first session start)."""
    from tensorboard.backend.event_processing import plugin_event_multiplexer as pem
    from tensorboard.util import tensor_util

    mux = pem.EventMultiplexer(tensor_size_guidance={"scalars": 0})
    mux.AddRunsFromDirectory(str(logdir))
    mux.Reload()
    return [(e.step, pytest.approx(float(tensor_util.make_ndarray(e.tensor_proto)), rel=1e-6))
            for e in mux.Tensors(".", tag)]
