"""Export a preset as the standard PyTorch launch: torchrun command lines and a SLURM sbatch script
(and, for strategy deepspeed, DeepSpeed's own `deepspeed` launcher with a hostfile).

Users outgrow one box and their clusters speak torchrun and SLURM. The worker entry
(`python -m torchdeck.engine.worker CONFIG --run-dir DIR`) reads RANK/LOCAL_RANK/WORLD_SIZE/MASTER_* from
the environment, so these commands run the same training the app would. No torch here.
"""
from __future__ import annotations

import os
import shlex

from . import config as cfgmod
from .cache import asked_workers
from .preflight import advice
from .strategies import global_batch, nproc_per_node, world_size

SLURM_CONFIG_MARK = "TORCHDECK_CONFIG_EOF"
PREEMPT_WARNING_S = 120  # seconds of warning sbatch asks for before preemption or the time limit
AUTO_THREADS_ASKED = 4  # CPUs per rank an sbatch script asks for when train.threads_per_rank is 0 (auto)


def _env(cfg) -> dict:
    env = {}
    if cfg.nodes.ifname:
        env["GLOO_SOCKET_IFNAME"] = cfg.nodes.ifname
        if cfg.accelerator == "cuda":
            env["NCCL_SOCKET_IFNAME"] = cfg.nodes.ifname
    return env


def torchrun_argv(cfg, config_path: str, run_dir: str, node_rank: int | None = None) -> list[str]:
    """argv for one node. One node: `--standalone` (torchrun picks a free port)."""
    nproc = nproc_per_node(cfg)
    argv = ["torchrun"]
    if cfg.nodes.num_nodes == 1:
        argv += ["--standalone", "--nnodes", "1", "--nproc-per-node", str(nproc)]
    else:
        k = cfg.nodes.node_rank if node_rank is None else node_rank
        argv += ["--nnodes", str(cfg.nodes.num_nodes), "--nproc-per-node", str(nproc),
                 "--node-rank", str(k), "--master-addr", cfg.nodes.master_addr,
                 "--master-port", str(cfg.nodes.master_port),
                 # nodes.timeout_s bounds the wait for the master, as in `torchdeck run` (torchrun: 600 s)
                 "--rdzv-conf", f"timeout={cfg.nodes.timeout_s}"]
    return argv + ["-m", "torchdeck.engine.worker", str(config_path), "--run-dir", str(run_dir)]


def _name(text: str) -> str:
    """A run name as a directory name: letters, digits, '.', '_' and '-' (as run directories are named)."""
    return "".join(c if c.isalnum() or c in "._-" else "-" for c in text).strip(".-") or "run"


def _in_double_quotes(text: str) -> str:
    return "".join("\\" + c if c in '\\"$`' else c for c in text)


def run_dir_shell(run_root: str, name: str, node_rank: int) -> str:
    """Shell text naming a new run directory at each launch, by the launch time as `torchdeck run`
    names its own (<root>/<YYYYmmdd-HHMMSS>-<name>-node<k>): a fixed name made a second launch
    append to the first run's events."""
    return f'"{_in_double_quotes(run_root)}/$(date +%Y%m%d-%H%M%S)-{_name(name)}-node{node_rank}"'


def default_run_root() -> str:
    """Where an exported job's run directories go unless --run-root says: $TORCHDECK_RUNS as
    `torchdeck run` uses it (read when exporting), else ./runs on each node."""
    return os.environ.get("TORCHDECK_RUNS") or "runs"


def torchrun_commands(cfg, config_path: str, run_root: str | None = None) -> list[tuple[int, dict, list[str]]]:
    """(node rank, extra environment, argv) for every node; each node writes its own run directory.
    The last argument is shell text (the run directory, named when the line runs): join the rest
    with shlex and append it as is."""
    out, run_root = [], run_root or default_run_root()
    for k in range(cfg.nodes.num_nodes):
        out.append((k, _env(cfg), torchrun_argv(cfg, config_path, run_dir_shell(run_root, cfg.name, k), k)))
    return out


def torchrun(cfg, config_path: str, run_root: str | None = None) -> str:
    """Shell text: one command per node, to run from the project directory on that node."""
    lines = [f"# {cfg.name}: {cfg.strategy}, {cfg.nodes.num_nodes} node(s) x {nproc_per_node(cfg)} "
             f"process(es) = world size {world_size(cfg)}, global batch {global_batch(cfg)}",
             f"# every node needs the same config at {config_path} and torchdeck installed"]
    lines += [f"# warning: {field}: {why}" for field, why in advice(cfg)]
    for k, env, argv in torchrun_commands(cfg, config_path, run_root):
        if cfg.nodes.num_nodes > 1:
            host = f" (master: {cfg.nodes.master_addr})" if k == 0 else ""
            lines.append(f"# node {k}{host}")
        prefix = "".join(f"{key}={shlex.quote(v)} " for key, v in env.items())
        lines.append(prefix + shlex.join(argv[:-1]) + " " + argv[-1])
    return "\n".join(lines) + "\n"


def hostfile_text(cfg) -> str:
    """DeepSpeed's hostfile: one `host slots=N` line per node. With `--no_ssh` every node starts its
    own launcher (as torchrun), so the names only key the nodes; slots count the GPU indices up to
    the highest one used (the exact ones go in --include) or the CPU processes."""
    slots = max(cfg.devices) + 1 if cfg.accelerator == "cuda" else nproc_per_node(cfg)
    return "".join(f"node{k} slots={slots}\n" for k in range(cfg.nodes.num_nodes))


def deepspeed_argv(cfg, config_path: str, hostfile: str, run_dir: str, node_rank: int) -> list[str]:
    """argv for one node: DeepSpeed's launcher without ssh, starting `python -m torchdeck.engine.worker`
    (which reads RANK, LOCAL_RANK, WORLD_SIZE, MASTER_*, and the launcher's CROSS_RANK/LOCAL_SIZE)."""
    argv = ["deepspeed", "--hostfile", hostfile, "--no_ssh", "--node_rank", str(node_rank),
            "--master_addr", cfg.nodes.master_addr, "--master_port", str(cfg.nodes.master_port or 29500)]
    if cfg.accelerator == "cuda":  # the launcher makes exactly these visible, as CUDA_VISIBLE_DEVICES
        ids = ",".join(str(i) for i in cfg.devices)
        argv += ["--include", "@".join(f"node{k}:{ids}" for k in range(cfg.nodes.num_nodes))]
    return argv + ["--no_local_rank", "--module", "torchdeck.engine.worker", str(config_path), "--run-dir", run_dir]


def deepspeed(cfg, config_path: str, run_root: str | None = None, hostfile: str | None = None) -> str:
    """Shell text: write the hostfile (<name>.hostfile), then one `deepspeed` command per node (run on
    that node)."""
    hostfile = hostfile or f"{_name(cfg.name)}.hostfile"
    run_root = run_root or default_run_root()
    lines = [f"# {cfg.name}: {cfg.strategy}, {cfg.nodes.num_nodes} node(s) x {nproc_per_node(cfg)} "
             f"process(es) = world size {world_size(cfg)}, global batch {global_batch(cfg)}",
             f"# DeepSpeed's launcher, no ssh: run each node's line on that node, from the project directory;",
             f"# every node needs the same config at {config_path}, the hostfile, and torchdeck[deepspeed]"]
    lines += [f"# warning: {field}: {why}" for field, why in advice(cfg)]
    lines += [f"cat > {shlex.quote(hostfile)} <<'EOF'", hostfile_text(cfg).rstrip("\n"), "EOF"]
    for k in range(cfg.nodes.num_nodes):
        if cfg.nodes.num_nodes > 1:
            lines.append(f"# node {k}" + (f" (master: {cfg.nodes.master_addr})" if k == 0 else ""))
        argv = deepspeed_argv(cfg, config_path, hostfile, run_dir_shell(run_root, cfg.name, k), k)
        prefix = "".join(f"{key}={shlex.quote(v)} " for key, v in _env(cfg).items())
        lines.append(prefix + shlex.join(argv[:-1]) + " " + argv[-1])
    return "\n".join(lines) + "\n"


def sbatch(cfg) -> str:
    """The SLURM batch script a run is submitted with (engine/slurm/script.py): one torchdeck
    supervisor per node, the job making its own run directory. A script run's folder is made
    absolute here: the job starts in the submit folder, not where it was exported."""
    from .slurm.script import batch_script

    if cfg.is_script and not cfg.script.cwd:
        import copy

        from .preflight import script_cwd

        cfg = copy.deepcopy(cfg)
        cfg.script.cwd = str(script_cwd(cfg).resolve())
    return batch_script(cfg)


def torchrun_sbatch(cfg, job_name: str | None = None, time_limit: str = "04:00:00") -> str:
    """The script `export --sbatch` printed before issue 38: srun starts one torchrun per node, which meet
    through c10d rendezvous, with no torchdeck supervisor. Kept for bench/slurm.py, which measures the
    supervisor's job against it.

    The resolved config is embedded, so the job runs exactly what was validated here.
    """
    name = job_name or cfg.name
    nproc = nproc_per_node(cfg)
    port = cfg.nodes.master_port or 29500
    gpu_lines = f"#SBATCH --gpus-per-node={nproc}\n" if cfg.accelerator == "cuda" else ""
    # one task per node runs torchrun and all its ranks: without this SLURM gives them one CPU
    threads = cfg.train.threads_per_rank or AUTO_THREADS_ASKED
    workers = asked_workers(cfg, nproc)
    cpus = nproc * (threads + workers)
    env_lines = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in _env(cfg).items())
    yaml_text = cfgmod.dumps(cfg)
    if SLURM_CONFIG_MARK in yaml_text:  # would end the heredoc early
        raise ValueError("the config contains the heredoc marker; rename it")
    return f"""#!/bin/bash
# torchdeck export: {cfg.name} ({cfg.strategy}), {cfg.nodes.num_nodes} node(s) x {nproc} process(es)
# = world size {world_size(cfg)}, global batch {global_batch(cfg)}. Submit with: sbatch THIS_FILE
#SBATCH --job-name={shlex.quote(name)}
#SBATCH --nodes={cfg.nodes.num_nodes}
#SBATCH --ntasks-per-node=1
# CPUs: {nproc} rank(s) x ({threads} thread(s){' (train.threads_per_rank: auto)' if not cfg.train.threads_per_rank else ''} + {workers} data loader worker(s){' (data.num_workers: auto)' if cfg.data.num_workers < 0 else ''})
#SBATCH --cpus-per-task={cpus}
{gpu_lines}#SBATCH --time={time_limit}
#SBATCH --output=%x-%j.out
# Preemption and the time limit: SLURM sends this script USR1 {PREEMPT_WARNING_S} s before; the ranks
# checkpoint and stop (status 'preempted') and the job is requeued, resuming from that checkpoint.
#SBATCH --signal=B:USR1@{PREEMPT_WARNING_S}
#SBATCH --requeue
#SBATCH --open-mode=append
set -euo pipefail

# Use the environment torchdeck is installed in (override with TORCHDECK_VENV).
VENV="${{TORCHDECK_VENV:-$SLURM_SUBMIT_DIR/.venv}}"
if [ -f "$VENV/bin/activate" ]; then source "$VENV/bin/activate"; fi

# The node link's secret (TORCHDECK_NODE_SECRET, engine/nodes): made here, when the job runs, one per
# job; every node gets it in its environment through srun, never in a file or on a command line.
export TORCHDECK_NODE_SECRET="$(python3 -c 'import secrets; print(secrets.token_hex(32))')"

# The config, as validated by `torchdeck export` (on the shared file system, read by every node).
export TD_CONFIG="$SLURM_SUBMIT_DIR/torchdeck-$SLURM_JOB_ID.yaml"
cat > "$TD_CONFIG" <<'{SLURM_CONFIG_MARK}'
{yaml_text}{SLURM_CONFIG_MARK}

export TD_RUN_ROOT="${{TORCHDECK_RUNS:-$SLURM_SUBMIT_DIR/runs}}/$SLURM_JOB_ID-{cfg.name}"
# A requeued job (SLURM_RESTART_COUNT > 0) writes new run directories beside the first ones and
# resumes from the newest checkpoint among them.
export TD_ATTEMPT="${{SLURM_RESTART_COUNT:-0}}"
export TD_SUFFIX="" TD_RESUME=""
if [ "$TD_ATTEMPT" -gt 0 ]; then TD_SUFFIX="-requeue$TD_ATTEMPT"; TD_RESUME=latest; fi
export TD_HEAD="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"
export TD_PORT={port}
export TD_NPROC={nproc}
export TD_TIMEOUT={cfg.nodes.timeout_s}  # nodes.timeout_s: how long the nodes wait for each other
{env_lines}mkdir -p "$TD_RUN_ROOT"

# One torchrun per node; c10d rendezvous on the first node. Each node writes its own run directory.
# srun inherits no --cpus-per-task from sbatch since Slurm 22.05: pass it on.
td_preempted() {{  # USR1: every node's ranks agree to stop at the next step and checkpoint first
    echo "torchdeck: USR1 (preemption or time limit): checkpointing, then requeueing job $SLURM_JOB_ID"
    TD_PREEMPTED=1
    for ((k = 0; k < SLURM_NNODES; k++)); do
        mkdir -p "$TD_RUN_ROOT/node$k$TD_SUFFIX" && touch "$TD_RUN_ROOT/node$k$TD_SUFFIX/preempted" "$TD_RUN_ROOT/node$k$TD_SUFFIX/stop"
    done
}}
TD_PREEMPTED=""
trap td_preempted USR1
srun --kill-on-bad-exit=1 --cpus-per-task="${{SLURM_CPUS_PER_TASK:-{cpus}}}" bash -c 'exec torchrun --nnodes "$SLURM_NNODES" --nproc-per-node "$TD_NPROC" \\
    --rdzv-id "$SLURM_JOB_ID-$TD_ATTEMPT" --rdzv-backend c10d --rdzv-endpoint "$TD_HEAD:$TD_PORT" \\
    --rdzv-conf "join_timeout=$TD_TIMEOUT" \\
    -m torchdeck.engine.worker "$TD_CONFIG" --run-dir "$TD_RUN_ROOT/node$SLURM_NODEID$TD_SUFFIX" ${{TD_RESUME:+--resume "$TD_RESUME"}}' &
TD_SRUN=$!
rc=0
wait "$TD_SRUN" || rc=$?
while kill -0 "$TD_SRUN" 2>/dev/null; do rc=0; wait "$TD_SRUN" || rc=$?; done  # USR1 ended the first wait
if [ -n "$TD_PREEMPTED" ] && [ "$rc" -eq 0 ]; then
    scontrol requeue "$SLURM_JOB_ID"
fi
exit "$rc"
"""


# ----------------------------------------------------------------------------- a script run


def script_torchrun_argv(cfg, node_rank: int | None = None) -> list[str]:
    """The torchrun command line a user would type for a script run (strategy script), one node."""
    s, n = cfg.script, cfg.nodes
    nproc = "cpu" if cfg.accelerator == "cpu" and cfg.devices == "auto" else str(nproc_per_node(cfg))
    argv = ["torchrun"]
    if n.num_nodes == 1 and not n.master_port:
        argv += ["--standalone", "--nnodes", "1", "--nproc-per-node", nproc]
    else:
        argv += ["--nnodes", str(n.num_nodes), "--nproc-per-node", nproc,
                 "--node-rank", str(n.node_rank if node_rank is None else node_rank),
                 "--master-addr", n.master_addr, "--master-port", str(n.master_port)]
    if s.no_python:
        argv.append("--no-python")
    argv += ["-m", s.module] if s.module else [s.path]
    return argv + list(s.args)


def _script_env(cfg) -> dict:
    """What torchdeck would add to each rank's environment beyond torchrun's: script.env, the GPUs
    picked (CUDA_VISIBLE_DEVICES, as torchrun users set it by hand), the network interface."""
    env = dict(_env(cfg))
    if cfg.accelerator == "cuda" and isinstance(cfg.devices, list):
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, cfg.devices))
    env.update(cfg.script.env)
    return env


def _script_notes(cfg) -> list[str]:
    s = cfg.script
    notes = []
    if s.local_rank_arg:
        notes.append(f"# note: torchrun passes no {s.local_rank_arg}=N to the script (torchdeck's local_rank_arg did); "
                     "the script must read LOCAL_RANK, or use python -m torch.distributed.launch")
    return notes


def script_torchrun(cfg, under_torchdeck: str = "torchdeck run THIS_PRESET") -> str:
    """Shell text for a script run: cd to its folder, export the environment torchdeck would add,
    then one torchrun line per node. under_torchdeck: the command that runs the same under
    torchdeck (the CLI passes the preset as given, its path absolute)."""
    from .preflight import script_cwd

    n = cfg.nodes
    lines = [f"# {cfg.name}: your own script, {n.num_nodes} node(s) x {nproc_per_node(cfg)} process(es) = "
             f"world size {world_size(cfg)}; the same run under torchdeck: {under_torchdeck}",
             *_script_notes(cfg), f"cd {shlex.quote(str(script_cwd(cfg).resolve()))}"]
    lines += [f"export {k}={shlex.quote(v)}" for k, v in _script_env(cfg).items()]
    for k in range(n.num_nodes):
        if n.num_nodes > 1:
            lines.append(f"# node {k}" + (f" (master: {n.master_addr})" if k == 0 else ""))
        lines.append(shlex.join(script_torchrun_argv(cfg, k)))
    return "\n".join(lines) + "\n"
