"""A run listens only where it must (issue 20): what a one-node run's processes really listen on,
read from the kernel (psutil), where the store of a several-node run listens, and master_addr
values no host can have refused on the field."""
from __future__ import annotations

import ipaddress
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from torchdeck.engine import config as cfgmod
from torchdeck.engine import events, network
from tests.engine.helpers import ROOT, small_cfg


def listening(pids) -> list[tuple[int, str, int]]:
    """(pid, address, port) of every listening TCP socket the processes hold."""
    out = []
    for pid in pids:
        try:
            conns = psutil.Process(pid).net_connections(kind="tcp")
        except psutil.NoSuchProcess:
            continue
        out += [(pid, c.laddr.ip, c.laddr.port) for c in conns if c.status == psutil.CONN_LISTEN]
    return out


def is_loopback(addr: str) -> bool:
    ip = ipaddress.ip_address(addr.split("%")[0])
    return ip.is_loopback or (ip.version == 6 and ip.ipv4_mapped is not None and ip.ipv4_mapped.is_loopback)


def public_address() -> str | None:
    """A non-loopback IPv4 address of this host, if it has one."""
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family == socket.AF_INET and not ipaddress.ip_address(a.address).is_loopback:
                return a.address
    return None


def public_hostname_prefix(tmp_path: Path) -> list[str]:
    """Run a command where this host's name resolves to a network address, as on most servers
    (here it resolves to 127.0.0.1, where gloo would listen on loopback anyway): a user and mount
    namespace with its own hostname and /etc/hosts. [] where the kernel does not allow that."""
    addr = public_address()
    if not addr or not shutil.which("unshare"):
        return []
    hosts = tmp_path / "hosts"
    hosts.write_text(f"127.0.0.1 localhost\n{addr} tdpublic\n")
    prefix = ["unshare", "-Urum", "sh", "-c", f'hostname tdpublic && mount --bind "{hosts}" /etc/hosts && exec "$@"', "sh"]
    probe = subprocess.run(prefix + ["getent", "hosts", "tdpublic"], capture_output=True, text=True)
    return prefix if probe.returncode == 0 and addr in probe.stdout else []


def wait_for(pred, timeout: float, proc: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert proc.poll() is None, f"{what}: ended early with code {proc.returncode}"
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        time.sleep(0.3)


def ranks_training(events_path: Path, n: int) -> bool:
    if not events_path.exists():
        return False
    evs = events.read_all(events_path)
    return len({e["rank"] for e in evs if e["kind"] == "step"}) >= n


def tree(pid: int) -> list[int]:
    top = psutil.Process(pid)
    return [pid] + [p.pid for p in top.children(recursive=True)]


LONG = {"train.epochs": 10_000, "train.max_steps": 0, "train.log_every_n_steps": 1}


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_one_node_run_listens_on_loopback_only(tmp_path):
    """A 2-rank gloo run, its supervisor started as `torchdeck run` starts it, on a host whose name
    resolves to a network address where the kernel lets the test arrange that: the store (bound by
    the supervisor, served by rank 0) and both ranks' gloo sockets listen on loopback, nothing
    else. Then the same for tcp://127.0.0.1:PORT, whose store is served the same way."""
    prefix = public_hostname_prefix(tmp_path)
    port = network.listener("127.0.0.1", 0)
    tcp_port = port.getsockname()[1]
    port.close()
    for name, over in [("env", {"nodes.master_port": 0}), ("tcp", {"init_method": f"tcp://127.0.0.1:{tcp_port}"})]:
        run = tmp_path / name
        run.mkdir()
        cfgmod.save(cfgmod.from_dict(small_cfg(strategy="ddp", devices=2, **LONG, **over)), run / "config.yaml")
        sup = subprocess.Popen(prefix + [sys.executable, "-m", "torchdeck.engine.supervisor", str(run)], cwd=ROOT,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
        try:
            wait_for(lambda: ranks_training(run / "events.jsonl", 2), 120, sup, f"{name} run")
            socks = listening(tree(sup.pid))  # unshare and sh exec, so sup.pid is the supervisor
            rank0 = next(e["pid"] for e in events.read_all(run / "events.jsonl")
                         if e["kind"] == "rank_ready" and e["rank"] == 0)
            assert not [x for x in socks if x[0] == sup.pid], f"the supervisor itself listens: {socks}"
            assert len([x for x in socks if x[0] == rank0]) == 2, f"rank 0: the store and its gloo socket: {socks}"
            assert len({pid for pid, _, _ in socks}) == 2, f"two ranks expected: {socks}"
            assert all(is_loopback(a) for _, a, _ in socks), f"{name}: listens beyond loopback: {socks}"
            if name == "tcp":
                assert (rank0, "127.0.0.1", tcp_port) in socks  # init_method's store, served by rank 0
        finally:
            (run / "stop").touch()
            try:
                sup.wait(60)
            finally:
                if sup.poll() is None:
                    sup.kill()
        assert sup.returncode == 0


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_under_torchrun_standalone_only_torchrun_s_own_store_listens_beyond_loopback(tmp_path):
    """`torchrun --standalone`: the workers (our code) listen on loopback only. torchrun's agent
    hosts two c10d stores itself, its rendezvous and the workers' (MASTER_PORT), and binds both to
    every interface (TCPStore's server does unless handed a socket, and torchrun takes neither an
    address nor a socket for them): those are the exceptions (README, "What a run opens")."""
    prefix = public_hostname_prefix(tmp_path)
    cfgmod.save(cfgmod.from_dict(small_cfg(strategy="ddp", devices=2, **LONG)), tmp_path / "c.yaml")
    run = tmp_path / "tr"
    agent = subprocess.Popen(prefix + [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
                                       "--nproc-per-node", "2", "-m", "torchdeck.engine.worker", str(tmp_path / "c.yaml"),
                                       "--run-dir", str(run)],
                             cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                             env=dict(os.environ, OMP_NUM_THREADS="1"))
    try:
        wait_for(lambda: ranks_training(run / "events.jsonl", 2), 120, agent, "torchrun")
        workers = {e["pid"] for e in events.read_all(run / "events.jsonl") if e["kind"] == "rank_ready"}
        socks = listening(tree(agent.pid))
        mine = [s for s in socks if s[0] in workers]
        assert len({pid for pid, _, _ in mine}) == 2 and all(is_loopback(a) for _, a, _ in mine), socks
        store_port = next(e["master_port"] for e in events.read_all(run / "events.jsonl") if e["kind"] == "run_started")
        beyond = [s for s in socks if not is_loopback(s[1])]
        assert {pid for pid, _, _ in beyond} == {agent.pid} and len(beyond) == 2, socks
        assert store_port in {port for _, _, port in beyond}, socks
    finally:
        (run / "stop").touch()
        try:
            agent.wait(60)
        finally:
            if agent.poll() is None:
                agent.kill()


# ----------------------------------------------------------------------------- several nodes


def test_the_store_of_several_nodes_listens_on_master_addr_where_it_is_local():
    """master_addr of this host: that address; not this host's but nodes.ifname is: the
    interface's address; neither: every interface, and the note says why."""
    two = dict(num_nodes=2)
    assert network.store_address("127.0.0.1", **two)[0] == "127.0.0.1"
    assert network.store_address("localhost", **two)[0] in ("127.0.0.1", "::1")
    pub = public_address()
    if pub:
        assert network.store_address(pub, **two)[:2] == (pub, pub)
    foreign = "192.0.2.254" if pub != "192.0.2.254" else "198.51.100.254"  # TEST-NET: no host's
    assert network.store_address(foreign, ifname=network.loopback_ifname(), **two)[:2] == ("127.0.0.1", "127.0.0.1")
    bind, connect, note = network.store_address(foreign, **two)
    assert bind == "" and foreign in note and "every interface" in note
    # One node under env://: loopback, whatever master_addr says (the supervisor sends the ranks there).
    assert network.store_address(pub or "localhost", num_nodes=1)[:2] == ("127.0.0.1", "127.0.0.1")


def test_the_store_listens_where_store_address_says(monkeypatch):
    """bind_store binds the socket that serve_store hands TCPStore (master_listen_fd), read back
    from the kernel."""
    from torchdeck.engine import worker
    from torchdeck.engine.supervisor import PortError, bind_store
    from torchdeck.engine.worker import serve_store

    # serve_store keeps the store in worker._SERVED for the process's life: put it back after, or every
    # later in-process rank of this pytest process thinks it serves a store and waits 60 s at leave_group
    monkeypatch.setattr(worker, "_SERVED", None)

    me = [os.getpid()]
    with network.listener("127.0.0.1", 0) as probe:
        free = probe.getsockname()[1]
    multi = cfgmod.from_dict(small_cfg(strategy="ddp", devices=1, **{"nodes.num_nodes": 2, "nodes.master_port": free}))
    held, msg = bind_store(multi, free, None)
    assert (held.meet, held.port, msg) == ("127.0.0.1", free, None)
    assert (os.getpid(), "127.0.0.1", free) in listening(me)
    with pytest.raises(PortError, match=f"nodes.master_port {free} is in use on this host"):
        bind_store(multi, free, None)  # held from the start; several nodes never move
    store = serve_store(multi, 2, (held.sock, held.connect))
    store.set("k", "v")
    assert store.get("k") == b"v"
    assert [s for s in listening(me) if s[2] == free] == [(os.getpid(), "127.0.0.1", free)]


# ----------------------------------------------------------------------------- master_addr


@pytest.mark.parametrize("addr", ["127.0.0.1", "10.1.2.3", "::1", "fe80::1%eth0", "node-0", "gpu01.cluster.local",
                                  "compute_3", "localhost"])
def test_master_addr_takes_host_names_and_addresses(addr):
    cfg = cfgmod.from_dict(small_cfg(**{"nodes.master_addr": addr}))
    assert cfg.nodes.master_addr == addr


@pytest.mark.parametrize("addr,why", [
    ("a;touch${IFS}/tmp/x", "characters a host name cannot have"),
    ("$(reboot)", "characters a host name cannot have"),
    ("node 0", "characters a host name cannot have"),
    ("[::1]", "without them"),
    ("300.1.2.3", "not a valid IPv4 address"),
    ("-node", "do not start or end with '-'"),
    ("a..b", "1-63 characters"),
    ("", "is empty"),
    (" 10.0.0.1", "spaces around it"),
])
def test_master_addr_that_no_host_can_have_is_refused_naming_the_field(addr, why):
    with pytest.raises(cfgmod.ConfigError) as e:
        cfgmod.from_dict(small_cfg(**{"nodes.master_addr": addr}))
    assert why in e.value.by_field()["nodes.master_addr"]


def test_validate_refuses_a_bad_master_addr_and_starts_nothing(tmp_path, capsys, monkeypatch):
    import yaml

    from torchdeck.cli import main as cli

    monkeypatch.setenv("TORCHDECK_RUNS", str(tmp_path / "runs"))
    preset = tmp_path / "bad.yaml"
    preset.write_text(yaml.safe_dump(small_cfg(strategy="ddp", devices=2, **{"nodes.master_addr": "a;touch${IFS}/tmp/x"})))
    assert cli.main(["validate", str(preset)]) == 2
    assert cli.main(["run", str(preset)]) == 2
    err = capsys.readouterr().err
    assert "nodes.master_addr" in err and "characters a host name cannot have" in err
    assert not (tmp_path / "runs").exists()
