"""Submitting and following from the login node, on the real local two-node cluster: SLURM's own
commands through engine/slurm/cluster.py, the checks before a submission, and the CLI's
`run --slurm`, `launch --slurm`, `attach`, `runs` and `stop` of a SLURM run."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from torchdeck.engine.slurm import cluster
from torchdeck.engine.slurm.cluster import SlurmError


def wait_for(cond, timeout: float = 120.0, interval: float = 0.3, what: str = "the condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


def test_a_held_job_is_pending_then_running_then_over(jobs, tmp_path):
    job = cluster.sbatch(_wrap(tmp_path, "sleep 60"), cwd=tmp_path, extra=["--hold"])
    jobs.append(job)
    st = cluster.job_state(job)
    assert (st.state, st.reason) == ("PENDING", "JobHeldUser"), st
    assert st.active and st.pending
    cluster.release(job)
    st = wait_for(lambda: (s := cluster.job_state(job)) and s.state == "RUNNING" and s, what="RUNNING")
    assert st.nodes in ("n1", "n2") and st.num_nodes == 1, st
    cluster.cancel(job)
    st = wait_for(lambda: (s := cluster.job_state(job)) and not s.active and s, what="the job's end")
    assert st.state == "CANCELLED", st  # out of squeue: scontrol show job's word


def test_a_job_that_ends_is_known_by_its_state_and_exit_code(jobs, tmp_path):
    job = cluster.sbatch(_wrap(tmp_path, "exit 3"), cwd=tmp_path)
    jobs.append(job)
    st = wait_for(lambda: (s := cluster.job_state(job)) and not s.active and s, what="the job's end")
    assert (st.state, st.exit_code) == ("FAILED", "3:0"), st
    assert cluster.job_state("99999999") is None


def test_partitions_are_what_sinfo_lists(slurm_cluster):
    parts = cluster.partitions()
    assert [(p.name, p.nodes, p.state, p.default) for p in parts] == [("debug", 2, "up", True)]


def test_sbatch_refusals_carry_slurms_own_message(jobs, tmp_path):
    with pytest.raises(SlurmError) as err:
        jobs.append(cluster.sbatch(_wrap(tmp_path, "true"), cwd=tmp_path, extra=["--mem=999999999"]))
    assert "Memory specification can not be satisfied" in err.value.message, err.value.message
    with pytest.raises(SlurmError) as err:
        jobs.append(cluster.sbatch(_wrap(tmp_path, "true"), cwd=tmp_path, extra=["--partition=nope"]))
    assert "invalid partition specified: nope" in err.value.message, err.value.message


def test_no_sbatch_on_path_says_where_to_run(slurm_cluster, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # a PATH without SLURM: a laptop, not the login node
    assert "sbatch is not on PATH" in cluster.available()
    with pytest.raises(SlurmError, match="sbatch is not on PATH"):
        cluster.sbatch(_wrap(tmp_path, "true"))


def test_a_slurm_that_does_not_answer_is_not_a_job_that_ended(slurm_cluster, tmp_path, monkeypatch):
    """slurmctld unreachable (restarting, a wrong SLURM_CONF): the run stays live and nothing is
    recorded; a job SLURM says it does not know is over: lost."""
    from torchdeck.engine import preflight
    from torchdeck.engine.rundir.layout import RunDir

    (tmp_path / "tiny2.yaml").write_text(TINY2)
    cfg, _ = preflight.load_config(str(tmp_path / "tiny2.yaml"))
    run = RunDir.create(cfg, tmp_path / "runs")
    (run.path / "slurm.json").write_text(json.dumps({"job_id": "99999999", "submitted": 0, "script": "job.sbatch",
                                                     "output": str(run.path / "slurm-99999999.out")}))
    old = time.time() - 600  # submitted long ago, quiet since
    os.utime(run.config_path, (old, old))
    away = tmp_path / "away.conf"  # the same cluster, a port nobody listens on; MessageTimeout=1: squeue
    # says 'Unable to contact slurm controller' at once instead of after 18 s of retries (the default 10)
    away.write_text(Path(slurm_cluster).read_text().replace("SlurmctldPort=6917", "SlurmctldPort=6999")
                    + "MessageTimeout=1\n")
    monkeypatch.setenv("SLURM_CONF", str(away))
    assert run.status().live and run.final_status() is None
    monkeypatch.setenv("SLURM_CONF", slurm_cluster)
    time.sleep(0.6)  # past RunDir's half-second memory of the job's state
    assert str(run.status()) == "lost"


# ----------------------------------------------------------------------------- the CLI

TORCHDECK = Path(sys.executable).with_name("torchdeck")
# Two DDP ranks per node over gloo, one thread each: 2 CPUs of a node's 4, so that two nodes run it
TINY2 = """\
name: tiny2
strategy: ddp
accelerator: cpu
devices: 2
backend: gloo
model: {name: mlp, hidden: 32}
data: {dataset: synthetic, train_size: 512, val_size: 64, image_size: 16, num_workers: 0}
train: {batch_size: 16, epochs: 1, log_every_n_steps: 1, threads_per_rank: 1}
"""
SCRIPT = """\
import socket
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.ones(1) * dist.get_rank()
dist.all_reduce(t)
print(f"rank {dist.get_rank()} of {dist.get_world_size()} on {socket.gethostname()}: sum {t.item():g}", flush=True)
dist.destroy_process_group()
"""
RUN_S = 600  # a two-node job on a loaded 2-core machine, behind other tests' jobs: minutes


def torchdeck(*args, cwd, env=None, timeout=RUN_S):
    cmd = [str(TORCHDECK)] if TORCHDECK.exists() else [sys.executable, "-m", "torchdeck.cli"]
    return subprocess.run(cmd + list(args), cwd=cwd, env=dict(os.environ, TORCHDECK_RUNS=str(Path(cwd) / "runs"),
                                                              **(env or {})),
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def popen(*args, cwd):
    """torchdeck ARGS in the background; its output lines come through `proc.lines` (a reader thread:
    a read that blocks cannot miss a deadline)."""
    import queue
    import threading

    cmd = [str(TORCHDECK)] if TORCHDECK.exists() else [sys.executable, "-m", "torchdeck.cli"]
    proc = subprocess.Popen(cmd + list(args), cwd=cwd, env=dict(os.environ, TORCHDECK_RUNS=str(Path(cwd) / "runs")),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL)
    proc.lines = queue.Queue()

    def pump():
        for line in proc.stdout:
            proc.lines.put(line)
        proc.lines.put(None)
    threading.Thread(target=pump, daemon=True).start()
    return proc


@pytest.fixture
def runs(slurm_cluster, tmp_path):
    """The test's folder (the shared filesystem: the nodes are this machine) with tiny2.yaml; every
    job submitted from it is cancelled at the end."""
    (tmp_path / "tiny2.yaml").write_text(TINY2)
    yield tmp_path
    for f in (tmp_path / "runs").glob("*/slurm.json"):
        subprocess.run(["scancel", json.loads(f.read_text())["job_id"]], capture_output=True, timeout=30)


def the_run(folder) -> Path:
    found = sorted((Path(folder) / "runs").glob("*/slurm.json"))
    assert len(found) == 1, found
    return found[0].parent


def events_of(run_dir: Path) -> list[dict]:
    return [json.loads(ln) for ln in (run_dir / "events.jsonl").read_text().splitlines() if ln.strip()]


def one_line(out) -> str:
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1, (out.returncode, out.stdout, out.stderr)
    return lines[0]


def test_bad_input_is_one_line_and_exit_2_before_anything_is_submitted(runs, tmp_path):
    ws = os.environ["PATH"]
    no_slurm = ":".join(d for d in ws.split(":") if not (Path(d) / "sbatch").exists())
    line = one_line(torchdeck("run", "tiny2.yaml", "--slurm", cwd=runs, env={"PATH": no_slurm}))
    assert "sbatch is not on PATH" in line, line
    line = one_line(torchdeck("run", "tiny2.yaml", "--slurm", "--partition", "nope", cwd=runs))
    assert "no partition 'nope'" in line and "debug" in line, line
    line = one_line(torchdeck("run", "tiny2.yaml", "--slurm", "--nodes", "3", cwd=runs))
    assert "3 nodes, but partition debug has 2" in line, line
    (runs / "train.py").write_text(SCRIPT)
    line = one_line(torchdeck("launch", "--slurm", "--nodes", "3", "train.py", cwd=runs))
    assert "3 nodes, but partition debug has 2" in line, line
    line = one_line(torchdeck("run", "tiny2.yaml", "--partition", "debug", cwd=runs))  # a SLURM flag, no --slurm
    assert "--partition" in line and "--slurm" in line, line
    assert not (runs / "runs").exists() or not any((runs / "runs").iterdir())
    line = one_line(torchdeck("run", "tiny2.yaml", "--slurm", "--sbatch-arg=--mem=999999999", cwd=runs))
    assert line.startswith("SLURM refused the job: ") and "Memory specification can not be satisfied" in line, line
    assert not any((runs / "runs").iterdir()), "a refused job leaves no run directory"


def test_a_job_that_fails_before_torchdeck_starts_says_its_output(runs):
    """The job's python has no torchdeck (TORCHDECK_PYTHON names the base python, isolated from the
    environment's PYTHONPATH): its output file's last lines say so."""
    bare = runs / "bare-python"
    bare.write_text(f"#!/bin/sh\nexec {Path(sys.base_prefix) / 'bin' / 'python3'} -I \"$@\"\n")
    bare.chmod(0o755)
    out = torchdeck("run", "tiny2.yaml", "--slurm", cwd=runs, env={"TORCHDECK_PYTHON": str(bare)})
    assert out.returncode == 1, (out.stdout, out.stderr)
    assert "No module named" in out.stdout and "slurm-" in out.stdout, out.stdout
    assert json.loads((the_run(runs) / "status.json").read_text())["status"] == "failed"


def test_run_slurm_on_two_nodes_gathers_node_1s_ranks_on_node_0(runs):
    out = torchdeck("run", "tiny2.yaml", "--slurm", "--nodes", "2", cwd=runs)
    assert out.returncode == 0, (out.stdout[-3000:], out.stderr)
    assert "submitted SLURM job" in out.stdout and "RUNNING on n[1-2]" in out.stdout, out.stdout
    assert "SLURM job" in out.stdout.splitlines()[-1] and "COMPLETED" in out.stdout.splitlines()[-1], out.stdout
    run = the_run(runs)
    evs = events_of(run)
    assert {e["rank"] for e in evs if e["kind"] == "rank_exited"} == {0, 1, 2, 3}, "node 1's ranks 2 and 3 too"
    assert json.loads((run / "status.json").read_text())["status"] == "finished"
    assert "#SBATCH --nodes=2" in (run / "job.sbatch").read_text()


def test_launch_slurm_runs_a_users_script_on_two_nodes(runs):
    (runs / "train.py").write_text(SCRIPT)
    out = torchdeck("launch", "--slurm", "--nodes", "2", "--nproc-per-node", "1", "train.py", cwd=runs)
    assert out.returncode == 0, (out.stdout[-3000:], out.stderr)
    assert "rank 0 of 2 on n1: sum 1" in out.stdout, out.stdout  # rank 0's own output, as torchrun prints it
    run = the_run(runs)
    assert {e["rank"] for e in events_of(run) if e["kind"] == "rank_exited"} == {0, 1}
    assert "rank 1 of 2 on n2: sum 1" in (run / "node1" / "rank1.log").read_text()


def read_until(proc, text: str, seen: list[str], timeout: float = RUN_S) -> None:
    """proc's output lines until one holds `text`; AssertionError with what was seen at the deadline."""
    import queue

    deadline = time.monotonic() + timeout
    while True:
        try:
            line = proc.lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise AssertionError(f"no {text!r} in {timeout:g} s: {''.join(seen)[-3000:]}") from None
        if line is None:
            raise AssertionError(f"output ended before {text!r}: {''.join(seen)[-3000:]}")
        seen.append(line)
        if text in line:
            return


def test_attach_shows_pending_then_running_then_finished(runs):
    out = torchdeck("run", "tiny2.yaml", "--slurm", "--nodes", "2", "--detach", "--sbatch-arg=--hold", cwd=runs)
    assert out.returncode == 0 and "torchdeck attach" in out.stdout, (out.stdout, out.stderr)
    run = the_run(runs)
    job = json.loads((run / "slurm.json").read_text())["job_id"]
    listed = torchdeck("runs", cwd=runs, timeout=120)
    assert "pending (JobHeldUser)" in listed.stdout, listed.stdout
    attach, seen = popen("attach", str(run), cwd=runs), []
    try:
        read_until(attach, f"SLURM job {job}: PENDING (JobHeldUser)", seen)
        subprocess.run(["scontrol", "release", job], check=True, timeout=30)
        read_until(attach, f"SLURM job {job}: RUNNING", seen)
        read_until(attach, "FINISHED", seen)
        read_until(attach, f"SLURM job {job}: COMPLETED", seen)
        assert attach.wait(timeout=60) == 0, "".join(seen)
    finally:
        attach.kill()
    listed = torchdeck("runs", cwd=runs, timeout=120)
    assert "finished" in listed.stdout, listed.stdout


def test_ctrl_c_on_a_waiting_job_cancels_it(runs):
    """Nothing of it runs yet, so there is nothing to checkpoint: the first Ctrl-C cancels the job."""
    import signal

    proc, seen = popen("run", "tiny2.yaml", "--slurm", "--sbatch-arg=--hold", cwd=runs), []
    try:
        read_until(proc, "PENDING (JobHeldUser)", seen, timeout=120)
        proc.send_signal(signal.SIGINT)
        read_until(proc, "cancelled SLURM job", seen, timeout=120)
        assert proc.wait(timeout=120) == 130, "".join(seen)
    finally:
        proc.kill()
    run = the_run(runs)
    job = json.loads((run / "slurm.json").read_text())["job_id"]
    assert cluster.job_state(job).state == "CANCELLED"
    assert json.loads((run / "status.json").read_text())["killed"] is True


def test_stop_ends_a_slurm_run_stopped_with_a_checkpoint(runs):
    """The ranks' steps sleep 50 ms (usermodels:slow): a run that only waits for its stop need not
    spend the CPU of four ranks training flat out until it comes."""
    from tests.engine.helpers import USER_MODELS

    (runs / "usermodels.py").write_text(USER_MODELS)
    out = torchdeck("run", "tiny2.yaml", "--slurm", "--nodes", "2", "--detach", "--set", "train.epochs=500",
                    "--set", "model.name=usermodels:slow",
                    "--set", "checkpoint.every_epoch=false", cwd=runs)  # the one checkpoint: the stop's
    assert out.returncode == 0, (out.stdout, out.stderr)
    run = the_run(runs)
    wait_for(lambda: (run / "events.jsonl").exists() and any(e["kind"] == "step" for e in events_of(run)),
             timeout=RUN_S, what="its first step")
    out = torchdeck("stop", str(run), cwd=runs)
    assert out.returncode == 0 and "run stopped" in out.stdout, (out.stdout, out.stderr)
    final = json.loads((run / "status.json").read_text())
    assert final["status"] == "stopped" and not final.get("killed"), final
    assert list((run / "checkpoints").glob("ckpt-*.pt")), "the stop checkpointed"


def _wrap(folder, command: str) -> str:
    path = folder / "job.sh"
    path.write_text(f"#!/bin/bash\n#SBATCH --output={folder}/out-%j.txt\n{command}\n")
    return str(path)
