"""One node of a SLURM job: `python -m torchdeck.engine.slurm.node RUN_DIR`, started by srun once per node.

It reads the node's place from SLURM (SLURM_NODEID, SLURM_NNODES, the first host of
SLURM_JOB_NODELIST as node 0), makes this node's run directory (node 0: RUN_DIR itself, made at
submission with config.yaml in it; node k: RUN_DIR/node<k>/ with the same config), and becomes
that node's supervisor, in the foreground: srun's task is the supervisor, so SLURM tracks it,
signals it (USR1, scancel) and ends it. A requeued job (SLURM_RESTART_COUNT > 0) continues the same
run directories from the newest checkpoint. No torch here.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from .. import config as cfgmod
from .. import events
from ..rundir.config import load_validated
from ..rundir.layout import RunDir

DEFAULT_PORT = cfgmod.NodesConfig.master_port
PORT_BASE, PORT_SPAN = 20000, 20000  # a job's own rendezvous port when nodes.master_port is the default


class NodeError(Exception):
    """This node cannot start its supervisor (no SLURM job around it, no config)."""


def first_host(nodelist: str) -> str:
    """The job's first node, as `scontrol show hostnames` expands SLURM_JOB_NODELIST (n[1-2] -> n1)."""
    if not any(c in nodelist for c in "[,"):
        return nodelist
    try:
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True,
                             timeout=60, check=True).stdout.split()
    except (OSError, subprocess.SubprocessError) as exc:
        raise NodeError(f"cannot expand SLURM_JOB_NODELIST {nodelist!r} with scontrol: {exc}") from exc
    if not out:
        raise NodeError(f"scontrol show hostnames {nodelist!r} named no host")
    return out[0]


def job_port(job_id: str, port: int) -> int:
    """nodes.master_port as set, or, left at its default, one of this job's own: two jobs sharing a
    node then do not meet at the same port. Even, so that the node link's (port + 1) is the job's too."""
    if port != DEFAULT_PORT or not job_id.isdigit():
        return port
    return PORT_BASE + 2 * (int(job_id) % (PORT_SPAN // 2))


def where(env=os.environ) -> dict:
    """This node's place in the job, from SLURM's environment."""
    try:
        node, nnodes = int(env["SLURM_NODEID"]), int(env["SLURM_NNODES"])
        nodelist = env["SLURM_JOB_NODELIST"]
    except (KeyError, ValueError) as exc:
        raise NodeError(f"not inside a SLURM job step ({exc} missing or wrong): start this with srun in a batch "
                        "job (torchdeck export --sbatch prints one)") from exc
    return {"node_rank": node, "num_nodes": nnodes, "master_addr": first_host(nodelist),
            "job_id": env.get("SLURM_JOB_ID", ""), "restart": int(env.get("SLURM_RESTART_COUNT") or 0)}


def _requeued(base: RunDir, rd: RunDir, cfg, restart: int) -> None:
    """A requeued job: the attempt before ended (status 'preempted'); its end is kept aside and this
    attempt resumes our loop from the newest checkpoint on node 0 (every node the same one)."""
    old = rd.final_status()
    if old is not None:
        os.replace(rd.status_path, rd.path / f"status.attempt{restart - 1}.json")
    for p in (rd.stop_path, rd.preempt_path):
        p.unlink(missing_ok=True)
    found = None if cfg.is_script else base.checkpoints(cfg)
    if found:
        cfg.checkpoint.resume = str(found[-1][1].resolve())
    said = (f"SLURM requeued job {os.environ.get('SLURM_JOB_ID', '')} (restart {restart}): "
            + (f"resuming from {found[-1][1].name}" if found else "starting over (no checkpoint)"))
    with open(rd.events_path, "a") as fh:
        fh.write(events.dumps(events.make("log", rank=None, level="info", message=said)) + "\n")


def prepare(run_dir: str | os.PathLike, place: dict) -> RunDir:
    """This node's run directory with its config: the job's config with this node's rank, the node
    count and node 0's host from SLURM."""
    base = RunDir(Path(run_dir).resolve())
    if not base.config_path.is_file():
        raise NodeError(f"{base.config_path} does not exist: the run directory must be made before the job "
                        "starts, on a filesystem every node shares")
    cfg = load_validated(base.config_path)
    k = place["node_rank"]
    rd = base if k == 0 else RunDir(base.path / f"node{k}")
    rd.path.mkdir(exist_ok=True)
    n = cfg.nodes
    n.node_rank, n.num_nodes, n.master_addr = k, place["num_nodes"], place["master_addr"]
    n.master_port = job_port(place["job_id"], n.master_port)
    if place["restart"] > 0:
        _requeued(base, rd, cfg, place["restart"])
    cfgmod.save(cfg, rd.config_path)
    _origin(base, rd, place)
    return rd


def _origin(base: RunDir, rd: RunDir, place: dict) -> None:
    """origin.json: kept as submission wrote it; node k gets node 0's (where the user's code is
    looked up); a run directory the job made itself (export --sbatch) gets the submit folder."""
    if rd.origin_path.exists():
        return
    origin = base.origin() or {"cwd": os.environ.get("SLURM_SUBMIT_DIR", os.getcwd())}
    origin.setdefault("slurm_job", place["job_id"])
    rd.origin_path.write_text(json.dumps(origin, indent=2))


def _failed_before_start(run_dir: str, said: str) -> None:
    """Node 0 could not start its supervisor: the run directory (when there is one) says so, rather
    than looking as if the run had never begun."""
    if os.environ.get("SLURM_NODEID") != "0" or not Path(run_dir).is_dir():
        return
    rd = RunDir(Path(run_dir))
    if rd.final_status() is None:
        try:
            rd.write_final("failed", f"the job could not start torchdeck: {said}")
        except OSError:
            pass


def main(argv=None) -> int:
    from ..supervisor import supervise

    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print(f"usage: python -m {__spec__.name if __spec__ else 'torchdeck.engine.slurm.node'} RUN_DIR",
              file=sys.stderr)
        return 2
    try:
        place = where()
        rd = prepare(argv[0], place)
    except (NodeError, OSError, cfgmod.ConfigError) as exc:
        said = f"node {os.environ.get('SLURM_NODEID', '?')} on {socket.gethostname()}: {exc}"
        print(f"torchdeck: {said}", file=sys.stderr, flush=True)
        _failed_before_start(argv[0], said)
        return 2
    print(f"torchdeck: node {place['node_rank']} of {place['num_nodes']} on {socket.gethostname()}: supervisor "
          f"for {rd.path} (its output: {rd.supervisor_log})", flush=True)
    with open(rd.supervisor_log, "ab") as log:  # the job's output file holds the line above; the rest goes here
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
    return supervise(rd.path)


if __name__ == "__main__":
    sys.exit(main())
