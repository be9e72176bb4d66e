"""A script run (strategy script, `torchdeck launch`) end to end: real scripts written to a
temporary folder, started through the real supervisor (`python -m torchdeck.engine.supervisor
RUN_DIR`, detached as the CLI and the app start it), its run directory read as the front ends
read it.
"""
from __future__ import annotations

import os
import subprocess
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from torchdeck.engine import config as cfgmod
from torchdeck.engine.events import read_all
from torchdeck.engine.launch import env as launch_env
from torchdeck.engine.runs import control
from torchdeck.engine.rundir.layout import RunDir

from tests.engine.helpers import ROOT, assert_nothing_left, cli_cmd, wait_for


DDP = '''
import os, sys, time
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
{log_import}

def main():
    dist.init_process_group("gloo")  # env://: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE
    rank, world = dist.get_rank(), dist.get_world_size()
    print(f"hello from rank {{rank}} of {{world}} local {{os.environ['LOCAL_RANK']}} args {{sys.argv[1:]}}", flush=True)
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=4, sampler=sampler)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    step = 0
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for x, y in loader:
            step += 1
            {before_step}
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            {after_step}
    if rank == 0:
        torch.save(model.module.state_dict(), "model.pt")
    dist.destroy_process_group()
    print(f"rank {{rank}} done after {{step}} steps", flush=True)

if __name__ == "__main__":
    main()
'''


def ddp_script(tmp_path, name="train.py", log=False, before="pass", after="pass") -> Path:
    p = tmp_path / name
    p.write_text(DDP.format(log_import="import torchdeck" if log else "", before_step=before,
                            after_step=after if not log else
                            "torchdeck.log({'loss': loss.item()}, samples=len(x)); " + after))
    return p


def script_cfg(tmp_path, path, *, devices=2, args=(), nodes=None, stop_grace_s=30.0, name="mine", env=None):
    d = {"name": name, "strategy": "script", "accelerator": "cpu", "devices": devices,
         "nodes": {"master_addr": "127.0.0.1", "master_port": 0, **(nodes or {})},
         "train": {"threads_per_rank": 1},
         "script": {"path": str(path), "args": list(args), "cwd": str(tmp_path),
                    "stop_grace_s": stop_grace_s, "env": {"TORCHDECK_STEP_EVERY_S": "0.2", **(env or {})}}}
    return cfgmod.from_dict(d)


_started: list = []


@pytest.fixture(autouse=True)
def _no_run_outlives_its_test():
    """A test that fails mid-run leaves no supervisor or rank behind (each run's session, killed)."""
    yield
    while _started:
        run = _started.pop()
        if run.final_status() is None or control.run_processes(run):
            control.kill(run)


def launch(tmp_path, cfg, root="runs") -> RunDir:
    run = control.start(cfg, tmp_path / root)
    _started.append(run)
    return run


def ended(run: RunDir, timeout=60) -> dict:
    return wait_for(run.final_status, timeout, f"{run.name} to end")


def kinds(run: RunDir, kind: str) -> list[dict]:
    return [e for e in read_all(run.events_path) if e.get("kind") == kind]


def pids_of(run: RunDir) -> list[int]:
    return [e["pid"] for e in kinds(run, "rank_ready")]


# ----------------------------------------------------------------------------- the environment


def test_rank_env_is_torchruns_contract(tmp_path):
    cfg = cfgmod.from_dict({"strategy": "script", "accelerator": "cpu", "devices": 2,
                            "nodes": {"num_nodes": 2, "node_rank": 1, "master_addr": "10.0.0.1", "master_port": 29400},
                            "script": {"path": "t.py", "env": {"FOO": "bar", "OMP_NUM_THREADS": "7"},
                                       "local_rank_arg": "--local_rank"}})
    plan = launch_env.plan_for(cfg, tmp_path / "20260101-000000-x", 2, 29400, 3, {"GLOO_SOCKET_IFNAME": "lo"})
    env = launch_env.rank_env(plan, 1, 17, base={"PATH": "/bin", "TORCHDECK_EVENTS_ID": "1:2",
                                                 "CUDA_VISIBLE_DEVICES": "5"})
    assert {k: env[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
                                "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
                                "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS")} == {
        "RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1",
        "ROLE_RANK": "3", "ROLE_WORLD_SIZE": "4", "ROLE_NAME": "default", "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29400", "TORCHELASTIC_RUN_ID": "20260101-000000-x", "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0"}
    assert env["OMP_NUM_THREADS"] == "7"  # the user's script.env wins over the plan's 3
    assert env["FOO"] == "bar" and env["GLOO_SOCKET_IFNAME"] == "lo" and env["PATH"] == "/bin"
    assert env["CUDA_VISIBLE_DEVICES"] == "5"  # cpu run: left as the supervisor has it
    assert env["TORCHDECK_EVENTS_FD"] == "17" and "TORCHDECK_EVENTS_ID" not in env
    rd = tmp_path / "20260101-000000-x"
    assert env["TORCHDECK_STACKS_FILE"] == str(rd / "rank3.stacks")
    assert env["TORCHDECK_RUN_DIR"] == str(rd)
    assert env["TORCHELASTIC_ERROR_FILE"] == str(rd / "rank3.error.json")
    assert env["TORCHDECK_LOCAL_RANK_ARG"] == "--local_rank"


def test_rank_env_picked_gpus_are_every_ranks_visible_devices(tmp_path):
    cfg = cfgmod.from_dict({"strategy": "script", "accelerator": "cuda", "devices": [2, 5],
                            "script": {"path": "t.py"}})
    plan = launch_env.plan_for(cfg, tmp_path, 2, 29500, 1)
    for local in (0, 1):
        env = launch_env.rank_env(plan, local, None, base={"CUDA_VISIBLE_DEVICES": "0", "TORCHDECK_EVENTS_FD": "9",
                                                            "TORCHDECK_LOCAL_RANK_ARG": "1"})
        assert env["CUDA_VISIBLE_DEVICES"] == "2,5" and env["LOCAL_RANK"] == str(local)
        assert "TORCHDECK_EVENTS_FD" not in env and "TORCHDECK_LOCAL_RANK_ARG" not in env  # no_python: no pipe


# ----------------------------------------------------------------------------- whole runs


def test_unchanged_ddp_script_finishes_with_both_ranks_watched(tmp_path):
    script = ddp_script(tmp_path)
    run = launch(tmp_path, script_cfg(tmp_path, script, args=["--its-args", "x"]))
    final = ended(run)
    assert final["status"] == "finished", (final, run.supervisor_log.read_text())
    assert final["exit_codes"] == [0, 0]
    started = kinds(run, "run_started")[0]
    assert started["run_kind"] == "script" and started.get("command") == ["python", str(script), "--its-args", "x"]
    ready = {e["rank"]: e for e in kinds(run, "rank_ready")}
    assert sorted(ready) == [0, 1] and all(isinstance(e["pid"], int) for e in ready.values())
    steps = kinds(run, "step")
    assert {e["rank"] for e in steps} == {0, 1}
    assert max(e["step"] for e in steps if e["rank"] == 1) == 16  # 2 epochs x 8 batches: the hook's count
    for r in (0, 1):
        log = run.rank_log(r).read_text()
        assert f"hello from rank {r} of 2 local {r} args ['--its-args', 'x']" in log
        assert f"rank {r} done after 16 steps" in log
    assert (tmp_path / "model.pt").exists()  # rank 0 saved in script.cwd
    assert [e["exitcode"] for e in kinds(run, "rank_exited")] == [0, 0]
    # init_process_group's wait is a start-up phase of its own, then the script's set-up; once the
    # script's body returned, "exiting" (the watchdog calls nothing slow after it)
    assert sorted((e["rank"], e["phase"]) for e in kinds(run, "phase")) == [
        (0, "exiting"), (0, "rendezvous"), (0, "script"), (1, "exiting"), (1, "rendezvous"), (1, "script")]


def test_exported_omp_num_threads_is_the_users(tmp_path):
    """torchrun keeps an exported OMP_NUM_THREADS; torchdeck set its own plan over it."""
    cfg = cfgmod.from_dict({"strategy": "script", "accelerator": "cpu", "devices": 2, "script": {"path": "t.py"}})
    plan = launch_env.plan_for(cfg, tmp_path, 2, 29500, 3)
    assert launch_env.rank_env(plan, 0, None, base={"OMP_NUM_THREADS": "5"})["OMP_NUM_THREADS"] == "5"
    assert launch_env.rank_env(plan, 0, None, base={})["OMP_NUM_THREADS"] == "3"
    assert launch_env.threads_of({}, {"OMP_NUM_THREADS": "5"}, 3) == 5
    assert launch_env.threads_of({"OMP_NUM_THREADS": "1"}, {"OMP_NUM_THREADS": "5"}, 3) == 1
    assert launch_env.threads_of({}, {}, 3) == 3


def test_ddp_script_with_torchdeck_log_sends_loss_and_samples(tmp_path):
    run = launch(tmp_path, script_cfg(tmp_path, ddp_script(tmp_path, log=True)))
    final = ended(run)
    assert final["status"] == "finished", (final, run.supervisor_log.read_text())
    logged = [e for e in kinds(run, "step") if e.get("loss") is not None]
    assert {e["rank"] for e in logged} == {0, 1}
    assert all(isinstance(e["loss"], float) for e in logged)
    rated = [e for e in logged if e.get("samples_per_s")]  # from the second call on: a rate needs two
    assert {e["rank"] for e in rated} == {0, 1} and all(e["samples_per_s"] > 0 for e in rated)


def line_of(path: Path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def test_rank_1_raising_fails_the_run_naming_rank_1_and_the_line(tmp_path):
    script = ddp_script(tmp_path, before="if rank == 1 and step == 3: raise ValueError('bad batch on rank 1')",
                        after="time.sleep(0.05)")
    run = launch(tmp_path, script_cfg(tmp_path, script))
    wait_for(lambda: len(pids_of(run)) == 2, 30, "both ranks ready")
    pids = pids_of(run)
    final = ended(run)
    assert final["status"] == "failed"
    at = line_of(script, "raise ValueError")
    cause = final["root_cause"]
    assert cause.startswith("rank 1 (") and "ValueError: bad batch on rank 1" in cause, cause
    assert f"{script}:{at} in main" in cause, cause
    assert final["exit_codes"][1] == 1 and final["exit_codes"][0] != 0
    assert_nothing_left(run, pids, 15)
    assert "ValueError: bad batch on rank 1" in run.rank_log(1).read_text()  # the traceback as python prints it


def test_a_hanging_rank_gets_the_watchdogs_stacks_on_its_own(tmp_path):
    # step 80 (a step >= 20 ms, a step event each 0.2 s): the 5 step windows the slow rule needs
    # are measured by then, so the watchdog dumps 2 s into the hang, not at the stale rule's 10 s
    script = ddp_script(tmp_path, before="if rank == 1 and step == 80: time.sleep(3600)  # hang here",
                        after="time.sleep(0.02)")
    script.write_text(script.read_text().replace("range(2)", "range(100)"))
    run = launch(tmp_path, script_cfg(tmp_path, script))
    try:
        ev = wait_for(lambda: kinds(run, "stacks"), 40, "the watchdog's stacks event")[0]
        at = line_of(script, "# hang here")
        mine = [g for g in ev["groups"] if 1 in g["ranks"]]
        assert mine and [str(script), at] in [f[:2] for f in mine[0]["frames"]], ev
        shown = subprocess.run(cli_cmd() + ["stacks", run.name], cwd=tmp_path, capture_output=True, text=True,
                               env=dict(os.environ, TORCHDECK_RUNS=str(tmp_path / "runs")), timeout=60)
        assert shown.returncode == 0, shown.stderr
        assert f"train.py:{at}" in shown.stdout and "rank 1" in shown.stdout, shown.stdout
    finally:
        pids = pids_of(run)
        control.request_stop(run)
        ended(run)
    assert_nothing_left(run, pids, 15)


SIGTERM_HANDLER = '''
import signal
def on_term(signum, frame):
    open(f"stopped-{rank}.txt", "w").write("checkpointed")
    raise SystemExit(0)
signal.signal(signal.SIGTERM, on_term)
'''


def test_stop_runs_the_scripts_sigterm_handler_and_the_run_is_stopped(tmp_path):
    script = ddp_script(tmp_path, after="time.sleep(0.05)")
    text = script.read_text().replace("range(2)", "range(1000)")
    script.write_text(text.replace("    step = 0\n", textwrap.indent(SIGTERM_HANDLER, "    ") + "    step = 0\n"))
    run = launch(tmp_path, script_cfg(tmp_path, script))
    wait_for(lambda: len(kinds(run, "step")) >= 4, 40, "steps")
    pids = pids_of(run)
    control.request_stop(run)
    final = ended(run, 30)
    assert final["status"] == "stopped", final
    assert final["exit_codes"] == [0, 0]
    assert (tmp_path / "stopped-0.txt").read_text() == "checkpointed" and (tmp_path / "stopped-1.txt").exists()
    assert_nothing_left(run, pids, 15)


SPAWNS = '''
import os, time, torch
import torch.multiprocessing as mp
import torchdeck

def child(i):
    open(f"child-{i}.pid", "w").write(str(os.getpid()))
    step = 0
    while True:
        step += 1
        torchdeck.log({"child": float(i)}, step=step)
        time.sleep(0.05)

if __name__ == "__main__":
    import subprocess, sys  # a helper that, unlike mp.spawn's children, does not die with its parent
    helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    open("helper.pid", "w").write(str(helper.pid))
    mp.spawn(child, nprocs=2)
'''


def test_a_script_that_spawns_its_own_processes_is_watched_and_stopped(tmp_path):
    script = tmp_path / "spawner.py"
    script.write_text(SPAWNS)
    run = launch(tmp_path, script_cfg(tmp_path, script, devices=1))
    wait_for(lambda: {e.get("metrics", {}).get("child") for e in kinds(run, "step")} >= {0.0, 1.0}, 60,
             "step events from both spawned children")
    children = [int((tmp_path / f"{name}.pid").read_text()) for name in ("child-0", "child-1", "helper")]
    pids = pids_of(run) + children
    control.request_stop(run)
    final = ended(run, 30)
    assert final["status"] == "stopped", final
    assert_nothing_left(run, pids, 15)


def test_two_loopback_nodes_both_finish(tmp_path, monkeypatch):
    import socket

    monkeypatch.setenv("TORCHDECK_NODE_SECRET", "both nodes' secret")  # node streaming (issue 31)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = ddp_script(tmp_path)
    runs = []
    for node in (0, 1):
        cfg = script_cfg(tmp_path, script, devices=1, name=f"node{node}",
                         nodes={"num_nodes": 2, "node_rank": node, "master_port": port})
        runs.append(launch(tmp_path, cfg, f"runs{node}"))
    for node, run in enumerate(runs):
        final = ended(run, 90)
        assert final["status"] == "finished", (node, final, run.supervisor_log.read_text())
        assert final["exit_codes"] == [0]
        assert [e["rank"] for e in kinds(run, "rank_ready") if e.get("node_rank", node) == node] == [node]
        assert f"hello from rank {node} of 2 local 0" in run.rank_log(node).read_text()
    # a script's ranks too: node 1's supervisor streamed its rank's events and its samples to node 0's
    assert [(e["rank"], e["node_rank"]) for e in kinds(runs[0], "rank_ready") if "node_rank" in e] == [(1, 1)]
    assert {e["node_rank"] for e in kinds(runs[0], "rank_exited") if "node_rank" in e} == {1}
    assert {e["node_rank"] for e in kinds(runs[0], "node_sample")} >= {1}


def test_a_scripts_hook_steps_keep_the_last_logged_loss_and_rate():
    """The step hook's events carry loss and samples_per_s null between torchdeck.log calls: the
    rank keeps what log() said last (our loop's step events always carry both)."""
    from torchdeck.engine import events
    from torchdeck.engine.runs.view import RunView

    view = RunView()
    view.feed(events.make("step", rank=0, step=5, steps_per_s=10.0, loss=0.5, samples_per_s=320.0, metrics={}))
    view.feed(events.make("step", rank=0, step=9, steps_per_s=10.0, loss=None, epoch=None))
    st = view.rank(0)
    assert (st.step, st.loss, st.samples_per_s) == (9, 0.5, 320.0)
    assert view.steps.points == [(5, 0.5)]  # a curve point per loss said, none repeated at the hook's steps


def test_the_watchdogs_stack_request_skips_a_rank_that_has_not_said_ready(tmp_path):
    """STACK_SIGNAL's default action terminates: a script's rank answers it only once its shim has
    installed the dump (then it says rank_ready). Seen under load: the watchdog's request reached
    both ranks of a torchdeck.log run before that, and they died of SIGUSR2."""
    import queue
    import signal
    from types import SimpleNamespace

    from torchdeck.engine.supervisor import EventWriter, Watchdog

    # a run directory is all the watchdog needs: no supervisor or rank started (they cost a run)
    run = RunDir.create(script_cfg(tmp_path, ddp_script(tmp_path), devices=1), tmp_path / "runs")
    writer = EventWriter(run.events_path, queue.Queue())  # not started: its view is what it was fed
    watchdog = Watchdog(run, writer.write, script=True)
    rank = subprocess.Popen(["sleep", "30"])  # a rank still starting: default action for SIGUSR2
    try:
        proc = SimpleNamespace(pid=rank.pid, is_alive=lambda: rank.poll() is None)
        assert watchdog.dump_stacks(SimpleNamespace(processes=[proc]), writer, "test", wait_s=0.5) == []
        time.sleep(0.2)
        assert rank.poll() is None, f"the rank died of {signal.Signals(-rank.returncode).name}"
    finally:
        rank.kill()
        rank.wait()
        writer.close()


def test_script_cwd_with_a_tilde_is_the_home_folder(tmp_path, monkeypatch):
    """preflight took `script.cwd: ~/proj` (it expands ~) but the ranks were started in a folder
    literally named '~/proj' (no such folder: the run failed at its start). The CLI resolves it; a
    preset run from the app does not."""
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "proj").mkdir()
    script = tmp_path / "proj" / "where.py"
    script.write_text("import os\nprint('cwd', os.getcwd())\n")
    cfg = script_cfg(tmp_path, script, devices=1)
    cfg.script.cwd = "~/proj"
    run = launch(tmp_path, cfg)
    final = ended(run)
    assert final["status"] == "finished", (final, run.supervisor_log.read_text())
    assert f"cwd {tmp_path / 'proj'}" in run.rank_log(0).read_text()
