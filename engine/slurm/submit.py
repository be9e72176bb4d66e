"""Submit a run to SLURM from the login node: what can be known wrong before, then the run
directory, its batch script and sbatch.

The run directory is made here, before the job exists, on the filesystem the job's nodes share
with the login node: the CLI, the app and `torchdeck runs` see the job from the moment it is
submitted (pending, with SLURM's reason), and node 0's supervisor writes into the same directory
once it starts.
"""
from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from ..files import write_atomic
from ..rundir.layout import SLURM_FILE, RunDir
from . import cluster
from .cluster import SlurmError

SCRIPT_FILE = "job.sbatch"


def output_path(run: RunDir, job_id: str) -> Path:
    """The job's own output file (the batch script's stdout and stderr, srun's, anything that ran
    before torchdeck did): in the run directory, so that a job that failed early is explained there."""
    return run.path / f"slurm-{job_id}.out"


def check(cfg) -> list[str]:
    """Problems known before submission, one line each naming what to change: no sbatch here, a
    partition the cluster does not have, more nodes than the partition has."""
    missing = cluster.available()
    if missing:
        return [missing]
    try:
        parts = cluster.partitions()
    except SlurmError as exc:
        return [f"sinfo: {exc.message}"]
    want = cfg.slurm.partition
    names = ", ".join(p.name for p in parts) or "none"
    if want:
        part = next((p for p in parts if p.name == want), None)
        if part is None:
            return [f"slurm.partition: no partition {want!r} on this cluster (sinfo lists: {names}); "
                    "pick one with --partition"]
    else:
        part = next((p for p in parts if p.default), None)
    n = cfg.nodes.num_nodes
    if part is not None and n > part.nodes:
        return [f"nodes.num_nodes: {n} nodes, but partition {part.name} has {part.nodes}; "
                f"ask for at most {part.nodes} (--nodes) or another partition (--partition; sinfo lists: {names})"]
    from .script import cpus_per_node

    cpus, why = cpus_per_node(cfg)
    if part is not None and part.cpus is not None and cpus > part.cpus:  # SLURM would queue it forever
        return [f"the job asks {cpus} CPUs per node ({why}), but partition {part.name}'s nodes have {part.cpus}; "
                "lower train.threads_per_rank or data.num_workers, or run fewer processes per node"]
    return []


def submit(cfg, root: str | os.PathLike | None = None, origin: dict | None = None,
           extra: list[str] | None = None) -> RunDir:
    """Make the run directory, write its batch script, sbatch it; slurm.json records the job.
    SlurmError with sbatch's own words when SLURM refuses (the run directory is removed then:
    nothing ran). `extra`: sbatch options given on its command line, after the script's own."""
    from .script import batch_script

    origin = {"cwd": os.getcwd(), **(origin or {})}
    run = RunDir.create(cfg, Path(root) if root else None, origin)
    script = run.path / SCRIPT_FILE
    try:
        write_atomic(script, batch_script(cfg, str(run.path)))
        # the output file in the run directory: sbatch's command line wins over the script's #SBATCH lines
        job = cluster.sbatch(script, cwd=origin["cwd"], extra=[f"--output={run.path}/slurm-%j.out", *(extra or [])])
    except BaseException:
        shutil.rmtree(run.path, ignore_errors=True)
        raise
    write_atomic(run.path / SLURM_FILE, json.dumps(
        {"job_id": job, "submitted": time.time(), "script": SCRIPT_FILE,
         "output": str(output_path(run, job))}, indent=2))
    return run
