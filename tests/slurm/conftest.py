"""The SLURM tests run against a real two-node cluster on this machine (tests/slurm/cluster.sh), started
once for the suite by whichever test process asks first (a lock keeps the two xdist workers from starting
it twice) and left running (`tests/slurm/cluster.sh down` stops it). Where it cannot run (not root, no
SLURM packages and no apt), the tests skip and say why."""
from __future__ import annotations

import fcntl
import os
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
CLUSTER = HERE / "cluster.sh"
STATE = Path(os.environ.get("TORCHDECK_SLURM_DIR", "/tmp/torchdeck-slurm"))


@pytest.fixture(scope="session")
def slurm_cluster():
    """SLURM_CONF of the running local cluster (set in this process's environment, so sbatch, squeue,
    scontrol and the code under test find it)."""
    STATE.mkdir(parents=True, exist_ok=True)
    with open(STATE / "up.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        out = subprocess.run(["bash", str(CLUSTER), "up"], capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        pytest.skip(f"no local SLURM cluster here: {(out.stderr or out.stdout).strip().splitlines()[-1:]} "
                    "(.ci/run installs slurmctld slurmd slurm-client munge; tests/slurm/cluster.sh up starts it, as root)")
    conf = out.stdout.strip().splitlines()[-1].split("=", 1)[1]
    os.environ["SLURM_CONF"] = conf
    return conf


@pytest.fixture
def jobs(slurm_cluster):
    """The ids of the jobs a test submitted: cancelled at its end, whatever happened (the two nodes are
    shared by every SLURM test)."""
    ids: list[str] = []
    yield ids
    for job in ids:
        subprocess.run(["scancel", str(job)], capture_output=True, timeout=60)
