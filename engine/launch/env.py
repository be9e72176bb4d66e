"""The environment of each rank of a script run (`torchdeck launch`): torchrun's contract, so an
unchanged torchrun script runs, plus what the shim reads (engine/launch/shim.py's docstring).

torchrun's variables: RANK = node_rank * nproc_per_node + local_rank, LOCAL_RANK, WORLD_SIZE,
LOCAL_WORLD_SIZE, GROUP_RANK (the node's rank), ROLE_RANK (= RANK), ROLE_WORLD_SIZE (= WORLD_SIZE),
ROLE_NAME ("default"), MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RUN_ID (the run's name),
TORCHELASTIC_RESTART_COUNT (0, then 1, 2... on each restart) and TORCHELASTIC_MAX_RESTARTS (train.max_restarts),
OMP_NUM_THREADS (threads per rank as torchdeck plans them, engine.affinity.threads_for, unless
it is exported already: torchrun keeps the user's value, and so does torchdeck).

torchrun leaves the device to the script (it reads LOCAL_RANK). When the user picked GPUs
(devices on cuda), every rank gets CUDA_VISIBLE_DEVICES set to the picked list, as users do by
hand in front of torchrun, so that LOCAL_RANK indexes into them.

Then script.env (the user's own, over all of the above), then torchdeck's: TORCHDECK_EVENTS_FD,
TORCHDECK_STACKS_FILE, TORCHDECK_RUN_DIR, TORCHDECK_LOCAL_RANK_ARG (when set) and
TORCHELASTIC_ERROR_FILE (the shim writes the failure there in torchelastic's format).
Stdlib only.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..rundir.layout import RunDir
from .channel import ENV_FD, ENV_ID, ENV_PATH

_INHERITED_CHANNEL = (ENV_ID, ENV_PATH)  # a launch from inside a launched script: not this run's pipe


@dataclass(frozen=True)
class NodePlan:
    """What every rank of this node shares (decided once by the supervisor)."""

    run_dir: Path
    run_id: str  # TORCHELASTIC_RUN_ID
    nproc: int  # LOCAL_WORLD_SIZE
    num_nodes: int
    node_rank: int
    master_addr: str
    master_port: int
    threads: int  # OMP_NUM_THREADS
    visible_devices: str | None = None  # CUDA_VISIBLE_DEVICES for every rank; None: left as it is
    local_rank_arg: str = ""  # script.local_rank_arg
    user_env: tuple = ()  # script.env as (key, value) pairs
    extra: tuple = ()  # the supervisor's own (GLOO_SOCKET_IFNAME ...), as (key, value) pairs
    restart_count: int = 0  # TORCHELASTIC_RESTART_COUNT: the restarts before this attempt
    max_restarts: int = 0  # TORCHELASTIC_MAX_RESTARTS (train.max_restarts)

    @property
    def world_size(self) -> int:
        return self.nproc * self.num_nodes


def error_file(run_dir, rank: int) -> Path:
    """The per-rank TORCHELASTIC_ERROR_FILE of a run directory."""
    return Path(run_dir) / f"rank{rank}.error.json"


def visible_devices(cfg) -> str | None:
    """CUDA_VISIBLE_DEVICES for a script run's ranks: the GPUs the user picked (devices on cuda,
    resolved to a list of indices), else None (the ranks inherit the supervisor's)."""
    if getattr(cfg, "accelerator", "cpu") != "cuda":
        return None
    devices = cfg.devices
    if isinstance(devices, list) and devices:
        return ",".join(str(d) for d in devices)
    return None


def threads_of(user_env, environ, planned: int):
    """The OMP_NUM_THREADS the ranks get: script.env's, else the one exported to torchdeck (kept,
    as torchrun keeps it), else torchdeck's plan. An int where it reads as one (what the
    supervisor says and run_started records), else the text as set."""
    for source in (user_env or {}, environ):
        value = source.get("OMP_NUM_THREADS")
        if value is not None and str(value).strip():
            try:
                return int(str(value).strip())
            except ValueError:
                return str(value)
    return planned


def plan_for(cfg, run_dir, nproc: int, port: int, threads: int, extra: dict | None = None,
             restart_count: int = 0) -> NodePlan:
    """The node's plan from a script run's config (RunConfig with strategy script)."""
    s = cfg.script
    n = cfg.nodes
    return NodePlan(run_dir=Path(run_dir), run_id=Path(run_dir).name, nproc=nproc, num_nodes=n.num_nodes,
                    node_rank=n.node_rank, master_addr=n.master_addr, master_port=port, threads=threads,
                    visible_devices=visible_devices(cfg), local_rank_arg=s.local_rank_arg or "",
                    user_env=tuple((str(k), str(v)) for k, v in (s.env or {}).items()),
                    extra=tuple((extra or {}).items()), restart_count=restart_count,
                    max_restarts=int(cfg.train.max_restarts))


def rank_env(plan: NodePlan, local_rank: int, events_fd: int | None, base: dict | None = None) -> dict:
    """The whole environment of local rank `local_rank` (base: the supervisor's own, by default)."""
    env = dict(os.environ if base is None else base)
    for key in _INHERITED_CHANNEL:
        env.pop(key, None)
    rank = plan.node_rank * plan.nproc + local_rank
    env.update({
        "RANK": str(rank),
        "LOCAL_RANK": str(local_rank),
        "WORLD_SIZE": str(plan.world_size),
        "LOCAL_WORLD_SIZE": str(plan.nproc),
        "GROUP_RANK": str(plan.node_rank),
        "GROUP_WORLD_SIZE": str(plan.num_nodes),
        "ROLE_RANK": str(rank),
        "ROLE_WORLD_SIZE": str(plan.world_size),
        "ROLE_NAME": "default",
        "MASTER_ADDR": plan.master_addr,
        "MASTER_PORT": str(plan.master_port),
        "TORCHELASTIC_RUN_ID": plan.run_id,
        "TORCHELASTIC_RESTART_COUNT": str(plan.restart_count),
        "TORCHELASTIC_MAX_RESTARTS": str(plan.max_restarts),
    })
    if not str(env.get("OMP_NUM_THREADS", "")).strip():  # an exported value is the user's: kept
        env["OMP_NUM_THREADS"] = str(plan.threads)
    if plan.visible_devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = plan.visible_devices
    env.update(dict(plan.extra))
    env.update(dict(plan.user_env))
    rd = RunDir(plan.run_dir)
    env["TORCHDECK_STACKS_FILE"] = str(rd.stacks_path(rank))
    env["TORCHDECK_RUN_DIR"] = str(rd.path)
    env["TORCHELASTIC_ERROR_FILE"] = str(error_file(rd.path, rank))
    if plan.local_rank_arg:
        env["TORCHDECK_LOCAL_RANK_ARG"] = plan.local_rank_arg
    else:
        env.pop("TORCHDECK_LOCAL_RANK_ARG", None)
    if events_fd is None:
        env.pop(ENV_FD, None)
    else:
        env[ENV_FD] = str(events_fd)
    return env
