"""Hand-made event streams for tests of the run core and the screens that draw it."""
from __future__ import annotations

from torchdeck.engine import events

T0 = 1_700_000_000.0


def ev(kind: str, t: float, **fields) -> dict:
    """An event from the engine's own builder, at a fixed time."""
    try:
        e = events.make(kind, **fields)
    except ValueError:
        e = {"v": events.EVENT_VERSION, "kind": kind, **fields}
    e["t"] = T0 + t
    return e


def started(total=100, world=2, t=0.0):
    return ev("run_started", t, run="r1", strategy="ddp", world_size=world, nproc_per_node=world, node_rank=0,
              num_nodes=1, global_batch=64 * world, devices=["cpu"] * world, master_addr="127.0.0.1",
              master_port=29500, pid=4000, host="box", total_steps=total)


def step(rank, s, t, sps=100.0, total=100, wait=0.01, comp=0.09, loss=1.0):
    return ev("step", t, rank=rank, epoch=0, step=s, total_steps=total, loss=loss, accuracy=0.5,
              samples_per_s=sps, data_wait_s=wait, compute_s=comp, lr=0.1)
