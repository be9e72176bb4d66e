"""What the supervisor decides on its host before any rank exists: the port and the store's
socket, the GPUs (devices: all, free:N), threads per rank, the ranks' environment; and the
run_started event that says so. No torch here unless `devices: all` asks this host's GPUs."""
from __future__ import annotations

import dataclasses
import os
import socket

from .. import events, strategies
from ..config import resolve_all_gpus
from ..kinds import kind_of
from ..losses import said as loss_said
from ..preflight import length
from ..strategies import get_strategy
from .ports import StoreSocket, bind_store, choose_port


@dataclasses.dataclass
class Plan:
    """What the supervisor decided before starting the ranks (make_plan)."""

    port: int
    port_msg: str | None
    notes: list
    threads: int
    child_env: dict
    store: StoreSocket | None
    meet: str


def lone_node_warning(cfg) -> str | None:
    """Several nodes meeting at a loopback address (torchrun's default 127.0.0.1): node 0 waits
    for nodes that on other machines can never reach it, silently until nodes.timeout_s, so say
    so at the start (several nodes on one host is a fair rehearsal: a warning, not a refusal)."""
    from ..preflight import _is_loopback

    n = cfg.nodes
    if n.num_nodes <= 1:
        return None
    if cfg.init_method.startswith("tcp://"):
        what, host = "init_method", cfg.init_method[len("tcp://"):].rpartition(":")[0]
    elif cfg.init_method.startswith("env://"):
        what, host = "master address", n.master_addr
    else:
        return None
    if not _is_loopback(host):
        return None
    others = "the other node" if n.num_nodes == 2 else f"the other {n.num_nodes - 1} nodes"
    return (f"{what} {host.strip()} is this host itself: {others} must reach node 0 there, so only nodes "
            f"on this host can join; on other machines give every node node 0's network address "
            f"(--master-addr HOST, nodes.master_addr). The ranks wait at the rendezvous until all "
            f"{n.num_nodes} nodes have come")


def _kind_fields(cfg) -> dict:
    """run_started's fields that depend on what the ranks run: the run's length for our loop; for
    a user's script, kind "script" and its command line (the length is the script's to know)."""
    kind = kind_of(cfg)
    if kind.loop_config:
        return {**length(cfg).fields(), "loss": loss_said(cfg.train.loss)}  # total_steps, epochs, end_epoch, ends_by; train.loss
    from ..launch.ranks import command

    return {"run_kind": kind.name, "command": command(cfg.script), "total_steps": None, "epochs": None,
            "end_epoch": None, "ends_by": None, "steps_per_epoch": None}


def _pick_free_gpus(cfg) -> list:
    """devices: free:N still unresolved (a config written before launch): pick the GPUs now, or
    refuse with who uses what (ConfigError)."""
    from ..config import ConfigError, free_gpus_asked
    from ..hardware import detect_hardware, resolve_free_gpus

    if cfg.accelerator != "cuda" or free_gpus_asked(cfg.devices) is None:
        return []
    hw, problems = detect_hardware(), []
    resolve_free_gpus(cfg, hw, problems)
    if problems:
        raise ConfigError(problems)
    return [("info", n) for n in hw.notes]


def _host_devices(cfg, rd) -> list:
    """devices: all and free:N made this host's GPUs; the notes that say which and why."""
    if cfg.accelerator == "cuda" and cfg.devices == "all":
        import torch

        from ..hardware import Hardware

        resolve_all_gpus(cfg, Hardware(gpu_count=torch.cuda.device_count()))
    picked = [("info", n) for n in rd.origin().get("host_notes") or [] if isinstance(n, str)]
    return picked + _pick_free_gpus(cfg)


def make_plan(cfg, rd, script: bool) -> Plan:
    """Everything decided before a rank starts: port, store socket, threads, environment.
    No torch here: the ranks start importing theirs at once, and the store they meet at is
    served by local rank 0 on the socket bound here (one torch import on the critical path)."""
    from ..affinity import threads_for

    port, port_msg = choose_port(cfg)
    picked = _host_devices(cfg, rd)
    strategy = get_strategy(cfg.strategy)
    notes = picked + list(strategy.resolve(cfg, rd.path))  # deepspeed: the user's ds_config
    threads = threads_for(cfg, strategies.nproc_per_node(cfg))
    child_env = {"OMP_NUM_THREADS": str(threads)}
    if script:  # script.env's, else one exported to torchdeck, as torchrun keeps it
        from ..launch.env import threads_of

        threads = threads_of(cfg.script.env, os.environ, threads)
        del child_env["OMP_NUM_THREADS"]  # the ranks' environment sets it (engine.launch.env.rank_env)
    store = None  # the store's socket, until local rank 0 has its own copy
    meet = cfg.nodes.master_addr
    # a script's rank 0 binds the port itself (init_process_group's env://): it is not held here
    if strategy.distributed and not script and not cfg.init_method.startswith("file://") \
            and cfg.nodes.node_rank == 0:
        store, port_msg = bind_store(cfg, port, port_msg)
        meet, port = store.meet, store.port
        child_env["TORCHELASTIC_USE_AGENT_STORE"] = "True"  # the other ranks are its clients
    if cfg.nodes.ifname:
        for var in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
            child_env[var] = os.environ.get(var, cfg.nodes.ifname)
    lone = lone_node_warning(cfg)
    if lone:
        notes = [*notes, ("warning", lone)]
    return Plan(port, port_msg, notes, threads, child_env, store, meet)


def announce(cfg, plan: Plan, rd, writer) -> None:
    """run_started and the supervisor's notes, written before any rank exists."""
    strategy = get_strategy(cfg.strategy)
    nproc = strategies.nproc_per_node(cfg)
    writer.write(events.make(
        "run_started", run=rd.name, strategy=cfg.strategy, world_size=strategies.world_size(cfg),
        nproc_per_node=nproc, node_rank=cfg.nodes.node_rank, num_nodes=cfg.nodes.num_nodes,
        global_batch=strategies.global_batch(cfg),
        devices=[", ".join(strategy.local_devices(cfg, i)) for i in range(nproc)],
        master_addr=cfg.nodes.master_addr, master_port=plan.port, pid=os.getpid(),
        host=socket.gethostname(), threads_per_rank=plan.threads, **_kind_fields(cfg)))
    if plan.port_msg:
        writer.write(events.make("log", rank=None, level="warning" if "in use" in plan.port_msg else "info",
                                 message=plan.port_msg))
    for level, message in plan.notes:
        writer.write(events.make("log", rank=None, level=level, message=message))
