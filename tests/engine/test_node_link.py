"""Issue 31: events travel per rank, then per node. A rank killed mid-send silences only itself
(each rank has its own pipe); node 0's port admits only the run's nodes (CURVE keys from the
run's secret): a wrong secret, a stranger's connection and garbage bytes are refused, said in
supervisor.log, and write nothing, while the real node's events keep arriving. The two-node
run itself (node 1's steps and samples in node 0's file) is tests/engine/test_multinode.py."""
from __future__ import annotations

import json
import os
import queue
import socket
import time

import pytest

from torchdeck.engine import events
from tests.engine.helpers import Run, ddp_cfg

MID_SEND = '''
import gc, os, signal, sys
from torchdeck.engine.models import mlp


def dies_mid_send(info, at=3, rank="1"):
    """In the forward of its at-th step, rank `rank` is SIGKILLed while sending an event: half a
    line in its own pipe (today), or holding the shared queue's write lock (before issue 31)."""
    net = mlp(info, 32)
    calls = [0]

    def hook(mod, args):
        if not mod.training or os.environ.get("RANK") != rank:
            return
        calls[0] += 1
        if calls[0] < at:
            return
        reporter = getattr(sys.modules.get("torchdeck.engine.worker"), "REPORTER", None)
        if reporter is not None:
            os.write(reporter.channel.fd, b'{"v":1,"kind":"step","t":1.0,"rank":1,"ste')
        else:
            import multiprocessing.queues
            for q in [o for o in gc.get_objects() if isinstance(o, multiprocessing.queues.Queue)]:
                q._wlock.acquire()
        os.kill(os.getpid(), signal.SIGKILL)
    net.register_forward_pre_hook(hook)
    return net
'''


@pytest.mark.slow
def test_a_rank_killed_mid_send_silences_only_itself(tmp_path, runs):
    """Rank 1 dies by SIGKILL in the middle of sending an event. Rank 0 then fails in the
    all-reduce (its peer is gone): its error reaches events.jsonl, and the run ends failed naming
    rank 1's SIGKILL. On the shared queue rank 0's error never arrived (the lock died with rank 1)."""
    (tmp_path / "midsend.py").write_text(MID_SEND)
    r = Run(tmp_path, ddp_cfg(**{"model.name": "midsend:dies_mid_send", "model.kwargs": {"at": 3},
                                 "train.max_steps": 50, "nodes.timeout_s": 30}))
    runs.append(r)
    assert r.wait(timeout=120) == 1, r.output()
    ev = r.events()
    errors = [e for e in ev if e["kind"] == "error"]
    assert [e["rank"] for e in errors] == [0], (errors, r.output())  # the peer lost, said by rank 0 itself
    assert {e["rank"] for e in ev if e["kind"] == "step"} == {0, 1}  # both reported until then
    exits = {e["rank"]: e["signal"] for e in ev if e["kind"] == "rank_exited"}
    assert exits[1] == "SIGKILL", exits  # (rank 0 leaves on its own, or is stopped when slow to: a loaded host)
    assert "rank 1 killed by signal 9 (SIGKILL)" in r.status()["root_cause"], r.status()
    assert all(line.endswith(b"\n") for line in (r.dir / "events.jsonl").read_bytes().splitlines(keepends=True))


SECRET = "this run's secret"


def _step(rank: int, step: int) -> str:
    return events.dumps(events.make("step", rank=rank, step=step, loss=1.0))


def _wait(pred, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_node_port_refuses_wrong_secret_stranger_and_garbage_while_the_node_streams(tmp_path):
    """Node 0's receiver on a real loopback port, writing through the supervisor's EventWriter;
    node 1 streams steps all along. A node with another secret, a stranger's second connection
    (the run's server key but its own client key; and one without CURVE), and garbage bytes:
    each refused at the handshake, counted and said, none of their events written; node 1's
    steps all arrive in order."""
    import zmq

    from torchdeck.engine.nodes.link import Keys, Receiver, Sender
    from torchdeck.engine.supervisor import EventWriter

    path = tmp_path / "events.jsonl"
    writer = EventWriter(path, queue.Queue())
    writer.start()
    said: list[str] = []
    receiver = Receiver("127.0.0.1", 0, SECRET, writer.q.put, log=lambda level, m: said.append(m), num_nodes=4)
    receiver.start()
    node1 = Sender("127.0.0.1", receiver.port, SECRET, 1, "node-one")
    node1.start()
    wrong = Sender("127.0.0.1", receiver.port, "another run's secret", 2, "node-two")
    ctx = zmq.Context()
    stranger = ctx.socket(zmq.PUSH)
    plain = ctx.socket(zmq.PUSH)
    garbage = []
    try:
        step = 0
        node1.send(_step(2, step := step + 1))
        _wait(lambda: receiver.received >= 1, 10, "node 1's first event")
        wrong.start()
        wrong.send(_step(4, 1))
        public, secret = zmq.curve_keypair()
        stranger.curve_serverkey = Keys(SECRET).server_public  # knows the server's key, not the secret
        stranger.curve_publickey, stranger.curve_secretkey = public, secret
        for sock in (stranger, plain):
            sock.linger = 0
            sock.connect(f"tcp://127.0.0.1:{receiver.port}")
            sock.send_multipart([b"td1", b'{"node_rank":3,"host":"x"}', _step(6, 1).encode()], zmq.NOBLOCK)
        for payload in (os.urandom(4096), b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
                        b"\xff" + bytes(8) + b"\x7f\x03\x01NULL" + bytes(16)):  # a ZMTP greeting, no CURVE
            s = socket.create_connection(("127.0.0.1", receiver.port))
            s.sendall(payload)
            garbage.append(s)
        deadline = time.monotonic() + 20
        while receiver.refused < 5 and time.monotonic() < deadline:
            node1.send(_step(2, step := step + 1))  # the real node keeps streaming meanwhile
            time.sleep(0.05)
        assert receiver.refused >= 5, (receiver.refused, receiver.refusals)
        node1.send(_step(2, step := step + 1))
        node1.close()
        assert receiver.wait_done(10)
    finally:
        wrong.close()
        for s in garbage:
            s.close()
        stranger.close(0)
        plain.close(0)
        ctx.term()
        receiver.stop()
        writer.stop()
        writer.close()
    written = events.read_all(path)
    assert [(e["rank"], e["step"], e["node_rank"], e["host"]) for e in written] == \
        [(2, k, 1, "node-one") for k in range(1, step + 1)]  # every one, in order, and nothing else
    assert receiver.rejected_lines == 0 and receiver.nodes == {1: "node-one"}
    assert any("another key" in r for r in receiver.refusals)  # the stranger, refused by ZAP with its address
    assert any("failed the handshake" in r for r in receiver.refusals)  # wrong secret, plain, garbage
    assert any("refused a connection from 127.0.0.1 with another key" in m for m in said), said
    assert any("refused a connection that failed the handshake" in m for m in said), said
    assert json.loads(path.read_text().splitlines()[-1])["step"] == step


def test_an_exported_sbatch_job_makes_its_own_secret_when_it_runs():
    """`torchdeck export --sbatch`: the script holds no secret; each run of it makes a new one
    (64 hex digits), given to srun's environment only: the batch shell does not export it."""
    import re
    import subprocess

    from torchdeck.engine import config as cfgmod
    from torchdeck.engine.export import sbatch
    from tests.engine.helpers import small_cfg

    text = sbatch(cfgmod.from_dict(small_cfg(strategy="ddp", **{"nodes.num_nodes": 2})))
    (line,) = [ln for ln in text.splitlines() if ln.startswith("TD_SECRET=")]
    made = [subprocess.run(["bash", "-c", f'{line}; echo "$TD_SECRET"; env | grep -c SECRET || true'],
                           capture_output=True, text=True, timeout=30).stdout.split() for _ in range(2)]
    assert all(re.fullmatch(r"[0-9a-f]{64}", m[0]) and m[1] == "0" for m in made) and made[0] != made[1], made
    assert made[0][0] not in text
    (srun,) = [ln for ln in text.splitlines() if " srun --" in ln]
    assert srun.startswith('TORCHDECK_NODE_SECRET="$TD_SECRET" srun '), srun  # this command's environment only
    assert "export TORCHDECK_NODE_SECRET" not in text


def test_a_node_that_cannot_reach_node_0_says_so_and_keeps_going(monkeypatch):
    """Nothing listens on node 0's port: the sender never blocks its callers, and says once (after
    UNREACHABLE_S) that this node's events stay in its own run directory."""
    from torchdeck.engine.nodes import link

    monkeypatch.setattr(link, "UNREACHABLE_S", 0.3)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nobody there
    said = []
    sender = link.Sender("127.0.0.1", port, SECRET, 1, "node-one", log=lambda level, m: said.append((level, m)))
    sender.start()
    t0 = time.monotonic()
    for k in range(2000):
        sender.send(_step(2, k))
    assert time.monotonic() - t0 < 1.0  # queued, never waiting for node 0
    _wait(lambda: said, 10, "the sender to say node 0 is unreachable")
    sender.close(timeout=10)
    assert not sender.is_alive()
    ((level, message),) = said
    assert level == "warning" and f"cannot reach node 0's supervisor at 127.0.0.1:{port}" in message, message
    assert "stay in its own run directory" in message


@pytest.mark.slow
def test_a_rank_stalled_on_node_1_shows_stale_on_node_0_with_node_1s_stacks(tmp_path, runs, monkeypatch):
    """Two loopback node supervisors, one rank each; rank 1 (node 1) sleeps inside step 5. Node 1's
    watchdog dumps its stacks; the stacks event reaches node 0's events.jsonl (nothing goes through
    the ranks' process group, which is stuck), and node 0's view has rank 1 stale by then."""
    from torchdeck.engine.runs.view import RunView

    monkeypatch.setenv("TORCHDECK_NODE_SECRET", SECRET)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    node = [Run(tmp_path, ddp_cfg(**{"devices": 1, "model.name": "usermodels:stall", "model.kwargs": {"at": 5},
                                     "train.max_steps": 200, "nodes.num_nodes": 2, "nodes.node_rank": k,
                                     "nodes.master_addr": "127.0.0.1", "nodes.master_port": port,
                                     "nodes.timeout_s": 120}), name=f"node{k}") for k in (0, 1)]
    runs.extend(node)
    ev = node[0].wait_for(lambda e: e["kind"] == "stacks" and e.get("node_rank") == 1, timeout=90)
    assert "rank 1 silent" in ev["reason"] and "stall_here (usermodels.py:" in ev["summary"], ev
    assert ev["host"] == socket.gethostname()
    view = RunView()
    view.feed_all([e for e in node[0].events() if e["t"] <= ev["t"]])
    assert 1 in [r.rank for r in view.stale_ranks(ev["t"])]  # (rank 0 waits in the all-reduce: stale too)
    assert any(e["kind"] == "node_sample" and e["node_rank"] == 1 for e in node[0].events())
