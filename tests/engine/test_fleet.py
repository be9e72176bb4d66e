"""Every node's GPUs through one model (engine/runs/fleet.py, issue 31): node_sample events in the
run's events and the Monitor's own sampler on node 0 end in the same Fleet."""
from __future__ import annotations

from torchdeck.app.sources.nvml import GPUSample
from torchdeck.engine import events
from torchdeck.engine.runs.view import RunView


def _sample(node, utils, t, temp=60.0):
    ev = events.make("node_sample", node_rank=node, host=f"n{node}", host_stats={
        "cpu_percent": 10.0 * (node + 1), "per_cpu": [1.0] * 4, "ram_used_mb": 1000.0, "ram_total_mb": 4000.0,
        "load1": 0.5}, gpus=[{"index": i, "name": "H100", "util": u, "mem_used_mb": 1000.0 * (i + 1),
                               "mem_total_mb": 80_000.0, "temp_c": temp + i, "power_w": 300.0, "power_limit_w": 700.0,
                               "pids": [], "uuid": "", "mem_util": None, "fan_pct": None} for i, u in enumerate(utils)])
    ev["t"] = t
    return ev


def test_node_samples_and_the_local_sampler_make_one_fleet():
    v = RunView()
    assert v.feed(_sample(1, [90.0, 30.0], 10.0)) and v.feed(_sample(2, [95.0, 94.0], 10.5))
    assert not v.feed({"kind": "node_sample", "t": 11.0, "gpus": "nope"}) and v.skipped == 1  # counted, not raised
    snap = v.snapshot()
    v.feed(_sample(1, [91.0, 31.0], 11.0))
    assert [g.util for g in snap.fleet.nodes[1].gpus] == [90.0, 30.0]  # a snapshot does not move with the reader
    assert v.fleet.nodes[1].util_history(1) == (30.0, 31.0)

    from torchdeck.engine.runs.fleet import Fleet

    here = Fleet()  # what the Monitor on node 0 samples itself, a second at a time
    for u in (25.0, 20.0):
        here.add(0, "n0", [GPUSample(0, "NVIDIA H100", u, 500.0, 80_000.0, 81.0, 200.0, 700.0, [4101])], local=True)
    fleet = v.fleet.merged(here)
    assert sorted(fleet.nodes) == [0, 1, 2] and 0 not in v.fleet.nodes and fleet.nodes[0].local
    assert fleet.nodes[0].gpus[0].pids == (4101,) and fleet.nodes[0].util_history(0) == (25.0, 20.0)
    b = fleet.imbalance()
    assert b["gpus"] == 5 and b["nodes"] == 3 and b["util"]["lo"].label == "node 0 GPU 0" and b["util"]["big"]
    assert fleet.imbalance_line().startswith("GPU imbalance: util 75 pts (node 0 GPU 0 at 20%, median")
    assert fleet.nodes[0].hottest().temp_c == 81.0 and fleet.nodes[1].util() == (31.0, 61.0, 91.0)
    # node 0's own node_sample events, once they come, say more than the Monitor's guess: they win
    v.feed(_sample(0, [50.0], 12.0))
    assert v.fleet.merged(here).nodes[0].gpus[0].util == 50.0
    assert "busiest node 2" in v.fleet.host_line(skip=0)


def test_ranks_of_one_pace_keep_their_place_among_the_picks_as_they_step():
    """bench fleet: node 17's 8 ranks, all at 512 samples/s, swapped places in the 'slowest' rows with
    every step event (sorted by pace, then step), so the Monitor's rows flickered between them and
    each showed for a moment. Equal paces are ordered by rank."""
    from torchdeck.engine.runs.fleet import rank_picks

    def step(rank, n, sps):
        return events.make("step", rank=rank, epoch=0, step=n, total_steps=100, loss=1.0, samples_per_s=sps,
                           data_wait_s=0.01, compute_s=0.1, lr=0.1, accuracy=None)

    v = RunView()
    v.feed(events.make("run_started", strategy="ddp", world_size=16, total_steps=100, devices=["cpu"] * 16))
    v.feed_all([step(r, 10, 100.0 if r not in (3, 4) else 50.0) for r in range(16)])
    v.feed(step(4, 11, 50.0))
    v.feed(step(3, 12, 50.0))  # rank 3 now a step ahead of rank 4: same pace, same place
    picks, _ = rank_picks(v, 0.0, k=1)
    assert [(p.why, p.rank.rank) for p in picks if p.why == "slowest"] == [("slowest", 3)]


def test_a_node_sample_without_a_whole_node_rank_is_skipped_and_counted():
    v = RunView()
    for bad in ("x", True, -1, None, 1.5):
        ev = _sample(1, [50.0], 1.0)
        ev["node_rank"] = bad
        assert not v.feed(ev)
    assert v.skipped == 5 and not v.fleet.nodes
