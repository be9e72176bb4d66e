"""The supervisor: one process per node and run that starts the ranks, drains their events into
events.jsonl, turns stop requests into a graceful stop, and stops every rank when one fails.

    python -m torchdeck.engine.supervisor RUN_DIR      (the launcher redirects its output to supervisor.log)
    supervise(run_dir) -> exit code          (in-process, for tests)

While it lives it holds a small `.reserve` file in the run directory, released when the run ends,
so that a disk that filled up during the run still has room for status.json.

Its rooms, one job each:
    loop.py      the main loop: config, plan, start, wait (stop requests), the final status
    plan.py      what is decided on this host before a rank exists (port, GPUs, threads, env)
    ports.py     the rendezvous port, chosen and held
    ranks.py     the rank processes: started, polled, stopped
    writer.py    events.jsonl's one writer (and the ranks' view the watchdog asks)
    watchdog.py  stacks when a rank turns stale or slow, or a collective timed out
    outcome.py   the run's status and root cause, in words
    nodes.py     the node link (engine/nodes): several nodes' events meet on node 0
"""
from .loop import SIGNAL_COALESCE_S, STOP_GRACE_S, Supervisor, main, supervise
from .outcome import TAIL_BYTES, log_tail
from .plan import lone_node_warning
from .ports import PortError, StoreSocket, bind_store, choose_port, free_port, meeting_point, port_in_use
from .watchdog import Watchdog
from .writer import EventWriter

__all__ = ["EventWriter", "PortError", "SIGNAL_COALESCE_S", "STOP_GRACE_S", "StoreSocket", "Supervisor", "TAIL_BYTES",
           "Watchdog", "bind_store", "choose_port", "free_port", "lone_node_warning", "log_tail", "main",
           "meeting_point", "port_in_use", "supervise"]
