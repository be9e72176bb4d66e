"""The local cluster the SLURM tests use is a real one: two nodes, a job step on each."""
from __future__ import annotations

import subprocess


def test_the_local_cluster_runs_a_step_on_each_of_its_two_nodes(slurm_cluster, tmp_path):
    out = subprocess.run(["srun", "-N2", "-n2", "--chdir", str(tmp_path), "bash", "-c", "echo $(hostname) $SLURM_NODEID"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert sorted(out.stdout.split("\n")[:2]) == ["n1 0", "n2 1"], out.stdout
