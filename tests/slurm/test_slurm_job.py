"""The SLURM job itself on the local two-node cluster (tests/slurm/cluster.sh): a run directory made as
submission makes it, its batch script (engine/slurm/script.py) given to `sbatch --parsable` as is.
One supervisor per node: node 0 (n1) writes the run directory and hears node 1 (n2) over the node
link; node 1 writes RUN_DIR/node1. Every job a test submits is cancelled at its end."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from torchdeck.engine import config as cfgmod
from torchdeck.engine import events
from torchdeck.engine.rundir.layout import RunDir
from torchdeck.engine.slurm.script import batch_script
from tests.engine.helpers import assert_same_weights, final_model, run_in_process, small_cfg

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
JOB_S = 360  # a job's bound, queued to ended, on 2 cores the whole suite shares

TWO_NODES = {"strategy": "ddp", "devices": 1, "nodes.num_nodes": 2, "data.num_workers": 0,
             "train.batch_size": 16, "train.max_steps": 4}

RANK_SCRIPT = '''
import socket
import torch
import torch.distributed as dist
import torchdeck

dist.init_process_group("gloo")
for step in range(1, 4):
    t = torch.ones(1) * (dist.get_rank() + 1)
    dist.all_reduce(t)
    torchdeck.log({"loss": t.item()}, step=step)
print(f"rank {dist.get_rank()} of {dist.get_world_size()} on {socket.gethostname()}: sum {t.item():g}", flush=True)
dist.destroy_process_group()
'''

FAILING_MODEL = '''
import os
from torchdeck.engine.models import mlp


def boom(info, at=3, rank="1"):
    """Raises in the forward of its `at`-th training step on one rank (node 1's)."""
    net = mlp(info, 32)
    calls = [0]

    def hook(mod, args):
        if mod.training:
            calls[0] += 1
            if calls[0] == at and os.environ.get("RANK") == rank:
                raise RuntimeError(f"boom on rank {rank}")
    net.register_forward_pre_hook(hook)
    return net
'''


def submit(cfg: dict, tmp_path: Path, jobs: list) -> tuple[RunDir, str]:
    """The run directory as submission makes it (config.yaml, origin.json, job.sbatch), then sbatch."""
    config = cfgmod.from_dict(cfg)
    assert cfgmod.validate(config) == []
    rd = RunDir.create(config, tmp_path / "my runs", {"cwd": str(tmp_path)})  # a space: quoted everywhere
    script = rd.path / "job.sbatch"
    script.write_text(batch_script(config, str(rd.path)))
    r = subprocess.run(["sbatch", "--parsable", str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    job = r.stdout.strip().split(";")[0]
    jobs.append(job)
    return rd, job


def what_happened(rd: RunDir, job: str) -> str:
    """The job's output and every node's supervisor.log, for a failing assertion."""
    out = []
    for p in [rd.path / f"slurm-{job}.out", *sorted(rd.path.glob("**/supervisor.log")), *sorted(rd.path.glob("**/rank*.log"))]:
        try:
            out.append(f"--- {p}\n{p.read_text()[-2000:]}")
        except OSError:
            pass
    return "\n".join(out)


def wait_ended(rd: RunDir, job: str) -> dict:
    """Until SLURM no longer lists the job; node 0's final status."""
    deadline = time.monotonic() + JOB_S
    while time.monotonic() < deadline:
        r = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True, timeout=60)
        if not r.stdout.strip():
            break
        time.sleep(0.5)
    else:
        pytest.fail(f"job {job} still queued or running after {JOB_S} s\n{what_happened(rd, job)}")
    final = rd.final_status()
    assert final is not None, what_happened(rd, job)
    return final


def node_events(rd: RunDir, node: int) -> list[dict]:
    """node 0's events that came from `node` (node 0's own carry no node_rank, or 0)."""
    return [e for e in events.read_all(rd.events_path) if (e.get("node_rank") or 0) == node]


def test_a_user_script_runs_one_supervisor_per_node(tmp_path, jobs):
    (tmp_path / "train.py").write_text(RANK_SCRIPT)
    cfg = {"name": "sj-script", "strategy": "script", "devices": 1, "nodes": {"num_nodes": 2},
           "script": {"path": "train.py", "cwd": str(tmp_path)}}
    rd, job = submit(cfg, tmp_path, jobs)
    final = wait_ended(rd, job)
    assert final["status"] == "finished", what_happened(rd, job)
    theirs = node_events(rd, 1)
    steps = [e["step"] for e in theirs if e["kind"] == "step" and e["rank"] == 1]  # (step events come at most so often)
    assert steps and steps[-1] == 3, what_happened(rd, job)
    assert any(e["kind"] == "node_sample" and e.get("host") == "n2" for e in theirs)
    said = (rd.path / "node1" / "rank1.log").read_text()
    assert "rank 1 of 2 on n2: sum 3" in said, said


def test_a_rank_raising_on_node_1_is_node_0s_root_cause(tmp_path, jobs):
    (tmp_path / "slurmfail.py").write_text(FAILING_MODEL)
    rd, job = submit(small_cfg(name="sj-fail", **{**TWO_NODES, "model.name": "slurmfail:boom", "train.max_steps": 8}),
                     tmp_path, jobs)
    final = wait_ended(rd, job)
    assert final["status"] == "failed", what_happened(rd, job)
    cause = final["root_cause"]
    assert cause.startswith("rank 1 (n2): RuntimeError: boom on rank 1"), what_happened(rd, job)


@pytest.mark.parametrize("run_dir", [None, "/shared/my runs/20260101-000000-x"])
def test_the_batch_script_passes_bash_n(tmp_path, run_dir):
    """Without the cluster: the submitted script (a run directory given) and the exported one."""
    for cfg in (small_cfg(**TWO_NODES), {"strategy": "script", "script": {"path": "t.py"}, "nodes": {"num_nodes": 2}}):
        script = tmp_path / "job.sbatch"
        script.write_text(batch_script(cfgmod.from_dict(cfg), run_dir))
        r = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
    assert sys.executable in script.read_text()  # the nodes use the python that made it (TORCHDECK_PYTHON overrides)


def test_usr1_before_the_time_limit_checkpoints_requeues_and_resumes_to_the_same_weights(tmp_path, jobs):
    """What --signal=B:USR1@120 does: USR1 to the batch shell only, which passes it to every node's
    supervisor; they checkpoint and end 'preempted', the job requeues itself (SLURM_RESTART_COUNT 1)
    and continues the same run directory from that checkpoint, to the weights of a run never stopped."""
    steps = 400
    cfg = small_cfg(name="sj-requeue", **{**TWO_NODES, "train.max_steps": steps, "train.epochs": 100,
                                          "train.log_every_n_steps": 1})
    rd, job = submit(cfg, tmp_path, jobs)
    deadline = time.monotonic() + JOB_S
    while not any(e["kind"] == "step" and e["step"] >= 3 for e in events.read_all(rd.events_path)):
        assert time.monotonic() < deadline and rd.final_status() is None, what_happened(rd, job)
        time.sleep(0.2)
    r = subprocess.run(["scancel", "--signal=USR1", "--batch", job], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    final = wait_ended(rd, job)
    assert final["status"] == "finished", what_happened(rd, job)
    first = json.loads((rd.path / "status.attempt0.json").read_text())
    assert first["status"] == "preempted", what_happened(rd, job)
    assert json.loads((rd.path / "node1" / "status.attempt0.json").read_text())["status"] == "preempted"
    evs = events.read_all(rd.events_path)
    requeued = next(i for i, e in enumerate(evs) if f"SLURM requeued job {job} (restart 1)" in e.get("message", ""))
    saved = [e["step"] for e in evs[:requeued] if e["kind"] == "checkpoint"]
    assert saved and 3 <= saved[-1] < steps, saved  # stopped early, after a checkpoint
    first_step = min(e["step"] for e in evs[requeued:] if e["kind"] == "step" and e.get("rank") == 0)
    assert first_step == saved[-1] + 1  # resumed, not started over
    run_in_process(tmp_path / "one", small_cfg(**{"train.batch_size": 32, "train.max_steps": steps,
                                                  "train.epochs": 100}))
    assert_same_weights(final_model(rd.path)["model"], final_model(tmp_path / "one")["model"])


def test_the_slurm_section_takes_time_limits_as_sbatch_does():
    """YAML reads `time: 4:00:00` unquoted as 14400 (base 60): sbatch would read that as 10 days of
    minutes. --set (and the CLI's --time) keeps the text given; a preset is told to quote it."""
    cfg, problems = cfgmod.build(cfgmod.apply_overrides({}, ["slurm.time=4:00:00", "slurm.partition=gpu"]))
    assert problems == [] and cfg.slurm.time == "4:00:00"
    assert "#SBATCH --time=4:00:00\n" in batch_script(cfg) and "#SBATCH --partition=gpu\n" in batch_script(cfg)
    assert cfgmod.loads(cfgmod.dumps(cfg)).slurm.time == "4:00:00"  # run directories and exports keep it
    _, problems = cfgmod.build(yaml.safe_load("slurm: {time: 4:00:00}"))
    assert problems == [("slurm.time", 'write the time limit in quotes, e.g. time: "4:00:00" (YAML reads H:MM:SS '
                                       'unquoted as a number of seconds, here 14400; minutes too: "60")')]
    cfg, _ = cfgmod.build({"slurm": {"time": "soon", "sbatch_args": "--mem=1G oops"}})
    assert [f for f, _ in cfgmod.validate(cfg)] == ["slurm.time", "slurm.sbatch_args[1]"]


def test_the_exported_script_runs_unchanged_one_supervisor_per_node_and_node_0_gathers_both(tmp_path, jobs):
    """`torchdeck export --sbatch` > job.sbatch; sbatch job.sbatch: the job makes its own run directory
    under the submit folder's runs/ (no TORCHDECK_RUNS), named by the job id, and runs as submitted ones do:
    one supervisor per node, each on its own node, node 0 gathering node 1's steps, samples and exits,
    and the weights of one process. (A submitted preset's job script is the same batch_script; the
    submitted runs below, failing, requeued and lost, run through it too.)"""
    import os

    (tmp_path / "job.yaml").write_text(yaml.safe_dump(small_cfg(name="sj-export", **TWO_NODES)))
    env = {k: v for k, v in os.environ.items() if k != "TORCHDECK_RUNS"}
    r = subprocess.run([sys.executable, "-m", "torchdeck.cli.main", "export", "job.yaml", "--sbatch"], cwd=tmp_path,
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    (tmp_path / "job.sbatch").write_text(r.stdout)
    r = subprocess.run(["sbatch", "--parsable", "job.sbatch"], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    job = r.stdout.strip().split(";")[0]
    jobs.append(job)
    deadline = time.monotonic() + JOB_S
    while subprocess.run(["squeue", "-h", "-j", job], capture_output=True, text=True, timeout=60).stdout.strip():
        assert time.monotonic() < deadline, f"job {job} still queued or running"
        time.sleep(0.5)
    out = (tmp_path / f"sj-export-{job}.out").read_text()
    (made,) = (tmp_path / "runs").iterdir()
    assert made.name.endswith(f"-sj-export-job{job}"), made
    rd = RunDir(made)
    assert (rd.final_status() or {}).get("status") == "finished", out + what_happened(rd, job)
    node1 = RunDir(made / "node1")
    assert node1.final_status()["status"] == "finished"
    starts = {e["node_rank"]: e["host"] for d in (rd, node1) for e in events.read_all(d.events_path)
              if e["kind"] == "run_started"}
    assert starts == {0: "n1", 1: "n2"}, starts  # one supervisor per node, each on its own node
    theirs = node_events(rd, 1)
    assert {e["rank"] for e in theirs if e["kind"] == "step"} == {1}, what_happened(rd, job)
    assert any(e["kind"] == "node_sample" and e.get("host") == "n2" for e in theirs)
    assert any(e["kind"] == "rank_exited" and e["rank"] == 1 for e in theirs)
    assert json.loads(rd.origin_path.read_text())["cwd"] == str(tmp_path)  # the submit folder
    run_in_process(tmp_path / "one", small_cfg(**{"train.batch_size": 32, "train.max_steps": 4}))
    assert_same_weights(final_model(made)["model"], final_model(tmp_path / "one")["model"])


def test_a_node_that_cannot_start_its_supervisor_says_why_in_the_run(tmp_path):
    """node.py outside a job step, and with no config: one line naming what is missing, exit 2, and
    node 0's run directory ends 'failed' with it (not a run that seems never to have begun)."""
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    r = subprocess.run([sys.executable, "-m", "torchdeck.engine.slurm.node", str(tmp_path)], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "not inside a SLURM job step" in r.stderr, r.stderr
    assert RunDir(tmp_path).final_status() is None  # not a job's: left alone
    env.update(SLURM_NODEID="0", SLURM_NNODES="2", SLURM_JOB_NODELIST="n1")
    r = subprocess.run([sys.executable, "-m", "torchdeck.engine.slurm.node", str(tmp_path)], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and f"{tmp_path / 'config.yaml'} does not exist" in r.stderr, r.stderr
    final = RunDir(tmp_path).final_status()
    assert final["status"] == "failed" and "the job could not start torchdeck: node 0 on " in final["root_cause"]


def test_an_exported_script_run_starts_in_the_folder_it_was_exported_from(tmp_path, monkeypatch):
    """The job starts in the submit folder: a script run's script.cwd is made absolute in the export
    (the app's Export and `torchdeck export --sbatch` alike), the form's config left as it was."""
    from torchdeck.engine import export

    monkeypatch.chdir(tmp_path)
    cfg = cfgmod.from_dict({"strategy": "script", "script": {"path": "t.py"}, "nodes": {"num_nodes": 2}})
    text = export.sbatch(cfg)
    assert f"\n  cwd: {tmp_path}\n" in text and cfg.script.cwd == ""


def test_node_1_killed_whole_in_a_job_is_node_0s_root_cause_within_10_s(tmp_path, jobs):
    """SIGKILL to node 1's supervisor and its rank mid-run (what a node taken away looks like from
    node 0; the cluster's nodes are this machine's processes, so they can be killed here): node 0
    ends failed within 10 s naming node 1 (n2), its own rank's gloo error only as what followed."""
    import psutil

    rd, job = submit(small_cfg(name="sj-lost", **{**TWO_NODES, "train.max_steps": 100000, "train.epochs": 1000,
                                                  "train.log_every_n_steps": 1}), tmp_path, jobs)
    deadline = time.monotonic() + JOB_S
    while not any(e["kind"] == "step" and e["step"] >= 3 for e in node_events(rd, 1)):
        assert time.monotonic() < deadline and rd.final_status() is None, what_happened(rd, job)
        time.sleep(0.2)
    sup = psutil.Process(RunDir(rd.path / "node1").supervisor_pid())
    whole = [sup, *sup.children(recursive=True)]
    for p in whole:
        p.kill()
    killed = time.monotonic()
    while rd.final_status() is None and time.monotonic() - killed < 60:
        time.sleep(0.1)
    took = time.monotonic() - killed
    final = rd.final_status()
    assert final is not None and final["status"] == "failed", what_happened(rd, job)
    assert final["root_cause"].startswith("node 1 (n2) lost at "), final["root_cause"]
    assert "gloo" not in final["root_cause"].split("; as a result: ", 1)[0].lower()
    assert took < 10, f"node 0 ended {took:.1f} s after node 1 was killed"
