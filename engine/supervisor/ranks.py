"""The node's rank processes: started (our loop's ranks by spawn, a user's script's through
engine/launch), each with its own event pipe read by one thread into the writer; polled, and
stopped (on a failure: a grace, then SIGTERM, then SIGKILL)."""
from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing
import os
import queue as queue_mod
import time
from multiprocessing import connection as mp_connection

from .. import events, strategies

POLL_S = 0.5
FAIL_GRACE_S = 2.0


@dataclasses.dataclass
class Ranks:
    """The node's rank processes (what torch's ProcessContext holds; the supervisor joins them itself).
    A script run's ranks are engine.launch.ranks.ScriptRanks, with the same interface."""

    processes: list
    reader: object = None  # engine.launch.ranks.EventReader of the ranks' pipes

    def finish(self) -> None:
        """After the ranks are gone: read what is left in their pipes (a script run's ranks also
        clean up their trees here)."""
        if self.reader is not None:
            self.reader.stop()


@contextlib.contextmanager
def _environ(values: dict):
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _start_writer(writer, message: str) -> None:
    """The writer's queue and thread (the other nodes' events and the sampler's come through it);
    a restart's ranks find them running."""
    if not writer.is_alive():
        writer.q = queue_mod.Queue()
        writer.start()
    writer.write(events.make("log", rank=None, level="info", message=message))


def start_script(cfg, plan, rd, writer, put, attempt: int = 0):
    """Start the node's ranks of a user's script: each a process of its own with its own event
    pipe, read by a thread into the writer's queue. Returns (ranks, their stop event).
    attempt: the restarts before this start (TORCHELASTIC_RESTART_COUNT)."""
    from ..launch import env as launch_env
    from ..launch import ranks as launch_ranks

    nproc = strategies.nproc_per_node(cfg)
    yours = "OMP_NUM_THREADS" in (cfg.script.env or {}) or bool(os.environ.get("OMP_NUM_THREADS", "").strip())
    _start_writer(writer, f"supervisor {os.getpid()}: {' '.join(launch_ranks.command(cfg.script))} x{nproc} on node "
                          f"{cfg.nodes.node_rank}, {cfg.nodes.master_addr}:{plan.port}, {plan.threads} thread(s) "
                          "per rank" + (" (your OMP_NUM_THREADS)" if yours else ""))
    node = launch_env.plan_for(cfg, rd.path, nproc, plan.port, plan.threads, plan.child_env, restart_count=attempt)
    ranks = launch_ranks.start(cfg.script, node, put, flush=writer.flush_taken)
    return ranks, ranks.stop_event


def spawn(cfg, plan, rd, writer, put, attempt: int = 0):
    """Start the node's ranks of our loop (spawn context: events are text, no torch needed to
    carry them), each with its own event pipe (worker.PipeReporter), read by one thread into the
    writer's queue, as a script run's ranks are (engine/launch/ranks.py). Each rank is handed
    the RunConfig itself, as read and settled here: no other form, no second validation.
    A restart (attempt > 0) sets cfg.checkpoint.resume to the newest checkpoint first (loop.py)."""
    from ..launch.ranks import EventReader
    from ..worker import rank_main

    nproc = strategies.nproc_per_node(cfg)
    ctx_mp = multiprocessing.get_context("spawn")
    stop_event = ctx_mp.Event()
    _start_writer(writer, f"supervisor {os.getpid()}: {cfg.strategy} x{nproc} on node {cfg.nodes.node_rank}, "
                          f"port {plan.port}, {plan.threads} thread(s) per rank")
    store = plan.store
    pipes = [ctx_mp.Pipe(duplex=False) for _ in range(nproc)]  # (read end, write end) per rank
    ranks = Ranks([ctx_mp.Process(target=rank_main, name=f"rank{i}",
                                  args=(i, cfg, str(rd.path), pipes[i][1], stop_event, plan.port, plan.meet,
                                        (store.sock, store.connect) if store is not None and i == 0 else None))
                   for i in range(nproc)])
    try:
        with _environ(plan.child_env):  # the children inherit it; this process (maybe a test) keeps its own
            for p in ranks.processes:
                p.start()
    finally:
        fds = []
        for r, w in pipes:
            w.close()  # each rank holds its own write end: its pipe ends when it (and its children) are gone
            fds.append(os.dup(r.fileno()))  # the reader owns (and closes) its copy
            r.close()
    ranks.reader = EventReader(fds, put, node_rank=cfg.nodes.node_rank, flush=writer.flush_taken)
    ranks.reader.start()
    if store is not None:
        store.sock.close()  # local rank 0 holds it now
    return ranks, stop_event


def wait_step(pctx, sentinels) -> list[int]:
    """One poll (what ctx.join(timeout) does, but without its cleanup, so we see who died first)."""
    ready = mp_connection.wait(list(sentinels), timeout=POLL_S)
    failed = []
    for sentinel in ready:
        i = sentinels.pop(sentinel)
        pctx.processes[i].join()
        if pctx.processes[i].exitcode != 0:
            failed.append(i)
    return failed


def terminate(pctx, wait_s: float = FAIL_GRACE_S) -> None:
    """Let the others fail on their own briefly (wait_s), then SIGTERM, then SIGKILL."""
    procs = pctx.processes
    for step in ("wait", "terminate", "kill"):
        if step == "terminate":
            for p in procs:
                if p.is_alive():
                    p.terminate()
        elif step == "kill":
            for p in procs:
                if p.is_alive():
                    p.kill()
        deadline = time.monotonic() + (wait_s if step == "wait" else FAIL_GRACE_S)
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
        if not any(p.is_alive() for p in procs):
            return


def kill_all(pctx) -> None:
    for p in pctx.processes:
        if p.is_alive():
            p.kill()
    for p in pctx.processes:
        p.join(5)
