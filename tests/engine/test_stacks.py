"""Issue 18: when a run hangs, say where each rank is. A real 2-rank gloo run whose rank 1 sleeps
in its forward from step 5 on (tests/engine/helpers.py USER_MODELS `stall`): the supervisor's
watchdog dumps the stacks once rank 1 turns stale, `torchdeck stacks` shows the same live, and
when rank 0's collective times out the root cause says where rank 1 was."""
from __future__ import annotations

import subprocess
import time

import pytest

from torchdeck.engine.rundir import stacks
from torchdeck.engine.runs.view import RunView
from tests.engine.helpers import Run, cli_cmd, ddp_cfg

DUMP = '''\
Thread 0x00007f0000000002 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 327 in wait
  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap

Current thread 0x00007f0000000001 (most recent call first):
  File "/v/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 2950 in all_reduce
  File "/home/u/torchdeck/engine/train.py", line 341 in _should_stop
  File "/home/u/torchdeck/engine/worker.py", line 290 in rank_main
  File "<string>", line 1 in <module>
'''


def test_a_dump_reads_as_the_main_threads_place_and_identical_places_group():
    threads = stacks.parse("garbage line\n" + DUMP + DUMP)  # two dumps in one file: the newest counts
    assert len(threads) == 2
    main = stacks.main_thread(threads)
    assert main.frames[0].func == "all_reduce"
    assert stacks.where(main) == ("all_reduce (distributed/distributed_c10d.py:2950) <- "
                                  "_should_stop (engine/train.py:341)")
    a = stacks.ProcStack("rank 0", 0, 1, "f", threads)
    b = stacks.ProcStack("rank 2", 2, 2, "f", threads)
    c = stacks.ProcStack("rank 1", 1, 3, "f", error="the process is gone")
    groups = stacks.group([c, b, a])
    assert stacks.summary(groups) == ("ranks 0,2: all_reduce (distributed/distributed_c10d.py:2950) <- "
                                      "_should_stop (engine/train.py:341) | rank 1: no dump: the process is gone")
    assert stacks.render(groups, depth=1)[:3] == [
        "ranks 0,2: all_reduce (distributed/distributed_c10d.py:2950) <- _should_stop (engine/train.py:341)",
        "    all_reduce  …/torch/distributed/distributed_c10d.py:2950", "    ... 3 outer frame(s)"]
    # a stacks event read back from a file is input: odd shapes are skipped, never raised
    assert stacks.render([{"who": "rank 0", "where": "x", "frames": 7}, "junk", {"frames": [[1, 2]]}]) == [
        "rank 0: x", "None: None"]
    assert stacks.render("junk") == []


@pytest.mark.slow
def test_a_silent_rank_is_shown_where_it_sleeps_and_named_when_the_collective_times_out(tmp_path, runs):
    r = Run(tmp_path, ddp_cfg(**{"model.name": "usermodels:stall", "model.kwargs": {"at": 5},
                                 "train.max_steps": 200, "nodes.timeout_s": 15}))
    runs.append(r)
    r.wait_for(lambda e: e["kind"] == "step" and e["rank"] == 1 and e["step"] >= 4)
    ev = r.wait_for(lambda e: e["kind"] == "stacks", timeout=60)
    last = max(e["t"] for e in r.events() if e["kind"] == "step" and e["rank"] == 1)
    assert ev["t"] - last < 15, "the watchdog dumps within 15 s of rank 1 going silent"
    where = {rank: g["where"] for g in ev["groups"] for rank in g["ranks"]}
    assert "stall_here (usermodels.py:" in where[1], ev["summary"]
    assert "backward" in where[0] or "all_reduce" in where[0], ev["summary"]
    view = RunView()  # what the Monitor and `torchdeck run` are fed
    view.feed_all(r.events())
    assert view.stacks["summary"] == ev["summary"]
    assert any(ln.level == "warning" and "stall_here" in ln.text for ln in view.logs)
    assert "silent" in ev["reason"] and "1" in ev["reason"].split(" silent")[0], ev["reason"]

    # the same, asked live from outside
    out = subprocess.run(cli_cmd() + ["stacks", str(r.dir)], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "rank 1: stall_here (usermodels.py:" in out.stdout, out.stdout
    assert "rank 0: " in out.stdout, out.stdout
    assert "supervisor: " in out.stdout, out.stdout

    assert r.wait(timeout=60) == 1
    cause = r.status()["root_cause"]
    assert "a collective timed out after nodes.timeout_s=15 s" in cause, cause
    assert "rank 1 sent no error" in cause and "rank 1 was in stall_here (usermodels.py:" in cause, cause


@pytest.mark.slow
def test_the_balance_line_names_the_rank_whose_data_is_slow(tmp_path, runs):
    """Rank 1 reads each sample in 2 ms, rank 0 at once: every rank's rate is the same (the
    all-reduce evens them out), but rank 0 waits in the all-reduce and rank 1 in its data."""
    from torchdeck.cli.progress import block

    r = Run(tmp_path, ddp_cfg(**{"data.dataset": "usermodels:slow_data", "data.num_workers": 0,
                                 "train.max_steps": 40, "train.log_every_n_steps": 5}))
    runs.append(r)
    assert r.wait(timeout=120) == 0, r.output()
    view = RunView()
    view.feed_all(r.events())
    b = view.balance()
    assert b["rank"] == 1 and b["cause"] == "data" and b["waiter"] == 0 and not b["even"], b
    assert view.ranks[0].comm_wait > 0.5 > view.ranks[1].comm_wait, view.ranks
    line = view.balance_line()
    assert line.startswith("rank 1 holds the others back: mostly data"), line
    assert line in block(view, view.last_t, 200)  # what `torchdeck run` draws


@pytest.mark.slow
def test_stacks_of_a_run_started_by_torchrun(tmp_path):
    """Ranks started by torchrun register the same handler; torchrun's agent, which has none, is
    not signalled (SIGUSR2 would end it)."""
    import os
    import signal
    import sys

    from torchdeck.engine import config as cfgmod
    from torchdeck.engine import events
    from tests.engine.helpers import ROOT, USER_MODELS, wait_for

    (tmp_path / "usermodels.py").write_text(USER_MODELS)
    cfgmod.save(cfgmod.from_dict(ddp_cfg(**{"model.name": "usermodels:stall", "model.kwargs": {"at": 5},
                                            "train.max_steps": 200})), tmp_path / "c.yaml")
    run = tmp_path / "run"
    agent = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
                              "--nproc-per-node", "2", "-m", "torchdeck.engine.worker", str(tmp_path / "c.yaml"),
                              "--run-dir", str(run)], cwd=ROOT, start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(tmp_path)))
    try:
        wait_for(lambda: any(e["kind"] == "step" and e["rank"] == 1 and e["step"] >= 4
                             for e in events.read_all(run / "events.jsonl")), 90, "rank 1 at step 4")
        time.sleep(1.0)
        out = subprocess.run(cli_cmd() + ["stacks", str(run)], capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stdout + out.stderr
        assert "rank 1: stall_here (usermodels.py:" in out.stdout and "rank 0: " in out.stdout, out.stdout
        assert "2 process(es)" in out.stdout and "supervisor" not in out.stdout, out.stdout
        time.sleep(0.5)
        assert agent.poll() is None, "torchrun's agent was signalled"
    finally:  # torchrun starts each rank in a session of its own: a SIGKILL of the agent leaves them
        ranks = [e["pid"] for e in events.read_all(run / "events.jsonl") if e["kind"] == "rank_ready"]
        agent.terminate()  # the agent stops its ranks on SIGTERM
        try:
            agent.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(agent.pid, signal.SIGKILL)
            agent.wait(10)
        for pid in ranks:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.mark.gpu
@pytest.mark.slow
def test_a_nccl_timeout_names_the_flight_recorder_files(tmp_path, runs):
    """On GPUs NCCL's flight recorder is on: a rank that never arrives leaves its dumps in the run
    directory and the root cause names them."""
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA GPUs (one NCCL rank each)")
    r = Run(tmp_path, ddp_cfg(**{"model.name": "usermodels:stall", "model.kwargs": {"at": 5},
                                 "accelerator": "cuda", "devices": 2, "backend": "nccl",
                                 "train.max_steps": 200, "nodes.timeout_s": 10}))
    runs.append(r)
    assert r.wait(timeout=180) == 1
    cause = r.status()["root_cause"]
    assert "NCCL flight recorder: nccl_trace_rank_" in cause, cause


def _step(rank, wait, comm, t=100.0):
    from torchdeck.engine import events

    ev = events.make("step", rank=rank, epoch=0, step=10, total_steps=100, loss=1.0, accuracy=0.5,
                     samples_per_s=100.0, data_wait_s=wait, compute_s=1.0 - wait, lr=0.1, comm_s=comm)
    ev["t"] = t
    return ev


def test_balance_from_step_events_and_from_another_nodes_report():
    view = RunView()
    view.feed_all([_step(0, 0.05, 0.30), _step(1, 0.05, 0.25)])
    assert view.balance()["even"] and view.balance_line().startswith("rank balance: even")
    # rank 2 lives on another node: only rank 0's rank_report carries it; it computes, the others wait
    view.feed({"v": 1, "kind": "rank_report", "t": 101.0, "rank": 0, "reports": [
        {"rank": 2, "host": "b", "node_rank": 1, "epoch": 0, "step": 10, "samples_per_s": 100.0,
         "data_wait": 0.02, "comm_wait": 0.01, "device_mem_mb": 1.0, "t": 101.0}]})
    b = view.balance()
    assert (b["rank"], b["cause"], b["even"], b["waiter"]) == (2, "compute", False, 0), b
    assert view.balance_line().startswith("rank 2 (node 1) holds the others back: mostly compute (data 2%, compute 97%")
    view.feed(_step(1, 0.05, None, t=102.0))  # a rank that does not time its all-reduce: no verdict on it
    assert view.ranks[1].comm_wait is None and view.balance()["rank"] == 2


@pytest.mark.slow
def test_one_step_far_over_the_median_dumps_stacks_before_the_rank_is_stale(tmp_path, runs):
    """Rank 1 sleeps 5 s in one step of a run of ~10 ms steps: the stale rule (10 s) never fires,
    the median rule does, shows rank 1 in the sleep, and the run finishes."""
    from torchdeck.engine.runs.view import SLOW_MIN_S

    r = Run(tmp_path, ddp_cfg(**{"model.name": "usermodels:stall", "model.kwargs": {"at": 30, "seconds": 5.0},
                                 "train.max_steps": 60}))
    runs.append(r)
    ev = r.wait_for(lambda e: e["kind"] == "stacks", timeout=120)
    assert "x the median window" in ev["reason"] and "1" in ev["reason"].split(" slow:")[0], ev["reason"]
    assert "silent" not in ev["reason"]  # it was heard from: it is slow, not silent
    where = {rank: g["where"] for g in ev["groups"] for rank in g["ranks"]}
    assert "stall_here (usermodels.py:" in where[1], ev["summary"]
    before = max(e["t"] for e in r.events() if e["kind"] == "step" and e["rank"] == 1 and e["t"] < ev["t"])
    assert SLOW_MIN_S < ev["t"] - before < 5.0, "dumped while rank 1 slept, after the rule's floor"
    assert r.wait(timeout=120) == 0
    assert r.status()["status"] == "finished"
    assert sum(e["kind"] == "stacks" for e in r.events()) == 1, "once per stall"


def test_stacks_of_a_run_that_is_over_are_the_last_recorded_files_or_event(tmp_path):
    """Issue 27: `t` in the Monitor left rank0.stacks, rank1.stacks and supervisor.stacks in the run
    directory, yet `torchdeck stacks RUN` on the finished run said it "took no stacks" (it read only
    the watchdog's `stacks` events). It prints the last stacks recorded, files or event, the newer."""
    import json
    import os

    from torchdeck.engine import config as cfgmod
    from torchdeck.engine import events
    from torchdeck.engine.rundir.layout import RunDir
    from tests.engine.helpers import env_for, small_cfg
    from tests.run_events import T0, ev, started

    run = tmp_path / "runs" / "over"
    run.mkdir(parents=True)
    cfgmod.save(cfgmod.from_dict(small_cfg()), run / "config.yaml")
    evs = [started(world=2), ev("run_finished", 50, status="stopped", exit_codes=[0, 0], root_cause=None,
                                elapsed_s=50.0)]
    (run / "events.jsonl").write_text("".join(events.dumps(e) + "\n" for e in evs))
    (run / "status.json").write_text(json.dumps({"status": "stopped", "exit_codes": [0, 0], "elapsed_s": 50.0}))
    for name in ("rank0.stacks", "rank1.stacks", "supervisor.stacks"):
        (run / name).write_text(DUMP)
        os.utime(run / name, (T0 + 40, T0 + 40))

    def cli():
        p = subprocess.run(cli_cmd() + ["stacks", str(run)], env=env_for(tmp_path), capture_output=True,
                           text=True, timeout=60)
        return p.returncode, p.stdout + p.stderr

    code, out = cli()
    assert code == 0, out
    assert "took no stacks" not in out and "the stacks last recorded at" in out
    assert "rank0.stacks, rank1.stacks, supervisor.stacks" in out
    assert ("ranks 0,1, supervisor: all_reduce (distributed/distributed_c10d.py:2950) <- "
            "_should_stop (engine/train.py:341)") in out
    # the watchdog's event, newer than the files, wins (with its reason); older, the files do
    watchdog = ev("stacks", 45, rank=None, reason="rank 1 silent for 12 s", summary="rank 1: sleep (x.py:1)",
                  groups=[{"who": "rank 1", "ranks": [1], "where": "sleep (x.py:1)", "frames": []}],
                  files=["rank1.stacks"])
    (run / "events.jsonl").write_text("".join(events.dumps(e) + "\n" for e in [evs[0], watchdog, evs[1]]))
    code, out = cli()
    assert code == 0 and "(rank 1 silent for 12 s; rank1.stacks)" in out and "rank 1: sleep (x.py:1)" in out, out
    os.utime(run / "rank0.stacks", (T0 + 48, T0 + 48))
    assert stacks.last_recorded(RunDir(run))["reason"] == "asked"
