"""A real 2-rank run's events file: every kind, in order, with the fields the app reads;
the event writer keeps up with many ranks; a checkpoint evaluates on its own."""
from __future__ import annotations

import socket

import pytest

from torchdeck.engine import events
from torchdeck.engine.evaluate import EvalError, evaluate


@pytest.mark.slow
def test_two_rank_run_events_cover_every_kind(tmp_path):
    from tests.engine.helpers import final_model, run_supervised, small_cfg

    with socket.socket() as busy:  # the configured port is taken: the run must move, and say so
        busy.bind(("", 0))
        busy.listen()
        port = busy.getsockname()[1]
        cfg = small_cfg(strategy="ddp", devices=2, **{
            "train.batch_size": 16, "train.max_steps": 0, "train.epochs": 2, "train.eval_every_epoch": True,
            "train.log_every_n_steps": 3, "checkpoint.every_epoch": True, "checkpoint.every_n_steps": 5,
            "nodes.master_port": port})
        proc = run_supervised(tmp_path / "run", cfg)
    run = tmp_path / "run"
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = (run / "events.jsonl").read_text().splitlines()
    evs = events.read_all(run / "events.jsonl")
    assert len(evs) == len(lines)  # every line parses
    kinds = {e["kind"] for e in evs}
    assert kinds >= {"run_started", "rank_ready", "step", "epoch_end", "checkpoint", "log", "rank_exited",
                     "run_finished"}
    assert all(e["v"] == events.EVENT_VERSION and isinstance(e["t"], float) for e in evs)
    assert evs[0]["kind"] == "run_started" and evs[-1]["kind"] == "run_finished"

    start = evs[0]
    assert start["world_size"] == 2 and start["nproc_per_node"] == 2 and start["global_batch"] == 32
    assert start["devices"] == ["cpu", "cpu"] and start["total_steps"] == 16
    assert start["master_port"] != port
    assert any(e["kind"] == "log" and e["rank"] is None and e["message"] == f"port {port} in use; using "
               f"{start['master_port']}" for e in evs)

    ready = {e["rank"]: e for e in evs if e["kind"] == "rank_ready"}
    assert set(ready) == {0, 1} and all(e["device"] == "cpu" and e["pid"] > 0 for e in ready.values())
    assert all(e["threads"] >= 1 for e in ready.values())

    for rank in (0, 1):
        steps = [e for e in evs if e["kind"] == "step" and e["rank"] == rank]
        assert [e["step"] for e in steps] == [3, 6, 8, 9, 12, 15, 16]  # every 3rd and each epoch's last
        for e in steps:
            assert e["total_steps"] == 16 and e["samples_per_s"] > 0 and e["lr"] == pytest.approx(0.1)
            assert 0 <= e["data_wait_s"] and 0 <= e["compute_s"] and e["loss"] > 0
            assert 0 <= e["accuracy"] <= 1
        ends = [e for e in evs if e["kind"] == "epoch_end" and e["rank"] == rank]
        assert [e["epoch"] for e in ends] == [0, 1]
        assert all(0 <= e["val_acc"] <= 1 and e["val_loss"] > 0 for e in ends)
    # the val metrics are global: every rank reports the same numbers
    by_epoch = {}
    for e in evs:
        if e["kind"] == "epoch_end":
            by_epoch.setdefault(e["epoch"], set()).add((e["val_loss"], e["val_acc"], e["train_loss"]))
    assert all(len(v) == 1 for v in by_epoch.values())

    cks = [e for e in evs if e["kind"] == "checkpoint"]
    assert {e["rank"] for e in cks} == {0}
    assert [e["step"] for e in cks] == [5, 8, 10, 15, 16]
    assert (run / "checkpoints" / "ckpt-00000016.pt").is_file()
    assert len(list((run / "checkpoints").glob("ckpt-*.pt"))) == 5  # keep_last 20
    fin = evs[-1]
    assert fin["status"] == "finished" and fin["exit_codes"] == [0, 0] and fin["root_cause"] is None
    assert "Traceback" not in (run / "rank0.log").read_text()

    # The final checkpoint evaluates on its own to the accuracy the run reported.
    res = evaluate(run / "checkpoints" / "ckpt-00000016.pt")
    last = [e for e in evs if e["kind"] == "epoch_end"][-1]
    assert res["dataset"] == "synthetic" and res["samples"] == 64
    assert res["accuracy"] == pytest.approx(last["val_acc"]) and res["loss"] == pytest.approx(last["val_loss"])
    assert final_model(run)["step"] == res["step"] == 16


def test_evaluate_refuses_what_is_not_a_checkpoint(tmp_path):
    with pytest.raises(EvalError, match="no checkpoint file"):
        evaluate(tmp_path / "nope.pt")
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"junk")
    with pytest.raises(EvalError, match="not a loadable"):
        evaluate(bad)


def _produce(q, rank, n, go):
    go.wait()
    for i in range(n):  # serialized in the rank, as engine.worker does
        q.put(events.dumps(events.make("step", rank=rank, step=i, total_steps=n, loss=1.0, epoch=0, lr=0.1,
                                       samples_per_s=100.0, data_wait_s=0.01, compute_s=0.1, accuracy=0.5)))


def test_event_writer_keeps_up_with_many_ranks(tmp_path):
    """4 producer processes put 40,000 events; every one lands, in order per rank, none blocks."""
    import multiprocessing as mp

    from torchdeck.engine.supervisor import EventWriter

    ctx = mp.get_context("spawn")
    q, go = ctx.Queue(), ctx.Event()
    writer = EventWriter(tmp_path / "events.jsonl", q)
    writer.start()
    n = 10_000
    procs = [ctx.Process(target=_produce, args=(q, r, n, go)) for r in range(4)]
    for p in procs:
        p.start()
    go.set()  # all four at once, as fast as they can
    for p in procs:
        p.join(120)
        assert p.exitcode == 0  # a producer blocked on a full pipe would hang here
    writer.stop()
    writer.close()
    evs = events.read_all(tmp_path / "events.jsonl")
    assert len(evs) == 4 * n
    for r in range(4):
        assert [e["step"] for e in evs if e["rank"] == r] == list(range(n))
    # How fast is bench/events_rate's to measure (>= 10,000 events/s, recorded in BENCHMARKS.md): a
    # bound here loose enough for a loaded machine would prove little.


@pytest.mark.slow
def test_worker_runs_under_torchrun(tmp_path):
    """`torchrun --standalone --nproc-per-node 2 -m torchdeck.engine.worker CONFIG --run-dir DIR`: events per
    rank in the run dir, and the same weights as one process with the doubled batch."""
    import os
    import subprocess
    import sys

    from torchdeck.engine import config as cfgmod
    from tests.engine.helpers import ROOT, assert_same_weights, final_model, run_in_process, small_cfg

    cfg = small_cfg(strategy="ddp", devices=2, **{"train.batch_size": 16})
    cfgmod.save(cfgmod.from_dict(cfg), tmp_path / "c.yaml")
    run = tmp_path / "run"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
                "--nproc-per-node", "2", "-m", "torchdeck.engine.worker", str(tmp_path / "c.yaml"), "--run-dir", str(run)]
    proc = subprocess.run(torchrun, cwd=ROOT, capture_output=True, text=True, timeout=180,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # The same run directory the supervisor leaves: attach, runs and the app open it.
    evs = events.read_all(run / "events.jsonl")
    for rank in (0, 1):
        assert {e["kind"] for e in evs if e.get("rank") == rank} >= {"rank_ready", "step"}
    assert evs[0]["kind"] == "run_started" and evs[0]["world_size"] == 2 and evs[0]["launcher"] == "torchrun"
    assert evs[-1]["kind"] == "run_finished" and evs[-1]["status"] == "finished"
    assert cfgmod.load(run / "config.yaml").strategy == "ddp"
    from torchdeck.engine.rundir.layout import RunDir

    assert RunDir(run).status() == "finished"
    run_in_process(tmp_path / "one", small_cfg(**{"train.batch_size": 32}))
    assert_same_weights(final_model(run)["model"], final_model(tmp_path / "one")["model"])
