"""Issue 37 item 2: attach and open from a view checkpoint (view.ckpt.json), not from the start.

Real runs of every kind are recorded once for the module (our loop, a user's script, two nodes with
node samples, failed, stopped, resumed); each test works on a copy of one. A view made from a
checkpoint plus the events after it must equal the view made from every event, whoever wrote the
checkpoint (the supervisor as the run went, or a reader after its pass) and wherever it was cut; a
checkpoint that does not fit its file is ignored with a log line, never trusted.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from torchdeck.engine import config as cfgmod
from torchdeck.engine.runs import catalog, control
from torchdeck.engine.runs import follow as follow_mod
from torchdeck.engine.runs.follow import Follower
from torchdeck.engine.runs.view import checkpoint as ck
from torchdeck.engine.rundir.layout import RunDir
from torchdeck.engine.supervisor import EventWriter
from tests.engine.helpers import ROOT, Run, ddp_cfg, wait_for

pytestmark = pytest.mark.slow

SCRIPT = '''
import torch, torch.distributed as dist, torchdeck
dist.init_process_group("gloo")
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(30):
    x, y = torch.randn(8, 4), torch.randn(8, 1)
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad(); loss.backward(); opt.step()
    torchdeck.log({"loss": loss.item()}, samples=len(x))
print("done", flush=True)
dist.destroy_process_group()
'''
KINDS = ("loop", "script", "multinode", "failed", "stopped", "resumed")


def _loop_cfg(**over):
    return ddp_cfg(**{"data.train_size": 64, "train.max_steps": 8, "train.eval_every_epoch": True,
                      "checkpoint.every_n_steps": 4, **over})


def _two_nodes(root: Path) -> list[subprocess.Popen]:
    """`torchdeck run PRESET --node-rank K` for K = 0, 1 over 127.0.0.1: node 1's events and samples
    stream into node 0's events.jsonl."""
    from tests.engine.test_multinode import free_port, torchdeck_cmd, write_preset

    cfg = _loop_cfg(devices=1, **{"train.report_every_s": 0.05, "nodes.num_nodes": 2,
                                  "nodes.master_addr": "127.0.0.1", "nodes.master_port": free_port(),
                                  "nodes.timeout_s": 60})
    preset = write_preset(root / "two-node.yaml", cfg)
    env = dict(os.environ, TORCHDECK_NODE_SECRET="a secret of both nodes")
    return [subprocess.Popen(torchdeck_cmd("run", str(preset), "--node-rank", str(k), "--runs-dir",
                                           str(root / f"node{k}")), cwd=root, env=env, stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT) for k in (0, 1)]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> dict[str, RunDir]:
    """One small real run of each kind, recorded at once (they run side by side)."""
    root = tmp_path_factory.mktemp("recorded")
    loop = Run(root, _loop_cfg(), "loop")
    failed = Run(root, ddp_cfg(**{"model.name": "usermodels:failing", "train.max_steps": 40}), "failed")
    stopped = Run(root, ddp_cfg(**{"train.max_steps": 100000, "train.epochs": 1000}), "stopped")
    (root / "script.py").write_text(SCRIPT)
    script = control.start(cfgmod.from_dict({
        "name": "mine", "strategy": "script", "accelerator": "cpu", "devices": 2,
        "nodes": {"master_addr": "127.0.0.1", "master_port": 0}, "train": {"threads_per_rank": 1},
        "script": {"path": str(root / "script.py"), "cwd": str(root),
                   "env": {"TORCHDECK_STEP_EVERY_S": "0.2"}}}), root / "scripts")
    nodes = _two_nodes(root)
    runs = [loop, failed, stopped]
    try:
        wait_for(lambda: any(e["kind"] == "step" for e in stopped.events()), 180, "the stopped run's steps")
        control.request_stop(RunDir(stopped.dir))
        for r in runs:
            r.wait(timeout=180)
        cfg, origin, _, _ = control.resume_config(RunDir(loop.dir), ["train.max_steps=12", "train.epochs=3"])
        resumed = control.start(cfg, root / "resumed", origin)
        for p in nodes:
            p.wait(timeout=240)
        for run in (script, resumed):
            wait_for(run.final_status, 180, f"{run.name} to end")
    finally:
        for r in runs:
            r.kill()
        for p in nodes:
            p.kill()
    node0 = next(d for d in (root / "node0").iterdir() if (d / "config.yaml").is_file())
    out = {"loop": RunDir(loop.dir), "script": script, "multinode": RunDir(node0), "failed": RunDir(failed.dir),
           "stopped": RunDir(stopped.dir), "resumed": resumed}
    for kind, rd in out.items():
        wait_for(lambda: rd.final_status() and not control.run_processes(rd), 60, f"{kind} to be over")
    return out


def _copy(rd: RunDir, tmp_path: Path) -> RunDir:
    dst = tmp_path / rd.name
    shutil.copytree(rd.path, dst)
    return RunDir(dst)


def _state(view) -> dict:
    return ck.encode(view.snapshot())


def _events_view(rd: RunDir, **kw):
    """The view of every event (what attach and the Monitor fold before the status files speak)."""
    f = Follower(rd, outputs=False, **kw)
    f.events.feed(f.view.feed)
    return f


def _line_starts(data: bytes) -> list[int]:
    return [0] + [i + 1 for i, b in enumerate(data) if b == 0x0A]


def test_the_recorded_runs_are_of_every_kind(recorded):
    """What each kind must have for the tests below to mean something."""
    kinds = {k: [json.loads(x).get("kind") for x in rd.events_path.read_text().splitlines()]
             for k, rd in recorded.items()}
    st = {k: rd.final_status()["status"] for k, rd in recorded.items()}
    assert st == {"loop": "finished", "script": "finished", "multinode": "finished", "failed": "failed",
                  "stopped": "stopped", "resumed": "finished"}, st
    assert "node_sample" in kinds["multinode"] and "epoch_end" in kinds["loop"], kinds["multinode"]
    assert follow_mod.resumed_chain(recorded["resumed"]), "the resumed run continues the loop run"


@pytest.mark.parametrize("kind", KINDS)
def test_the_supervisors_checkpoint_plus_the_tail_equals_every_event(recorded, kind, tmp_path):
    """The supervisor's view.ckpt.json (its last: the run's end) is the view of every event it
    wrote; a resumed run's holds the earlier part's curves first, as its readers' views do."""
    rd = _copy(recorded[kind], tmp_path)
    whole = _state(_events_view(rd, use_checkpoint=False).view)
    history = json.loads(ck.path_of(rd.events_path).read_text())["history"]
    assert bool(history) == (kind == "resumed"), history
    f = _events_view(rd)
    assert f.from_checkpoint and _state(f.view) == whole
    assert ck.load(rd.events_path, f._history)[1] == rd.events_path.stat().st_size  # after the run's last event
    if kind == "resumed":  # what it starts from is the loop run's curve and this run's events
        assert f.view.start_step and f.view.steps.points[0][0] < f.view.start_step


@pytest.mark.parametrize("kind", KINDS)
def test_a_checkpoint_at_any_line_plus_the_tail_equals_every_event(recorded, kind, tmp_path):
    """A reader's checkpoint taken after any line (and one taken with the read stopped mid-line:
    it covers the whole lines only) gives, with the events after it, the view of every event."""
    rd = _copy(recorded[kind], tmp_path)
    data = rd.events_path.read_bytes()
    whole = _state(_events_view(rd, use_checkpoint=False).view)
    starts = _line_starts(data)
    cuts = sorted(set(starts[1::max(1, len(starts) // 12)] + [starts[len(starts) // 2] + 5, len(data) - 3, len(data)]))
    for cut in cuts:
        part = Follower(rd, outputs=False, use_checkpoint=False)
        part.events.feed(part.view.feed, max_bytes=cut)
        at = part.events.offset
        assert at == max(s for s in starts if s <= cut), cut
        assert ck.save(rd.events_path, ck.state(part.view, at, part._history, part.events.malformed))
        f = _events_view(rd)
        assert f.from_checkpoint and f.events._pos == len(data), cut
        assert _state(f.view) == whole, f"checkpoint at byte {at} (read to {cut}) + its tail != every event"


def test_a_checkpoint_that_does_not_fit_its_file_is_ignored_with_a_log_line(recorded, tmp_path, caplog):
    """Mid-line, past the end, over other bytes, another schema, corrupt, or naming a class it may
    not build: each is ignored (said in the log) and the run is read from its start."""
    rd = _copy(recorded["loop"], tmp_path)
    p = ck.path_of(rd.events_path)
    good = json.loads(p.read_text())
    whole = _state(_events_view(rd, use_checkpoint=False).view)
    size = rd.events_path.stat().st_size
    middle = _line_starts(rd.events_path.read_bytes())[5]
    bad = {
        "mid-line": dict(good, offset=middle + 1),
        "past the end": dict(good, offset=size + 1),
        "another line": dict(good, offset=middle),
        "schema": dict(good, schema=ck.SCHEMA + 1),
        "class": dict(good, view={"~o": "Popen", "v": {}}),
        "no view": {k: v for k, v in good.items() if k != "view"},
    }
    texts = {k: json.dumps(v) for k, v in bad.items()}
    texts["truncated"] = p.read_text()[: len(p.read_text()) // 2]
    texts["not an object"] = "[1, 2]"
    for why, text in texts.items():
        p.write_text(text)
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="torchdeck.view.checkpoint"):
            f = _events_view(rd)
        assert not f.from_checkpoint and f.events._pos == size, why
        assert _state(f.view) == whole, why
        assert any("ignored" in r.getMessage() for r in caplog.records), (why, caplog.text)


def test_an_older_run_without_a_checkpoint_opens_as_before_and_then_gets_one(recorded, tmp_path, monkeypatch):
    """A run written before checkpoints (or by torchrun) is read in one pass; a long one then gets
    a checkpoint (only where its directory is writable: a read is never failed over it)."""
    rd = _copy(recorded["stopped"], tmp_path)
    ck.path_of(rd.events_path).unlink()
    whole = _state(_events_view(rd, use_checkpoint=False).view)
    f = Follower(rd, outputs=False)
    f.poll()
    assert not f.from_checkpoint and not ck.path_of(rd.events_path).exists()  # a short file: not worth one
    monkeypatch.setattr(follow_mod, "LEAVE_BYTES", 0)
    ck.path_of(rd.events_path).mkdir()  # a checkpoint that cannot be written (the tests run as root: no chmod)
    ro = Follower(rd, outputs=False)
    ro.poll(force=True)
    assert ro.view.status == "stopped" and ck.path_of(rd.events_path).is_dir()
    ck.path_of(rd.events_path).rmdir()
    f = Follower(rd, outputs=False)
    f.poll(force=True)
    assert ck.path_of(rd.events_path).exists() and f.view.status == "stopped"
    again = _events_view(rd)
    assert again.from_checkpoint and _state(again.view) == whole


def test_a_resumed_runs_supervisor_checkpoints_as_it_goes(recorded, tmp_path):
    """The supervisor of a resumed run checkpoints as it goes, as any run's does: its view gets the
    earlier part's curves (read off the ranks' path, then this run's file read back) before its
    first checkpoint, so one taken mid-run plus the events after it is the view of every event."""
    rd = _copy(recorded["resumed"], tmp_path)
    whole = _state(_events_view(rd, use_checkpoint=False).view)
    lines = rd.events_path.read_bytes().decode().splitlines()
    for p in (rd.events_path, ck.path_of(rd.events_path), ck.summary_path_of(rd.events_path)):
        p.unlink()
    writer = EventWriter(rd.events_path, None)  # as its supervisor made it: the same run directory
    half = len(lines) // 2
    try:
        for line in lines[:half]:
            writer.take(line)
        writer.flush_taken()
        wait_for(writer._history_ready.is_set, 60, "the writer's view to get the earlier part's curves")
        assert writer.checkpoint()
        for line in lines[half:]:
            writer.take(line)
        writer.flush_taken()
    finally:
        writer.fh.close()  # not close(): that checkpoints the end
    f = _events_view(rd)
    assert f.from_checkpoint and f.events._pos == rd.events_path.stat().st_size
    assert ck.load(rd.events_path, f._history)[1] == sum(len(x.encode()) + 1 for x in lines[:half])
    assert _state(f.view) == whole


def test_a_resumed_runs_first_reader_leaves_a_checkpoint_with_its_history(recorded, tmp_path, monkeypatch):
    """A resumed run without a checkpoint (written before supervisors wrote one for it) is read with
    the run it continues first; the first reader leaves a checkpoint holding that history when the
    history alone was long, and a reader that does not add it (a comparison's row) neither uses nor
    overwrites it."""
    rd = _copy(recorded["resumed"], tmp_path)
    ck.path_of(rd.events_path).unlink()
    whole = _state(_events_view(rd, use_checkpoint=False).view)
    own, history = rd.events_path.stat().st_size, recorded["loop"].events_path.stat().st_size
    monkeypatch.setattr(follow_mod, "LEAVE_BYTES", own + history // 2)  # its own events alone: too short
    first = Follower(rd, outputs=False)
    first.read()
    assert not first.from_checkpoint and first.events.offset == own
    assert json.loads(ck.path_of(rd.events_path).read_text())["history"]
    f = _events_view(rd)
    assert f.from_checkpoint and _state(f.view) == whole
    bare = Follower(rd, outputs=False, history=False)
    assert not bare.from_checkpoint and bare.read().start_step == 0
    assert json.loads(ck.path_of(rd.events_path).read_text())["history"]


def test_runs_says_the_same_of_a_run_from_its_checkpoint(recorded, tmp_path, monkeypatch):
    """`torchdeck runs` summarizes a long run from its checkpoint and the tail: the same row as from
    the head, epoch ends and tail of its file."""
    for kind in ("loop", "failed", "stopped", "multinode"):
        rd = _copy(recorded[kind], tmp_path / kind)
        monkeypatch.setattr(catalog, "CHECKPOINT_FROM_BYTES", 1 << 40)
        before = catalog.summarize(rd, now=time.time()).cells()
        monkeypatch.setattr(catalog, "CHECKPOINT_FROM_BYTES", 0)
        assert catalog._from_checkpoint(rd) is not None
        assert catalog.summarize(rd, now=time.time()).cells() == before, kind


def test_attach_of_a_finished_run_starts_from_the_supervisors_checkpoint(recorded, tmp_path):
    """`torchdeck attach` takes the run from its checkpoint: with run_started blanked out of the file
    (the line kept, as spaces), the header still says the strategy and world; without the
    checkpoint it cannot."""
    rd = _copy(recorded["loop"], tmp_path)
    data = rd.events_path.read_bytes()
    with open(rd.events_path, "r+b") as fh:
        fh.write(b" " * data.index(b"\n"))

    def attach() -> str:
        out = subprocess.run([sys.executable, "-m", "torchdeck.cli.main", "attach", str(rd.path)], cwd=ROOT,
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stdout + out.stderr
        return out.stdout

    assert "FINISHED | ddp | world 2" in attach()
    ck.path_of(rd.events_path).unlink()
    assert "FINISHED | ? | world ?" in attach()


def _cut_before_the_end(rd: RunDir, pid: int) -> None:
    """Make a copied run one that has not ended: no status.json, its events up to its run_finished
    line, `pid` as its supervisor's, and a reader's checkpoint (and row summary) a third of the way
    in, so a row is its summary plus the events after it."""
    rd.status_path.unlink()
    data = rd.events_path.read_bytes()
    rd.events_path.write_bytes(data[:data.rindex(b"\n", 0, data.index(b'"run_finished"')) + 1])
    rd.pid_path.write_text(f"{pid}\n")
    part = Follower(rd, outputs=False, use_checkpoint=False)
    part.events.feed(part.view.feed, max_bytes=len(data) // 3)
    assert ck.save(rd.events_path, ck.state(part.view, part.events.offset, part._history, part.events.malformed))


def _runs_folder(recorded, root: Path, monkeypatch) -> Path:
    """A runs folder of every kind: finished (loop, script, two nodes, resumed with its first
    reader's checkpoint), failed, stopped, running (a live pid), lost (a dead one) and one without
    any checkpoint (an older run)."""
    runs = root / "runs"
    runs.mkdir()
    for kind in KINDS:
        _copy(recorded[kind], runs)
    monkeypatch.setattr(follow_mod, "LEAVE_BYTES", 0)
    Follower(RunDir(runs / recorded["resumed"].name), outputs=False).read()  # its first reader leaves one
    for name, src in (("running", "stopped"), ("lost", "loop"), ("older", "failed")):
        dst = runs / (recorded[src].name + "-" + name)
        shutil.copytree(recorded[src].path, dst)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    _cut_before_the_end(RunDir(runs / (recorded["stopped"].name + "-running")), os.getpid())
    _cut_before_the_end(RunDir(runs / (recorded["loop"].name + "-lost")), int(dead.stdout))
    older = RunDir(runs / (recorded["failed"].name + "-older"))
    ck.path_of(older.events_path).unlink()
    ck.summary_path_of(older.events_path).unlink()
    return runs


def _rows(runs: Path, now: float) -> list[dict]:
    return [dataclasses.asdict(r) for r in catalog.collect(runs, now=now)]


def test_runs_rows_from_row_summaries_equal_the_rows_made_the_old_way(recorded, tmp_path, monkeypatch):
    """`torchdeck runs` and the Runs list read a run's row summary (view.sum.json: the view without
    its curves) instead of decoding its whole checkpoint: every field of every row is the same as
    from the checkpoint, and every column the same as from the file's head, epoch ends and tail."""
    runs = _runs_folder(recorded, tmp_path, monkeypatch)
    monkeypatch.setattr(catalog, "CHECKPOINT_FROM_BYTES", 0)  # small recorded runs: as a long run's are read
    now = time.time()
    summaries = sorted(runs.glob("*/" + ck.SUMMARY_NAME))
    assert len(summaries) == 8, summaries  # all but the older run's: the supervisor or a reader wrote them
    for p in summaries:
        row = ck.load_row(p.with_name("events.jsonl"))
        assert row is not None and row[0].steps.points == [] and row[0].logs == [], p  # no curves in it
    aside = tmp_path / "aside"
    for p in runs.glob("*/" + ck.NAME):  # rows from the summaries alone
        (aside / p.parent.name).mkdir(parents=True)
        p.rename(aside / p.parent.name / p.name)
    from_summaries = _rows(runs, now)
    for d in aside.iterdir():  # rows from the checkpoints alone (before row summaries)
        (d / ck.NAME).rename(runs / d.name / ck.NAME)
    for p in summaries:
        p.unlink()
    from_checkpoints = _rows(runs, now)
    assert {r["status"] for r in from_checkpoints} == {"finished", "failed", "stopped", "running", "lost"}
    assert from_summaries == from_checkpoints
    monkeypatch.setattr(catalog, "CHECKPOINT_FROM_BYTES", 1 << 40)
    head_tail = catalog.collect(runs, now=now)
    assert [r.cells() for r in head_tail] == [catalog.RunSummary(**r).cells() for r in from_summaries]


def test_a_corrupt_or_partial_row_summary_is_ignored(recorded, tmp_path, monkeypatch, caplog):
    """A row summary that does not fit its file (cut short, mid-line, over other bytes, another
    schema, not a view, garbage) is ignored with a log line: the row is made from the checkpoint,
    or without one from the file, and is the same row; nothing raises."""
    rd = _copy(recorded["failed"], tmp_path / "runs")
    monkeypatch.setattr(catalog, "CHECKPOINT_FROM_BYTES", 0)
    now = time.time()
    p = ck.summary_path_of(rd.events_path)
    good_text = p.read_text()
    good, want = json.loads(good_text), _rows(rd.path.parent, now)
    middle = _line_starts(rd.events_path.read_bytes())[5]
    bad = {"mid-line": dict(good, offset=middle + 1), "another line": dict(good, offset=middle),
           "past the end": dict(good, offset=rd.events_path.stat().st_size + 1),
           "schema": dict(good, schema=ck.SCHEMA + 1), "not a view": dict(good, view=good["view"]["v"]["ranks"]),
           "a rank, not a view": dict(good, view={"~o": "RankState", "v": {}}), "class": dict(good, view={"~o": "Popen"})}
    texts = {k: json.dumps(v) for k, v in bad.items()}
    texts.update({"cut short": good_text[: len(good_text) // 2], "empty": "", "not an object": "[1]",
                  "garbage": "\x00\xff garbage"})
    for checkpoint_too in (False, True):
        if checkpoint_too:  # nothing to fall back on but the file itself
            ck.path_of(rd.events_path).unlink()
        for why, text in texts.items():
            p.write_text(text)
            caplog.clear()
            with caplog.at_level(logging.INFO, logger="torchdeck.view.checkpoint"):
                got = _rows(rd.path.parent, now)
            assert any("ignored" in r.getMessage() for r in caplog.records), (why, caplog.text)
            if checkpoint_too:
                assert [catalog.RunSummary(**r).cells() for r in got] == [catalog.RunSummary(**r).cells() for r in want], why
            else:
                assert got == want, why
