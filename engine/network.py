"""Where a run listens: the rendezvous store's address and the ranks' gloo/NCCL interface.

A c10d store has no authentication, so a run opens it only where its ranks need it: loopback on
one node; on several nodes, the address the other nodes are told to use (nodes.master_addr), or
nodes.ifname's, when that address is this host's. No torch here.
"""
from __future__ import annotations

import errno
import ipaddress
import socket

LOOPBACK = ("127.0.0.1", "::1")
STORE_BACKLOG = 2048  # as the c10d store's own listener: every rank of every node connects at once


def _family(addr: str) -> int:
    return socket.AF_INET6 if ":" in addr else socket.AF_INET


def is_local(addr: str) -> bool:
    """True when this host owns `addr` (it can bind it)."""
    try:
        with socket.socket(_family(addr), socket.SOCK_STREAM) as s:
            s.bind((addr, 0))
    except OSError:
        return False
    return True


def resolve(host: str) -> list[str]:
    """The addresses a host name (or address) stands for, IPv4 first, without duplicates."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return []
    out: list[str] = []
    for fam in (socket.AF_INET, socket.AF_INET6):
        for f, *_, sockaddr in infos:
            if f == fam and sockaddr[0] not in out:
                out.append(sockaddr[0])
    return out


def interface_addresses(ifname: str) -> list[str]:
    """IPv4 then IPv6 addresses of the interfaces in `ifname` ("eth0" or "eth0,eth1"); NCCL-style
    patterns (^docker, =eth0) name no single interface and give nothing."""
    import psutil

    if not ifname or any(c in ifname for c in "^="):
        return []
    have = psutil.net_if_addrs()
    v4, v6 = [], []
    for name in ifname.split(","):
        for a in have.get(name.strip(), []):
            if a.family == socket.AF_INET:
                v4.append(a.address)
            elif a.family == socket.AF_INET6 and not a.address.lower().startswith("fe80"):
                v6.append(a.address.split("%")[0])
    return v4 + v6


def loopback_ifname() -> str:
    """The loopback interface's name ("lo" on Linux), for GLOO_SOCKET_IFNAME on one node."""
    import psutil

    for name, addrs in psutil.net_if_addrs().items():
        if any(a.address.split("%")[0] in LOOPBACK for a in addrs):
            return name
    return "lo"


def store_address(host: str, num_nodes: int, ifname: str = "", ours: bool = True) -> tuple[str, str, str | None]:
    """(bind address, address the store's own client uses, note) for the rendezvous store on node 0.

    `host` is where the ranks are told to meet; `ours` says the supervisor tells them (env://), so
    on one node it can send them to loopback whatever nodes.master_addr says. "" binds every
    interface, and the note says why."""
    if num_nodes == 1 and ours:
        for addr in LOOPBACK:
            if is_local(addr):
                return addr, addr, None
    for addr in resolve(host):
        if is_local(addr):
            return addr, addr, None
    for addr in interface_addresses(ifname):
        if is_local(addr):
            return addr, addr, None
    why = (f"{host} is not an address of this host" + (f", nor has nodes.ifname {ifname} one" if ifname else "")
           + ": the rendezvous store listens on every interface")
    return "", "127.0.0.1", why


def listener(addr: str, port: int) -> socket.socket:
    """A listening TCP socket on addr:port ("" = every interface); OSError(EADDRINUSE) when taken."""
    fam = _family(addr) if addr else socket.AF_INET6 if socket.has_ipv6 else socket.AF_INET
    s = socket.socket(fam, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a previous run's TIME_WAIT is no conflict
        if fam == socket.AF_INET6 and not addr:
            s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)  # "::" serves IPv4 too
        s.bind((addr or ("::" if fam == socket.AF_INET6 else "0.0.0.0"), port))
        s.listen(STORE_BACKLOG)
    except OSError:
        s.close()
        raise
    return s


def address_in_use(exc: OSError) -> bool:
    return exc.errno == errno.EADDRINUSE


def host_problem(value) -> str | None:
    """Why `value` is neither a host name nor an IP address (None when it is one): a name like
    `a;touch${IFS}/tmp/x` would only fail at rendezvous, on another node."""
    v = str(value).strip()
    if not v:
        return "is empty"
    if v != str(value):
        return "has spaces around it"
    try:
        ipaddress.ip_address(v)
        return None
    except ValueError:
        pass
    if v.startswith("[") and v.endswith("]"):
        return "is in brackets: write an IPv6 address without them (::1, not [::1])"
    if not all(c.isascii() and (c.isalnum() or c in "-_.") for c in v):
        return "has characters a host name cannot have (letters, digits, '-', '_' and '.' only)"
    labels = v[:-1].split(".") if v.endswith(".") else v.split(".")
    if len(v) > 253 or not all(0 < len(lab) <= 63 and lab[0] != "-" and lab[-1] != "-" for lab in labels):
        return "is not a host name (parts between dots are 1-63 characters and do not start or end with '-')"
    if all(lab.isdigit() for lab in labels):
        return "is not a valid IPv4 address"
    return None
