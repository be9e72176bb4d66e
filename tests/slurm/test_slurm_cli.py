"""Submitting and following from the login node, on the real local two-node cluster: SLURM's own
commands through engine/slurm/cluster.py, the checks before a submission, and the CLI's
`run --slurm`, `launch --slurm`, `attach`, `runs` and `stop` of a SLURM run."""
from __future__ import annotations

import os
import subprocess
import time

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


@pytest.fixture
def jobs(slurm_cluster):
    """Job ids a test submitted: cancelled at its end, passed or not (the two nodes are shared)."""
    ids: list[str] = []
    yield ids
    for j in ids:
        subprocess.run(["scancel", str(j)], capture_output=True, timeout=30)


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


def _wrap(folder, command: str) -> str:
    path = folder / "job.sh"
    path.write_text(f"#!/bin/bash\n#SBATCH --output={folder}/out-%j.txt\n{command}\n")
    return str(path)
