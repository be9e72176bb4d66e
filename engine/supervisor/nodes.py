"""The supervisor's side of the node link (engine/nodes): with several nodes, node 0 hears the
others' events, each other node streams its own to node 0, and every node samples its GPUs and
host once a second. Every line of this node's run goes through here, to be sent on as well."""
from __future__ import annotations

import os
import socket

from .. import events, fmt, network
from .ports import meeting_point

NODE_DRAIN_S = 3.0  # node 0, its ranks gone: how long it waits for the other nodes' last events


def say(level: str, message: str) -> None:
    """A line in supervisor.log (this process's output), never raising (a full disk)."""
    try:
        print(f"{level}: {message}", flush=True)
    except OSError:
        pass


class NodeLink:
    def __init__(self, rd, started: float):
        self.rd, self.started = rd, started  # the run's start: a node is lost "at 00:28" of it
        self.nproc = 1  # ranks per node: a lost node's ranks are named
        self.lost: list[str] = []  # node 0: what it said of each node lost (liveness.py), in order
        self.writer = None  # the node's EventWriter, once there is one
        self.sender = None  # engine.nodes.link.Sender: a non-zero node streaming to node 0
        self.receiver = None  # engine.nodes.link.Receiver: node 0, hearing the other nodes
        self.sampler = None  # engine.nodes.sampler.NodeSampler: node_sample once a second (several nodes)

    def put(self, line: str) -> None:
        """A line from this node's ranks (or its sampler): into events.jsonl, and towards node 0
        when this node streams to it. Written in the caller's thread (EventWriter.take)."""
        self.writer.take(line)
        if self.sender is not None:
            self.sender.send(line)

    def write(self, ev: dict) -> None:
        """A supervisor event that node 0 should have too (stacks, rank exits, the link's own news)."""
        self.writer.write(ev)
        if self.sender is not None:
            self.sender.send(events.dumps(ev))

    def open(self, cfg, port: int, writer) -> None:
        """Node 0 listens for the others' events (Receiver), each other node streams its own to
        node 0 (Sender). The threads that need the writer's queue start once the ranks are (start)."""
        from .. import nodes
        from ..nodes import link
        from ..nodes.sampler import NodeSampler
        from ..strategies import nproc_per_node

        self.writer, self.nproc = writer, nproc_per_node(cfg)
        n = cfg.nodes
        secret = os.environ.pop(nodes.ENV_SECRET, "")  # the ranks (a user's script) never see it
        if n.num_nodes <= 1:
            return
        host_name = socket.gethostname()
        meet_host, meet_port, _ = meeting_point(cfg, port)
        try:
            port = int(os.environ.get(nodes.ENV_PORT) or meet_port + nodes.PORT_OFFSET)
        except ValueError:
            port = meet_port + nodes.PORT_OFFSET
        if n.node_rank == 0:
            self._listen(link, secret or self._new_secret(), meet_host, port, n)
        elif not secret:
            self._log("warning", f"node link: {nodes.ENV_SECRET} is not set on this node: its events stay in its "
                                 "own run directory and node 0 does not show its ranks (set it to node 0's secret)")
        else:
            self.sender = link.Sender(meet_host, port, secret, n.node_rank, host_name, log=self._link_log)
            self.sender.start()
        self.sampler = NodeSampler(self.put, n.node_rank, host_name)

    def _log(self, level: str, message: str) -> None:
        self.writer.write(events.make("log", rank=None, level=level, message=message))

    def _listen(self, link, secret: str, meet_host: str, port: int, n) -> None:
        num_nodes = n.num_nodes
        bind, _, note = network.store_address(meet_host, num_nodes, n.ifname)
        try:
            self.receiver = link.Receiver(bind, port, secret, self._remote, log=say, num_nodes=num_nodes,
                                          on_lost=self._lost)
        except Exception as exc:  # noqa: BLE001 - zmq.ZMQError (port taken): the run goes on without it
            self._log("warning", f"node link: cannot listen on {bind or 'every interface'}:{port} ({exc}): the "
                                 "other nodes' events stay on their nodes")
        else:
            self._log("info", f"node link: listening on {self.receiver.endpoint} for the other nodes' events "
                              "and samples" + (f"; {note}" if note else ""))

    def _new_secret(self) -> str:
        """Node 0 without a secret: one for this run, in RUN_DIR/node.key that only its owner reads."""
        import secrets

        from .. import nodes

        secret = secrets.token_hex(32)
        path = self.rd.path / "node.key"
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(secret + "\n")
            said = (f"{nodes.ENV_SECRET} is not set: made one for this run in {path} (readable by you only); "
                    f"start the other nodes with {nodes.ENV_SECRET}=\"$(cat {path})\" in their environment")
        except OSError as exc:
            said = f"{nodes.ENV_SECRET} is not set and {path} cannot be written ({exc}): no other node can stream here"
        self._log("warning", f"node link: {said}")
        return secret

    def start(self) -> None:
        """The threads that feed the writer's queue (it exists once the ranks are started)."""
        for thread in (self.receiver, self.sampler):
            if thread is not None:
                thread.start()

    def _remote(self, line: str) -> None:
        """An event another node streamed here (Receiver's thread)."""
        self.writer.q.put(line)

    def _lost(self, lost) -> None:
        """A node lost (Receiver's thread): a node_lost event, and the run's cause to be (lost_cause)."""
        ranks = list(range(lost.node * self.nproc, (lost.node + 1) * self.nproc))
        gone = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {fmt.rank_span(ranks)}"
        message = (f"node {lost.node} ({lost.host}) lost at {fmt.duration(lost.t - self.started)}: its supervisor "
                   f"stopped reporting ({lost.why}); {gone} gone")
        self.lost.append(message)
        say("error", message)
        self.writer.write(events.make("node_lost", rank=None, node_rank=lost.node, host=lost.host, ranks=ranks,
                                      why=lost.why, lost_t=round(lost.t, 3), message=message))

    def lost_cause(self) -> str | None:
        """Node 0, its ranks failed: the nodes lost, once the link has read what came and any node
        that dropped has its verdict (within liveness.RECONNECT_GRACE_S); None when none is."""
        from ..nodes.liveness import RECONNECT_GRACE_S

        if self.receiver is None:
            return None
        if self.receiver.is_alive():
            self.receiver.settle(RECONNECT_GRACE_S + 2.0)
        return "; ".join(self.lost) or None

    def _link_log(self, level: str, message: str) -> None:
        """What a non-zero node's Sender says (node 0 unreachable, refused, reached): in this node's events."""
        if self.writer is not None:
            self.write(events.make("log", rank=None, level=level, message=message))

    def close(self) -> None:
        """The ranks are gone: the last samples; node 0 waits briefly for the other nodes' last events."""
        if self.sampler is not None:
            self.sampler.stop()
        if self.receiver is not None:
            if self.receiver.is_alive():
                self.receiver.wait_done(NODE_DRAIN_S)
            self.receiver.stop()
            if self.receiver.refused:
                say("warning", f"node link: refused {self.receiver.refused} connection(s) in all")

    def bye(self) -> None:
        """A non-zero node: what is queued, then a bye (node 0 waits for it)."""
        if self.sender is not None:
            self.sender.close()
