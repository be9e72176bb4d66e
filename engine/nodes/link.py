"""The connection between a node's supervisor and node 0's: ZeroMQ PUSH (each other node) to PULL
(node 0), authenticated and encrypted with CURVE.

Authentication, chosen: CURVE (ZeroMQ's own CurveZMQ handshake), with both key pairs derived from
the run's secret (HMAC-SHA256 of the secret with a fixed label per role), and a ZAP handler on
node 0 that admits only the client key derived from the same secret. Why CURVE and not
Jupyter-style HMAC-SHA256-signed messages (the kernel protocol's scheme, considered): with
signatures, a stranger's connection is accepted and every message it sends must be read and
checked (it can fill the queue and the high-water mark the real nodes share, and its bytes
reach our parser); with CURVE the handshake refuses a peer that lacks the secret before one of
its messages is read, and the stream is encrypted too (rank events carry hosts, paths,
tracebacks). A wrong secret, a stranger's connection, garbage bytes on the port: each ends in a
failed handshake, counted and written to supervisor.log, never an event. What an admitted node
sends is still checked line by line (JSON objects of known kinds; run_started/run_finished are
node 0's own), since a bug must not break node 0's file.

The wire: one ZeroMQ message per batch, three frames: b"td1", a JSON header {"node_rank": int,
"host": str}, and the batch's events as JSON lines joined by "\\n". A last message with the header's
"bye": true says the node is done. The sender batches what comes in over BATCH_S, and sends an
empty batch after KEEPALIVE_S with nothing to send; sends never block (a full high-water mark or
an unreachable node 0 past it drops the batch and counts it: node k's own events.jsonl has
everything), but for the bye, which waits up to BYE_WAIT_S for room: without it node 0 would take
the node's close for its death. ZeroMQ reconnects by itself.

Both ends send ZeroMQ heartbeats (a PING every HEARTBEAT_IVL_S; a connection silent for
HEARTBEAT_TIMEOUT_S is closed), and node 0 watches each node's connection: a node whose supervisor
stops reporting is lost (engine/nodes/liveness.py says when) and the Receiver's `on_lost` hears it.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from collections import deque

from .. import events
from .liveness import HEARTBEAT_IVL_S, HEARTBEAT_TIMEOUT_S, Liveness

PROTO = b"td1"
BATCH_S = 0.05
BATCH_MAX = 2000  # lines per message
SEND_HWM = 1000  # messages queued towards node 0 (each up to BATCH_MAX events)
RECV_HWM = 10000
PENDING_MAX = 200_000  # lines held by the sender before it drops (node 0 slower than the ranks)
BYE_WAIT_S = 2.0  # the bye waits this long for room past the high-water mark (the others are dropped)
KEEPALIVE_S = 1.0  # a batch at least this often, empty when there is nothing (liveness.SILENT_S counts them)
UNREACHABLE_S = 10.0  # no handshake this long: the node says its events stay local
SAY_EVERY_S = 60.0  # a repeated problem is said at most once a minute
ZAP_ENDPOINT = "inproc://zeromq.zap.01"
NOT_FORWARDED = ("run_started", "run_finished", "node_lost")  # each node's own; node 0 has its own ones


def _key(secret: str, label: bytes) -> bytes:
    return hmac.new(secret.encode("utf-8"), label, hashlib.sha256).digest()


class Keys:
    """The CURVE key pairs of a run, derived from its secret (Z85 text, as ZeroMQ takes them)."""

    def __init__(self, secret: str):
        import zmq
        from zmq.utils import z85

        if not secret:
            raise ValueError("an empty node secret")
        self.server_secret = z85.encode(_key(secret, b"torchdeck node link: server"))
        self.server_public = zmq.curve_public(self.server_secret)
        self.client_secret = z85.encode(_key(secret, b"torchdeck node link: client"))
        self.client_public = zmq.curve_public(self.client_secret)
        self.client_public_raw = z85.decode(self.client_public)


def endpoint(host: str, port: int) -> str:
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"


def tag(line: str, node_rank: int, host: str) -> str:
    """A JSON object line with node_rank and host appended when it lacks node_rank (a string
    operation: the sender never parses; node 0 checks every line anyway)."""
    if line.endswith("}") and '"node_rank":' not in line:
        return f'{line[:-1]},"node_rank":{int(node_rank)},"host":{json.dumps(host)}}}'
    return line


class _Say:
    """At most one line per `every` seconds for each problem; the count of the ones not said."""

    def __init__(self, log, every: float = SAY_EVERY_S):
        self.log, self.every = log, every
        self.last: dict[str, float] = {}
        self.hidden: dict[str, int] = {}

    def __call__(self, key: str, level: str, message: str) -> None:
        now = time.monotonic()
        if now - self.last.get(key, float("-inf")) < self.every:
            self.hidden[key] = self.hidden.get(key, 0) + 1
            return
        more = self.hidden.pop(key, 0)
        self.last[key] = now
        try:
            self.log(level, message + (f" ({more} more like it not said)" if more else ""))
        except Exception:  # noqa: BLE001 - a log line never ends the link
            pass


def _heartbeats(sock) -> None:
    """ZeroMQ's PINGs on each connection of `sock`; one silent past the timeout is closed (liveness.py)."""
    sock.heartbeat_ivl = int(HEARTBEAT_IVL_S * 1000)
    sock.heartbeat_timeout = int(HEARTBEAT_TIMEOUT_S * 1000)


# ----------------------------------------------------------------------------- node 0


class Receiver(threading.Thread):
    """Node 0's end: binds host:port (PULL, CURVE server, ZAP admitting the run's client key only)
    and hands each checked event line to `put` (the EventWriter's queue).

    Counters: received (event lines handed on), batches, rejected_lines (admitted but not an
    event), refused (connections that failed the handshake: wrong secret, stranger, garbage).
    `log(level, message)` hears of refusals (supervisor.log), at most once a minute each;
    `on_lost(Lost)` of a node lost (liveness.py), in this thread."""

    def __init__(self, host: str, port: int, secret: str, put, log=lambda level, message: None,
                 num_nodes: int | None = None, on_lost=lambda lost: None):
        super().__init__(name="node-receiver", daemon=True)
        import zmq

        self.put, self.num_nodes = put, num_nodes
        self.say = _Say(log)
        self.keys = Keys(secret)
        self.received = self.batches = self.rejected_lines = self.refused = 0
        self.refusals: list[str] = []  # why, newest last (the first 100)
        self.nodes: dict[int, str] = {}  # node_rank -> host, of every node heard from
        self.done_nodes: set[int] = set()
        self.liveness, self.on_lost = Liveness(), on_lost
        self.ticks = 0  # turns of the thread's loop (settle waits for what is pending to be read)
        self._changed = threading.Condition()
        self._ending = threading.Event()
        self.ctx = zmq.Context()
        self.zap = self.ctx.socket(zmq.REP)  # before the server binds: without a handler ZAP admits all
        self.zap.linger = 0
        self.zap.bind(ZAP_ENDPOINT)
        self.pull = self.ctx.socket(zmq.PULL)
        try:
            self.pull.linger = 0
            self.pull.rcvhwm = RECV_HWM
            self.pull.ipv6 = ":" in host
            self.pull.curve_server = True
            self.pull.curve_secretkey = self.keys.server_secret
            self.pull.curve_publickey = self.keys.server_public
            self.pull.zap_domain = b"torchdeck"
            self.pull.setsockopt(zmq.MAXMSGSIZE, 64 << 20)
            _heartbeats(self.pull)
            self.monitor = self.pull.get_monitor_socket(
                zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                | zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED)
            self.pull.bind(endpoint(host or "0.0.0.0", port))
        except zmq.ZMQError:
            self._close_sockets()
            raise
        self.endpoint = self.pull.getsockopt_string(zmq.LAST_ENDPOINT)
        self.port = int(self.endpoint.rsplit(":", 1)[1])

    # ------------------------------------------------------------ the thread
    def run(self) -> None:
        import zmq

        poller = zmq.Poller()
        for s in (self.pull, self.monitor, self.zap):
            poller.register(s, zmq.POLLIN)
        try:
            while not self._ending.is_set():
                for sock, _ in poller.poll(200):
                    if sock is self.pull:
                        self._drain()
                    elif sock is self.zap:
                        self._authenticate()
                    else:
                        self._watch()
                self._judge()
            self._drain()
        finally:
            self._close_sockets()

    def _drain(self) -> None:
        import zmq

        for _ in range(1000):  # then look at the other sockets again
            try:
                parts = self.pull.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            try:
                fd = parts[0].get(zmq.SRCFD)  # the connection it came on: its close names the node
            except zmq.ZMQError:
                fd = None
            self._batch([p.bytes for p in parts], fd)

    def _judge(self) -> None:
        """Lost nodes said (once each); then the loop's turn is counted for settle()."""
        lost = self.liveness.due()
        for one in lost:
            try:
                self.on_lost(one)
            except Exception as exc:  # noqa: BLE001 - the link outlives a failing listener
                self.say("on_lost", "warning", f"node link: saying node {one.node} lost failed: {exc}")
        with self._changed:
            self.ticks += 1
            self._changed.notify_all()

    def _batch(self, frames: list, fd: int | None = None) -> None:
        header = None
        if len(frames) == 3 and frames[0] == PROTO:
            try:
                header = json.loads(frames[1])
            except ValueError:
                header = None
        node = header.get("node_rank") if isinstance(header, dict) else None
        host = header.get("host") if isinstance(header, dict) else None
        if (not isinstance(node, int) or isinstance(node, bool) or node < 1 or not isinstance(host, str)
                or (self.num_nodes and node >= self.num_nodes)):
            self.rejected_lines += 1
            self.say("malformed", "warning", "node link: a message that is not a node's batch, dropped")
            return
        self.batches += 1
        if node not in self.nodes:
            self.say(f"node{node}", "info", f"node link: node {node} ({host}) streams its events here")
        self.nodes[node] = host
        self.liveness.batch(node, host, fd)
        for line in frames[2].split(b"\n"):
            if line:
                self._line(line, node, host)
        if header.get("bye"):
            self.liveness.bye(node)
            with self._changed:
                self.done_nodes.add(node)
                self._changed.notify_all()

    def _line(self, raw: bytes, node: int, host: str) -> None:
        ev = events.parse(raw)
        kind = ev.get("kind") if ev is not None else None
        if kind not in events.KINDS or kind in NOT_FORWARDED:
            self.rejected_lines += 1
            return
        if "node_rank" in ev and "host" in ev:
            line = raw.decode("utf-8", "replace")
        else:
            ev.setdefault("node_rank", node)
            ev.setdefault("host", host)
            line = events.dumps(ev)
        self.received += 1
        self.put(line)

    def _authenticate(self) -> None:
        """A ZAP request (RFC 27): admit the run's client key, refuse anything else."""
        import zmq

        try:
            frames = self.zap.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            return
        version, request_id = (frames + [b"", b""])[:2]
        address = frames[3].decode("ascii", "replace") if len(frames) > 3 else "?"
        mechanism = frames[5] if len(frames) > 5 else b""
        key = frames[6] if len(frames) > 6 else b""
        ok = mechanism == b"CURVE" and hmac.compare_digest(key, self.keys.client_public_raw)
        if not ok:
            self._refused(f"a connection from {address} with another key (not this run's secret)", "zap")
        self.zap.send_multipart([b"1.0", request_id, b"200" if ok else b"400",
                                 b"OK" if ok else b"not this run's node", b"", b""])

    def _watch(self) -> None:
        import zmq
        from zmq.utils.monitor import recv_monitor_message

        try:
            msg = recv_monitor_message(self.monitor, zmq.NOBLOCK)
        except zmq.Again:
            return
        ev = msg.get("event")
        if ev == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            return
        if ev == zmq.EVENT_DISCONNECTED:
            self._drain()  # a bye that came just before the close is read first
            self.liveness.closed(int(msg.get("value", -1)))
            return
        if ev == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
            return  # said by _authenticate, with the peer's address
        self._refused("a connection that failed the handshake (a wrong secret, or bytes that are "
                      "not this protocol)", "handshake")

    def _refused(self, why: str, key: str) -> None:
        self.refused += 1
        if len(self.refusals) < 100:
            self.refusals.append(why)
        self.say(key, "warning", f"node link {self.endpoint}: refused {why}")

    def _close_sockets(self) -> None:
        for name in ("monitor", "pull", "zap"):
            s = getattr(self, name, None)
            if s is not None:
                try:
                    if name == "pull":
                        s.disable_monitor()
                except Exception:  # noqa: BLE001
                    pass
                s.close(0)
        self.ctx.term()

    # ------------------------------------------------------------ control
    def wait_done(self, timeout: float) -> bool:
        """Until every node heard from said bye (its ranks are gone) or is lost, or timeout: True if all did."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while set(self.nodes) - self.done_nodes - set(self.liveness.lost):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(left)
        return True

    def settle(self, timeout: float) -> None:
        """Until what the sockets hold now is read (two turns of the loop) and no node that dropped
        waits for its verdict (a reconnect, or lost), or timeout: node 0's ranks failed, and whether
        a node's death is why is known before the run's cause is written."""
        deadline = time.monotonic() + timeout
        with self._changed:
            start = self.ticks
            while self.is_alive() and (self.ticks < start + 2 or self.liveness.waiting()):
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self._changed.wait(left)

    def stop(self, timeout: float = 5.0) -> None:
        """Read what has arrived, then close the port."""
        self._ending.set()
        if self.is_alive():
            self.join(timeout)
        elif not self.pull.closed:
            self._close_sockets()


# ----------------------------------------------------------------------------- node k


class Sender(threading.Thread):
    """A non-zero node's end: send(line) from any thread, never blocking; a thread batches the
    lines to node 0 (PUSH, CURVE client). `log(level, message)` hears whether node 0 is reached:
    the supervisor writes it into the node's own events.jsonl."""

    def __init__(self, host: str, port: int, secret: str, node_rank: int, node_host: str,
                 log=lambda level, message: None):
        super().__init__(name="node-sender", daemon=True)
        import zmq

        self.node_rank, self.node_host = node_rank, node_host
        self.where = f"{host}:{port}"
        self.log, self.say = log, _Say(log)
        self.pending: deque = deque()
        self.sent = self.dropped = 0
        self.connected = False
        self._ending = threading.Event()
        self._header = json.dumps({"node_rank": node_rank, "host": node_host}).encode()
        keys = Keys(secret)
        self.ctx = zmq.Context()
        self.push = self.ctx.socket(zmq.PUSH)
        self.push.sndhwm = SEND_HWM
        self.push.linger = 2000  # at the end: what is queued gets 2 s to leave
        self.push.ipv6 = ":" in host
        self.push.reconnect_ivl = 500
        self.push.reconnect_ivl_max = 5000
        _heartbeats(self.push)
        self.push.curve_serverkey = keys.server_public
        self.push.curve_publickey = keys.client_public
        self.push.curve_secretkey = keys.client_secret
        self.monitor = self.push.get_monitor_socket(
            zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
            | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_DISCONNECTED)
        self.push.connect(endpoint(host, port))
        self.started = time.monotonic()
        self._warned_unreachable = False
        self._sent_t = float("-inf")  # the last batch sent (monotonic)

    def send(self, line: str) -> None:
        """Queue one event line for node 0 (tagged with this node); drops and counts past PENDING_MAX."""
        if len(self.pending) >= PENDING_MAX:
            self.dropped += 1
            return
        self.pending.append(tag(line, self.node_rank, self.node_host))

    def run(self) -> None:
        try:
            while not self._ending.is_set():
                self._ending.wait(BATCH_S)
                self._watch()
                if not self.pending and time.monotonic() - self._sent_t >= KEEPALIVE_S:
                    self._flush(empty=True)  # nothing to send: an empty batch says this supervisor lives
                self._flush()
            self._flush(bye=True)
        finally:
            self.monitor.close(0)
            self.push.close()  # lingers up to 2 s for what is queued
            self.ctx.term()

    def _flush(self, bye: bool = False, empty: bool = False) -> None:
        import zmq

        while self.pending or bye or empty:
            empty, self._sent_t = False, time.monotonic()
            batch = []
            while self.pending and len(batch) < BATCH_MAX:
                batch.append(self.pending.popleft())
            last = bye and not self.pending
            header = self._header if not last else json.dumps(
                {"node_rank": self.node_rank, "host": self.node_host, "bye": True}).encode()
            if last and self.connected:  # a bye dropped would read as this node's death (liveness.py)
                self.push.sndtimeo = int(BYE_WAIT_S * 1000)
            try:
                self.push.send_multipart([PROTO, header, "\n".join(batch).encode("utf-8")],
                                         0 if last and self.connected else zmq.NOBLOCK)
                self.sent += len(batch)
            except zmq.Again:  # high-water mark reached: node 0 unreachable or slow
                self.dropped += len(batch)
                self.say("hwm", "warning", f"node link: node 0 at {self.where} is not taking events: "
                         f"{self.dropped} dropped so far (this node's events.jsonl has them all)")
            if last:
                return

    def _watch(self) -> None:
        import zmq
        from zmq.utils.monitor import recv_monitor_message

        while True:
            try:
                msg = recv_monitor_message(self.monitor, zmq.NOBLOCK)
            except zmq.Again:
                break
            ev = msg.get("event")
            if ev == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                if not self.connected:
                    self.connected = True
                    if self._warned_unreachable:
                        self.log("info", f"node link: reached node 0 at {self.where}: streaming this node's events")
            elif ev == zmq.EVENT_DISCONNECTED:
                self.connected = False
            else:
                self.say("refused", "warning", f"node link: node 0 at {self.where} refused this node "
                         f"(is TORCHDECK_NODE_SECRET the same as node 0's?): this node's events stay in its "
                         "own run directory")
        if (not self.connected and not self._warned_unreachable
                and time.monotonic() - self.started > UNREACHABLE_S):
            self._warned_unreachable = True
            self.log("warning", f"node link: cannot reach node 0's supervisor at {self.where} "
                     f"(after {UNREACHABLE_S:g} s): this node's events stay in its own run directory and node "
                     "0 does not show its ranks until it is reached")

    def close(self, timeout: float = 5.0) -> None:
        """Send what is queued and a bye, then close (waits at most ~2 s for an unreachable node 0)."""
        self._ending.set()
        if self.is_alive():
            self.join(timeout)
