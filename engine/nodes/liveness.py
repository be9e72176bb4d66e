"""When node 0 calls another node lost: the rules, without sockets (the Receiver feeds them what
its connections do; tests feed them times).

A node is lost when node 0 stops hearing from its supervisor, and only then:
- a node that said bye (its supervisor ended on its own) is never lost, whatever its socket does next;
- its connection closed without a bye, and no batch of it came back within RECONNECT_GRACE_S: its
  supervisor's process is gone (a SIGKILL, a crash: the kernel closes its socket at once) or the
  link broke for longer than a reconnect takes. ZeroMQ reconnects a sender that is alive after
  500 ms (link.Sender's reconnect_ivl), and a live supervisor's link sends a batch at least every
  second (link.KEEPALIVE_S: an empty one when it has nothing), so a live node is heard again well
  within the grace;
- no heartbeat for HEARTBEAT_TIMEOUT_S (a host that lost power, a cable pulled: no packet at all,
  so no close either): ZeroMQ closes the connection itself, and the rule above applies;
- connected but not one batch for SILENT_S: its process lives (ZeroMQ's own thread still answers
  heartbeats) but its Python has stopped (a deadlock). A process stopped whole (SIGSTOP, a frozen
  host) answers no heartbeat either: the case above.

Why these figures, with margin for a node under load: heartbeats are answered by ZeroMQ's own I/O
thread, in C, without Python's lock, so a supervisor busy in Python or a host whose cores the
ranks saturate still answers each ping within milliseconds; 10 s of silence is ten pings
unanswered, which a live host on a working network does not do (TCP's own retransmissions take
under 2 s to get through a brief loss). The batches come from Python (the link's thread, which
load can delay, but which waits on nothing else: not on the ranks, not on NVML): SILENT_S allows 30
of them to be missed. Either way node 0's ranks
usually learn first (gloo fails as soon as a peer's socket closes): these bounds are for the silent
deaths, which would otherwise wait nodes.timeout_s in a collective.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

HEARTBEAT_IVL_S = 1.0
HEARTBEAT_TIMEOUT_S = 10.0
RECONNECT_GRACE_S = 3.0
SILENT_S = 30.0


@dataclass(frozen=True)
class Lost:
    node: int
    host: str
    t: float  # wall time it was last known alive: its connection's close, or its last batch
    why: str  # "its connection closed without a goodbye", "no heartbeat for 10 s", ...


class Liveness:
    """Each node's last batch, its connection (a socket's fd) and its bye; due() says who is lost.
    Not thread-safe: the Receiver's thread is its one user."""

    def __init__(self, clock=time.monotonic, wall=time.time):
        self.clock, self.wall = clock, wall
        self.hosts: dict[int, str] = {}
        self.heard: dict[int, float] = {}  # node -> clock of its last batch
        self.fds: dict[int, int] = {}  # a connection's fd -> the node whose batches come on it
        self.dropped: dict[int, tuple[float, str]] = {}  # node -> (clock of the close, why), no verdict yet
        self.done: set[int] = set()  # said bye
        self.lost: dict[int, Lost] = {}

    def batch(self, node: int, host: str, fd: int | None) -> None:
        """A batch of `node` came (on connection `fd`, when known): alive, and reconnected if it had dropped."""
        self.hosts[node] = host
        self.heard[node] = self.clock()
        self.dropped.pop(node, None)
        if fd is not None and fd >= 0:
            self.fds[fd] = node

    def bye(self, node: int) -> None:
        self.done.add(node)
        self.dropped.pop(node, None)

    def closed(self, fd: int) -> None:
        """A connection closed (by its peer, or by ZeroMQ after HEARTBEAT_TIMEOUT_S without a packet)."""
        node = self.fds.pop(fd, None)
        if node is None or node in self.done or node in self.lost:
            return
        now = self.clock()
        quiet = now - self.heard.get(node, now)
        why = (f"no heartbeat for {quiet:.0f} s (its host down, or the network to it)"
               if quiet >= HEARTBEAT_TIMEOUT_S * 0.8 else "its connection closed without a goodbye")
        self.dropped[node] = (now, why)

    def waiting(self) -> bool:
        """A node dropped and its grace is not over: no verdict yet."""
        return bool(self.dropped)

    def due(self) -> list[Lost]:
        """The nodes lost since the last call (each said once)."""
        now, out = self.clock(), []
        for node, (t, why) in list(self.dropped.items()):
            if now - t >= RECONNECT_GRACE_S:
                del self.dropped[node]
                out.append(self._lose(node, t, why))
        for node, t in self.heard.items():
            if node not in self.done and node not in self.lost and node not in self.dropped and now - t >= SILENT_S:
                out.append(self._lose(node, t, f"connected but silent for {now - t:.0f} s"))
        return out

    def _lose(self, node: int, t: float, why: str) -> Lost:
        lost = self.lost[node] = Lost(node, self.hosts.get(node, "?"), self.wall() - (self.clock() - t), why)
        return lost
