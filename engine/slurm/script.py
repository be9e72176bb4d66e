"""The batch script of a SLURM run: what is submitted, and what `torchdeck export --sbatch` prints.

It asks SLURM for the nodes (nodes.num_nodes) and the slurm section's resources, then srun starts
one torchdeck supervisor per node (engine/slurm/node.py) in the foreground. The node link's secret
is made in the job, when it runs, and given to srun's environment only (never a file, never a
command line). USR1 before the time limit reaches every node's supervisor through its run directory
(they checkpoint and end 'preempted'); the job then requeues itself and the next attempt resumes
from that checkpoint.
No torch here.
"""
from __future__ import annotations

import shlex
import sys

from .. import config as cfgmod
from ..cache import asked_workers
from ..strategies import global_batch, nproc_per_node, world_size

CONFIG_MARK = "TORCHDECK_CONFIG_EOF"
PREEMPT_WARNING_S = 120  # seconds of warning asked for before preemption or the time limit
AUTO_THREADS_ASKED = 4  # CPUs per rank asked for when train.threads_per_rank is 0 (auto)
NODE_MODULE = "torchdeck.engine.slurm.node"


def cpus_per_node(cfg) -> tuple[int, str]:
    """(CPUs the one task per node asks for, the comment saying why): the node's ranks' threads and
    data loader workers; SLURM gives a task one CPU unless told."""
    nproc = nproc_per_node(cfg)
    threads = cfg.train.threads_per_rank or AUTO_THREADS_ASKED
    auto = " (train.threads_per_rank: auto)" if not cfg.train.threads_per_rank else ""
    if cfg.is_script:
        return nproc * threads, f"{nproc} rank(s) x {threads} thread(s){auto}"
    workers = asked_workers(cfg, nproc)
    said = f"{nproc} rank(s) x ({threads} thread(s){auto} + {workers} data loader worker(s)" + (
        " (data.num_workers: auto))" if cfg.data.num_workers < 0 else ")")
    return nproc * (threads + workers), said


def gpus_per_node(cfg) -> int:
    if cfg.slurm.gpus_per_node:
        return cfg.slurm.gpus_per_node
    return nproc_per_node(cfg) if cfg.accelerator == "cuda" else 0


def sbatch_lines(cfg, run_dir: str | None) -> list[str]:
    """The #SBATCH lines: the job's shape from the config, then slurm.sbatch_args as given."""
    s = cfg.slurm
    cpus, why = cpus_per_node(cfg)
    out = [f"--job-name={_word(cfg.name)}", f"--nodes={cfg.nodes.num_nodes}", "--ntasks-per-node=1",
           f"# CPUs: {why}", f"--cpus-per-task={cpus}"]
    if gpus_per_node(cfg):
        out.append(f"--gpus-per-node={gpus_per_node(cfg)}")
    out.append(f"--time={s.time.strip()}")
    out += [f"--{name}={getattr(s, name)}" for name in ("partition", "account", "qos", "constraint") if getattr(s, name)]
    out.append(f"--output={_sbatch_path(f'{run_dir}/slurm-%j.out')}" if run_dir else "--output=%x-%j.out")
    out += [f"# USR1 {PREEMPT_WARNING_S} s before preemption or the time limit: checkpoint, stop, requeue",
            f"--signal=B:USR1@{PREEMPT_WARNING_S}", "--requeue", "--open-mode=append"]
    out += list(s.sbatch_args)
    return [line if line.startswith("#") else f"#SBATCH {line}" for line in out]


def _sbatch_path(path: str) -> str:
    """A path in an #SBATCH line: sbatch splits them at spaces unless double-quoted."""
    return f'"{path}"' if any(c.isspace() for c in path) else path


def _word(text: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "-" for c in text).strip(".-") or "run"


def _run_dir_lines(cfg, run_dir: str | None) -> str:
    """Shell setting TD_RUN_DIR: the one made at submission, or (export --sbatch) one this job
    makes under $TORCHDECK_RUNS or the submit folder's runs/, found again when the job is requeued."""
    if run_dir:
        return f"TD_RUN_DIR={shlex.quote(run_dir)}\n"
    yaml_text = cfgmod.dumps(cfg)
    if CONFIG_MARK in yaml_text:  # would end the heredoc early
        raise ValueError(f"the config contains {CONFIG_MARK}; rename it")
    name = _word(cfg.name)
    return f"""# The run directory, on the filesystem the nodes and the login node share; a requeued job finds its own.
TD_ROOT="${{TORCHDECK_RUNS:-$SLURM_SUBMIT_DIR/runs}}"
TD_RUN_DIR=""
for d in "$TD_ROOT"/*-{name}-job"$SLURM_JOB_ID"; do if [ -d "$d" ]; then TD_RUN_DIR="$d"; fi; done
if [ -z "$TD_RUN_DIR" ]; then
    TD_RUN_DIR="$TD_ROOT/$(date +%Y%m%d-%H%M%S)-{name}-job$SLURM_JOB_ID"
    mkdir -p "$TD_RUN_DIR"
    # the config as validated by `torchdeck export`
    cat > "$TD_RUN_DIR/config.yaml" <<'{CONFIG_MARK}'
{yaml_text}{CONFIG_MARK}
fi
"""


def batch_script(cfg, run_dir: str | None = None) -> str:
    """The whole sbatch script for `cfg`; run_dir: the run directory made at submission (None: the
    job makes one). It passes `bash -n` and needs nothing on the nodes but torchdeck installed."""
    n = cfg.nodes
    kind = "your own script" if cfg.is_script else cfg.strategy
    head = (f"#!/bin/bash\n# torchdeck: {cfg.name} ({kind}), {n.num_nodes} node(s) x {nproc_per_node(cfg)} process(es) = "
            f"world size {world_size(cfg)}" + ("" if cfg.is_script else f", global batch {global_batch(cfg)}") +
            ".\n# One torchdeck supervisor per node (srun); node 0's run directory gathers every node's events.\n"
            "# Submit with: sbatch THIS_FILE\n")
    cpus, _ = cpus_per_node(cfg)
    return head + "\n".join(sbatch_lines(cfg, run_dir)) + f"""
set -euo pipefail

# The python torchdeck is installed in: TORCHDECK_PYTHON, else the one that wrote this script, else python3.
TD_PYTHON="${{TORCHDECK_PYTHON:-{shlex.quote(sys.executable)}}}"
if [ ! -x "$TD_PYTHON" ]; then TD_PYTHON=python3; fi
{_run_dir_lines(cfg, run_dir)}
# The node link's secret: one per job, made now, in srun's environment only.
TD_SECRET="$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n')"

# USR1 (preemption, the time limit) comes to this shell only. Signalling the job step would reach
# every process of it, ranks included: each node's supervisor is asked through its run directory
# instead (the preempted and stop files, on the shared filesystem): it stops the ranks after a
# checkpoint and ends 'preempted'; the job is requeued below.
td_preempted() {{
    echo "torchdeck: USR1 (preemption or time limit): checkpointing, then requeueing job $SLURM_JOB_ID"
    for ((k = 0; k < SLURM_NNODES; k++)); do
        d="$TD_RUN_DIR"; if [ "$k" -gt 0 ]; then d="$TD_RUN_DIR/node$k"; fi
        mkdir -p "$d" && touch "$d/preempted" && touch "$d/stop"
    done
}}
trap td_preempted USR1

# One supervisor per node, in the foreground of its srun task: node rank SLURM_NODEID, node 0 on the
# first host. A node that fails does not end the others at once: node 0 says which node was the cause.
# srun inherits no --cpus-per-task from sbatch since Slurm 22.05: pass it on.
TORCHDECK_NODE_SECRET="$TD_SECRET" srun --ntasks-per-node=1 --kill-on-bad-exit=0 \\
    --cpus-per-task="${{SLURM_CPUS_PER_TASK:-{cpus}}}" "$TD_PYTHON" -m {NODE_MODULE} "$TD_RUN_DIR" &
TD_SRUN=$!
rc=0
wait "$TD_SRUN" || rc=$?
while kill -0 "$TD_SRUN" 2>/dev/null; do rc=0; wait "$TD_SRUN" || rc=$?; done  # USR1 ended the wait early
if grep -qs '"status": "preempted"' "$TD_RUN_DIR/status.json"; then  # ended by USR1 (or a preemption stop)
    echo "torchdeck: requeueing job $SLURM_JOB_ID; it resumes from the newest checkpoint"
    scontrol requeue "$SLURM_JOB_ID"
fi
exit "$rc"
"""
