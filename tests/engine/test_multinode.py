"""Several nodes on one machine (loopback): real `torchdeck run --node-rank K` processes, a real gloo
group across them, and what a user sees when the nodes cannot meet (issue 7)."""
from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from torchdeck.engine import config as cfgmod
from torchdeck.engine import events
from tests.engine.helpers import assert_same_weights, assert_trained, final_model, run_in_process, run_supervised, small_cfg

TORCHDECK = Path(sys.executable).with_name("torchdeck")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchdeck_cmd(*args) -> list[str]:
    return ([str(TORCHDECK)] if TORCHDECK.exists() else [sys.executable, "-m", "torchdeck.cli"]) + list(args)


def write_preset(path: Path, cfg: dict) -> Path:
    path.write_text(yaml.safe_dump(cfg))
    return path


def only_run_dir(root: Path) -> Path:
    (run,) = [p for p in root.iterdir() if p.is_dir()]
    return run


def our_descendants() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE}


def assert_nothing_left(run: Path, before: set[int], within_s: float = 15) -> None:
    """The CLI returns once the run is recorded; the supervisor's own teardown may take a moment."""
    from torchdeck.engine.runs import control

    deadline = time.monotonic() + within_s
    while (control.run_processes(run) or our_descendants() - before) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert control.run_processes(run) == []
    assert our_descendants() - before == set()


def test_global_rank_is_node_rank_times_nproc_per_node_plus_local_rank():
    """devices is the per-node process count (torchrun's --nproc-per-node); world = nodes x devices."""
    from torchdeck.engine.preflight import describe as summary_lines
    from torchdeck.engine.strategies import global_batch, nproc_per_node, world_size

    cfg = cfgmod.from_dict(small_cfg(strategy="ddp", devices=3,
                                     **{"nodes.num_nodes": 2, "nodes.node_rank": 1, "nodes.master_port": 29411}))
    assert nproc_per_node(cfg) == 3 and world_size(cfg) == 6
    assert global_batch(cfg) == 6 * cfg.train.batch_size
    assert "devices per rank: ranks 3-5: cpu" in summary_lines(cfg)  # identical ranks said once


@pytest.mark.slow
def test_two_node_supervisors_form_one_job_equal_to_one_process(tmp_path):
    """Node 0 and node 1 as two `torchdeck run PRESET --node-rank K`, 2 ranks each, over
    127.0.0.1: one world of 4 whose weights equal one process with the 4x batch. Each node writes
    its own run directory; node 0's also holds node 1's events and samples, streamed by node 1's
    supervisor (issue 31), and no rank_report (nothing gathers in the loop)."""
    cfg = small_cfg(strategy="ddp", devices=2, **{
        "train.batch_size": 8, "train.max_steps": 4, "train.report_every_s": 0.05,
        "nodes.num_nodes": 2, "nodes.master_addr": "127.0.0.1", "nodes.master_port": free_port(),
        "nodes.timeout_s": 60})
    preset = write_preset(tmp_path / "two-node.yaml", cfg)
    procs = []
    env = dict(os.environ, TORCHDECK_NODE_SECRET="the run's secret, on both nodes only")
    for k in (0, 1):
        procs.append(subprocess.Popen(
            torchdeck_cmd("run", str(preset), "--node-rank", str(k), "--runs-dir", str(tmp_path / f"node{k}")),
            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL,
            env=env))
    outs = [p.communicate(timeout=180)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs

    runs = [only_run_dir(tmp_path / f"node{k}") for k in (0, 1)]
    evs = [events.read_all(r / "events.jsonl") for r in runs]
    for k, (run, ev) in enumerate(zip(runs, evs)):
        assert cfgmod.load(run / "config.yaml").nodes.node_rank == k
        ev = [e for e in ev if e.get("node_rank", k) == k]  # node 0's file has node 1's too (below)
        ready = sorted((e["rank"], e["local_rank"]) for e in ev if e["kind"] == "rank_ready")
        assert ready == [(2 * k, 0), (2 * k + 1, 1)]  # global rank = node_rank x 2 + local_rank
        assert {e["rank"] for e in ev if e["kind"] == "step" and e["step"] == 4} == {2 * k, 2 * k + 1}
        started = next(e for e in ev if e["kind"] == "run_started")
        assert started["world_size"] == 4 and started["node_rank"] == k and started["num_nodes"] == 2
        assert json.loads((run / "status.json").read_text())["status"] == "finished"
    assert (runs[1] / "rank2.log").exists() and not (runs[1] / "rank0.log").exists()

    # node streaming (issue 31): node 1's supervisor sent its ranks' events and its samples to node
    # 0's, which wrote them into the one events.jsonl, tagged with node and host
    host = socket.gethostname()
    remote_steps = [e for e in evs[0] if e["kind"] == "step" and e["rank"] in (2, 3)]
    assert {e["rank"] for e in remote_steps if e["step"] == 4} == {2, 3}, [e["kind"] for e in evs[0]]
    assert all(e["node_rank"] == 1 and e["host"] == host for e in remote_steps)
    assert {(e["rank"], e.get("node_rank", 0)) for e in evs[0] if e["kind"] == "rank_exited"} == {(0, 0), (1, 0), (2, 1), (3, 1)}
    samples = [e for e in evs[0] if e["kind"] == "node_sample"]
    assert {e["node_rank"] for e in samples} == {0, 1}, samples
    for e in samples:
        assert e["host"] == host and isinstance(e["gpus"], list)
        assert set(e["host_stats"]) == {"cpu_percent", "per_cpu", "ram_used_mb", "ram_total_mb", "load1"}
        assert e["host_stats"]["ram_total_mb"] > 0
    assert [e["kind"] for e in evs[0]].count("run_started") == 1  # node 1's own stays in its directory
    port = cfg["nodes"]["master_port"] + 1  # node 0 listens only on the master address (not every interface)
    assert any(e["kind"] == "log" and e["message"].startswith(f"node link: listening on tcp://127.0.0.1:{port} ")
               for e in evs[0]), [e.get("message") for e in evs[0] if e["kind"] == "log"]
    assert not any(e["kind"] == "node_sample" and e["node_rank"] == 0 for e in evs[1])

    # no collective in the reporting path: nothing gathers; each rank's step events carry its figures
    assert not any(e["kind"] == "rank_report" for ev in evs for e in ev)
    last = {e["rank"]: e for e in evs[0] if e["kind"] == "step"}
    assert sorted(last) == [0, 1, 2, 3] and all(e["step"] == 4 for e in last.values())
    for e in last.values():
        assert e["samples_per_s"] > 0 and 0 <= e["data_wait"] <= 1 and 0 <= e["comm_wait"] <= 1
        assert e["peak_mem_mb"] >= e["device_mem_mb"] > 0  # the rank's peak RSS, not a sample
    # what `torchdeck run` printed on node 0 ends with every rank of the job, node 1's streamed
    final = [ln.split() for ln in outs[0].splitlines() if re.match(r"rank +\d+ .* ep \d+/\d+ ", ln)][-4:]  # not the balance line
    assert [ln[1] for ln in final] == ["0", "1", "2", "3"], outs[0]
    assert all("4/4" in ln for ln in final), outs[0]  # node 1's ranks from their own streamed events

    assert not (runs[1] / "checkpoints").exists()  # rank 0 (node 0) writes the checkpoints
    one = small_cfg(**{"train.batch_size": 32, "train.max_steps": 4})
    run_in_process(tmp_path / "one", one)
    a, b = final_model(runs[0]), final_model(tmp_path / "one")
    assert a["step"] == b["step"] == 4 and a["world_size"] == 4
    assert_same_weights(a["model"], b["model"])
    assert_trained(a["model"], one, tmp_path / "init")


@pytest.mark.slow
def test_stop_on_node_0_stops_every_node(tmp_path):
    """A stop asked on the main node reaches the other node's ranks through the stop agreement:
    both nodes end within the bound, rank 0 checkpoints, and nothing of either run is left. The
    ranks sleep 50 ms a step (usermodels:slow): they only wait for the stop, not at full speed."""
    from tests.engine.helpers import USER_MODELS

    (tmp_path / "usermodels.py").write_text(USER_MODELS)
    cfg = small_cfg(strategy="ddp", devices=1, **{
        "model.name": "usermodels:slow",
        "train.max_steps": 0, "train.epochs": 10 ** 6, "nodes.num_nodes": 2,
        "nodes.master_port": free_port(), "nodes.timeout_s": 60})
    preset = write_preset(tmp_path / "long.yaml", cfg)
    before = our_descendants()
    procs = [subprocess.Popen(
        torchdeck_cmd("run", str(preset), "--node-rank", str(k), "--runs-dir", str(tmp_path / f"node{k}")),
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL)
        for k in (0, 1)]
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            dirs = [list((tmp_path / f"node{k}").glob("*/events.jsonl")) for k in (0, 1)]
            if all(dirs) and all(any(e["kind"] == "step" for e in events.read_all(d[0])) for d in dirs):
                break
            time.sleep(0.2)
        else:
            pytest.fail("the two nodes did not start training")
        run0, run1 = (only_run_dir(tmp_path / f"node{k}") for k in (0, 1))
        (run0 / "stop").touch()
        t0 = time.monotonic()
        outs = [p.communicate(timeout=60)[0] for p in procs]
        assert time.monotonic() - t0 < 30
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0, 0], outs
    for run in (run0, run1):
        assert json.loads((run / "status.json").read_text())["status"] == "stopped"
    last1 = max(e["step"] for e in events.read_all(run1 / "events.jsonl") if e["kind"] == "step")
    (ckpt_ev,) = [e for e in events.read_all(run0 / "events.jsonl") if e["kind"] == "checkpoint"]
    assert ckpt_ev["step"] >= last1  # node 1 stopped at the step node 0 checkpointed
    assert_nothing_left(run0, before)
    assert_nothing_left(run1, before)


@pytest.mark.slow
def test_node_pointed_at_a_closed_port_fails_within_the_timeout(tmp_path):
    """No master listening: node 1 gives up after nodes.timeout_s with a message naming the
    address, the port and what to check; exit 1; nothing of the run is left."""
    port = free_port()  # closed: nothing listens on it
    cfg = small_cfg(strategy="ddp", devices=1, **{
        "nodes.num_nodes": 2, "nodes.master_addr": "127.0.0.1", "nodes.master_port": port,
        "nodes.timeout_s": 2})
    preset = write_preset(tmp_path / "lonely.yaml", cfg)
    before = our_descendants()
    t0 = time.monotonic()
    r = subprocess.run(torchdeck_cmd("run", str(preset), "--node-rank", "1", "--runs-dir", str(tmp_path / "runs")),
                       cwd=tmp_path, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    elapsed = time.monotonic() - t0
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    # 2 s of rendezvous (a short timeout takes the same path as a long one), plus starting Python
    # and importing torch in the supervisor and the rank on a loaded 2-core machine.
    assert elapsed < 2 + 30, elapsed
    run = only_run_dir(tmp_path / "runs")
    cause = json.loads((run / "status.json").read_text())["root_cause"]
    for text in (out, cause):
        assert f"127.0.0.1:{port}" in text and "RendezvousError" in text
        assert "nodes.timeout_s=2" in text and "node 0 started" in text and "firewall" in text
        assert "nodes.master_port" in text and "a collective timed out" not in text
    assert_nothing_left(run, before)


@pytest.mark.slow
def test_master_waiting_for_a_node_that_never_comes_fails_within_the_timeout(tmp_path):
    """Node 0 alone: its ranks stop waiting after nodes.timeout_s and say which nodes to check."""
    cfg = small_cfg(strategy="ddp", devices=1, **{
        "nodes.num_nodes": 2, "nodes.master_port": free_port(), "nodes.timeout_s": 2})
    run = tmp_path / "n0"
    t0 = time.monotonic()
    proc = run_supervised(run, cfg, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert time.monotonic() - t0 < 2 + 30
    cause = json.loads((run / "status.json").read_text())["root_cause"]
    assert "RendezvousError" in cause and "not all 2 ranks joined" in cause
    assert "are all 2 node(s) started" in cause and "nodes.master_addr (127.0.0.1)" in cause


@pytest.mark.slow
def test_ifname_reaches_gloo_and_a_missing_interface_is_named(tmp_path):
    """nodes.ifname becomes GLOO_SOCKET_IFNAME in the ranks: `lo` trains; an interface this host
    does not have stops before the rendezvous with its name and the ones that exist (each rank
    checks it: one rank shows it)."""
    ok = small_cfg(strategy="ddp", devices=2, **{"train.max_steps": 2, "nodes.master_port": 0, "nodes.ifname": "lo"})
    proc = run_supervised(tmp_path / "lo", ok)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    bad = dict(ok, devices=1, nodes={**ok["nodes"], "ifname": "nosuch0"})
    proc = run_supervised(tmp_path / "bad", bad)
    assert proc.returncode == 1
    cause = json.loads((tmp_path / "bad" / "status.json").read_text())["root_cause"]
    assert "nodes.ifname: no network interface 'nosuch0'" in cause and "lo" in cause.split("it has:")[1]


@pytest.mark.slow
def test_exported_torchrun_node_gives_up_at_the_timeout(tmp_path):
    """The exported torchrun line carries nodes.timeout_s (torchrun alone would wait 600 s):
    node 1 with no master ends within it, non-zero, naming the address and port."""
    port = free_port()
    cfg = small_cfg(strategy="ddp", devices=1, **{"nodes.num_nodes": 2, "nodes.master_port": port,
                                                  "nodes.timeout_s": 2})
    preset = write_preset(tmp_path / "lonely.yaml", cfg)
    r = subprocess.run(torchdeck_cmd("export", str(preset), "--torchrun", "--run-root", str(tmp_path / "tr")),
                       capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr
    (node1,) = [ln for ln in r.stdout.splitlines() if "--node-rank 1" in ln and not ln.startswith("#")]
    assert "--rdzv-conf timeout=2" in node1
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    t0 = time.monotonic()
    proc = subprocess.run(["bash", "-c", node1], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert time.monotonic() - t0 < 2 + 30
    assert f"127.0.0.1, {port}" in proc.stdout + proc.stderr or f"127.0.0.1:{port}" in proc.stdout + proc.stderr


def test_rank_reports_in_one_process_follow_report_every_s(tmp_path):
    """report_every_s > 0: reports from the first step to the last, with rates; 0: none at all.
    (Under torchrun, where no supervisor streams the ranks' events; the supervisor's ranks never
    gather: test_two_node_supervisors_form_one_job_equal_to_one_process.)"""
    base = {"train.max_steps": 6, "train.log_every_n_steps": 1}
    evs = run_in_process(tmp_path / "on", small_cfg(**base, **{"train.report_every_s": 1e-6}))
    reports = [e for e in evs if e["kind"] == "rank_report"]
    steps = [e["reports"][0]["step"] for e in reports]
    assert steps[0] == 1 and steps[-1] == 6 and steps == sorted(steps) and len(steps) >= 2
    for e in reports:
        (row,) = e["reports"]
        assert set(row) == {"rank", "host", "node_rank", "epoch", "step", "samples_per_s", "data_wait",
                            "device_mem_mb", "t", "peak_mem_mb", "comm_wait"}
        assert row["comm_wait"] is None  # one process: no all-reduce to wait in
        assert row["rank"] == 0 and row["node_rank"] == 0 and row["samples_per_s"] > 0
        assert abs(row["t"] - e["t"]) < 5
    off = run_in_process(tmp_path / "off", small_cfg(**base, **{"train.report_every_s": 0}))
    assert not any(e["kind"] == "rank_report" for e in off)
    for e in (e for e in off if e["kind"] == "step"):  # the step events carry them either way (issue 31)
        assert e["peak_mem_mb"] >= e["device_mem_mb"] > 0 and 0 <= e["data_wait"] <= 1 and e["comm_wait"] is None


def test_rendezvous_message_for_other_hosts_points_at_master_addr(monkeypatch):
    """Which advice a failed rendezvous gives depends on where it failed (message text only)."""
    import torch.distributed as dist

    from torchdeck.engine.worker import rendezvous_message

    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.delenv("MASTER_PORT", raising=False)
    cfg = cfgmod.from_dict(small_cfg(strategy="ddp", devices=2, **{
        "nodes.num_nodes": 3, "nodes.node_rank": 2, "nodes.master_addr": "10.0.0.5", "nodes.master_port": 29400}))
    net = rendezvous_message(cfg, 4, 6, dist.DistNetworkError("timed out"))
    assert net.startswith("rank 4 (node 2 of 3) could not reach the master at 10.0.0.5:29400")
    assert "is this host itself" not in net
    cfg.nodes.node_rank = 0
    store = rendezvous_message(cfg, 0, 6, dist.DistStoreError("wait timeout"))
    assert "not all 6 ranks joined" in store and "node ranks 0..2" in store
    assert "set nodes.ifname" in store
    cfg.nodes.master_addr = "127.0.0.1"
    assert "127.0.0.1 is this host itself" in rendezvous_message(cfg, 0, 6, dist.DistStoreError("x"))


def test_report_every_s_must_not_be_negative():
    with pytest.raises(cfgmod.ConfigError, match="train.report_every_s"):
        cfgmod.from_dict(small_cfg(**{"train.report_every_s": -1}))


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_torchrun_run_dir_is_running_while_torchrun_lives_and_kill_ends_it(tmp_path):
    """Under torchrun there is no supervisor: local rank 0 records torchrun's agent in
    launcher.pid, so `torchdeck runs`, the Runs list and the Monitor see the run as running (not
    'starting'), and kill takes down the agent and its workers and records the run as failed."""
    from torchdeck.engine.runs import control
    from torchdeck.engine.rundir.layout import RunDir

    cfg = small_cfg(strategy="ddp", devices=2, **{"train.epochs": 10_000, "train.max_steps": 0})
    preset = write_preset(tmp_path / "long.yaml", cfg)
    torchrun = Path(sys.executable).with_name("torchrun")
    before = our_descendants()
    agent = subprocess.Popen([str(torchrun), "--standalone", "--nnodes", "1", "--nproc-per-node", "2",
                              "-m", "torchdeck.engine.worker", str(preset), "--run-dir", str(tmp_path / "tr")],
                             cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    rd = RunDir(tmp_path / "tr")
    try:
        def training():
            return rd.events_path.exists() and any(e["kind"] == "step" for e in events.read_all(rd.events_path))

        deadline = time.monotonic() + 90
        while not training() and time.monotonic() < deadline:
            assert agent.poll() is None, "torchrun ended early"
            time.sleep(0.3)
        assert rd.launcher_pid() == agent.pid and rd.supervisor_pid() is None
        assert rd.status() == "running"
        procs = control.run_processes(rd)
        assert procs[0].pid == agent.pid and len(procs) >= 3  # the agent and its two workers
        killed = control.kill(rd)
        assert agent.pid in killed
        agent.wait(15)
    finally:
        if agent.poll() is None:
            agent.kill()
    assert rd.final_status()["status"] == "stopped" and rd.status() == "stopped"  # killed by the user
    assert rd.final_status()["killed"] is True
    deadline = time.monotonic() + 15
    while our_descendants() - before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert our_descendants() - before == set()
