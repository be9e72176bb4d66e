"""The rendezvous port: chosen (single node: moved off a taken one; several nodes: never moved)
and held from the moment it is chosen, before any torch import."""
from __future__ import annotations

import dataclasses
import socket

from .. import network
from ..errors import TorchdeckError


def port_in_use(port: int, host: str = "") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


class PortError(TorchdeckError, RuntimeError):
    """The master port cannot be had (multi-node runs never move it silently)."""


def choose_port(cfg) -> tuple[int, str | None]:
    """(port, message): single node picks a free one when needed; multi-node never silently moves."""
    n = cfg.nodes
    if n.num_nodes > 1:
        if n.node_rank == 0 and port_in_use(n.master_port):
            raise PortError(f"nodes.master_port {n.master_port} is in use on this host (node 0); free it "
                            "(a leftover run?) or pick another port on every node")
        return n.master_port, None
    if n.master_port == 0:
        p = free_port()
        return p, f"master port: free port {p} (master_port 0)"
    if port_in_use(n.master_port):
        p = free_port()
        return p, f"port {n.master_port} in use; using {p}"
    return n.master_port, None


def meeting_point(cfg, port: int) -> tuple[str, int, bool]:
    """(host, port, fixed) where the ranks meet: nodes.master_addr and the chosen port for env://,
    or what a tcp:// init method names (fixed: the port may not move to a free one)."""
    if cfg.init_method.startswith("tcp://"):
        host, _, p = cfg.init_method[len("tcp://"):].rpartition(":")
        return host, int(p), True
    return cfg.nodes.master_addr, port, cfg.nodes.num_nodes > 1


@dataclasses.dataclass
class StoreSocket:
    """The rendezvous store's listening socket, bound by the supervisor before any torch import
    and handed to local rank 0, which serves the store on it (engine/worker.py serve_store)."""

    sock: socket.socket
    connect: str  # the address the serving rank's own client uses
    meet: str  # the address the ranks are told (MASTER_ADDR)
    port: int


def bind_store(cfg, port: int, msg: str | None) -> tuple[StoreSocket, str | None]:
    """Bind the rendezvous store's socket now, so the port is held from the moment it is chosen:
    no other run can take it while the ranks import torch. It listens only where the ranks need
    it (engine/network.py): loopback on one node, so the ranks are sent there whatever
    nodes.master_addr says; TCPStore itself would bind every interface, so it is handed this one
    (master_listen_fd). Returns it and the message for the log."""
    n = cfg.nodes
    host, port, fixed = meeting_point(cfg, port)
    ours = cfg.init_method == "env://"
    bind, connect, note = network.store_address(host, n.num_nodes, n.ifname, ours=ours)
    try:
        sock = network.listener(bind, port)
    except OSError as exc:
        if fixed or not network.address_in_use(exc):
            raise PortError(_port_problem(cfg, port, bind, exc)) from exc
        sock = network.listener(bind, 0)
        msg = f"port {port} in use; using {sock.getsockname()[1]}"
    if note:
        msg = f"{msg}; {note}" if msg else note
    port = sock.getsockname()[1]
    return StoreSocket(sock, connect, connect if n.num_nodes == 1 and ours else host, port), msg


def _port_problem(cfg, port: int, bind: str, exc: OSError) -> str:
    where = "init_method's port" if cfg.init_method.startswith("tcp://") else "nodes.master_port"
    if network.address_in_use(exc):
        return (f"{where} {port} is in use on this host (node 0); free it (a leftover run?) or pick "
                f"another port" + (" on every node" if cfg.nodes.num_nodes > 1 else ""))
    return f"{where} {port}: cannot listen on {bind or 'every interface'}: {exc.strerror or exc}"

