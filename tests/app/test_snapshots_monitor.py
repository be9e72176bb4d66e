"""Snapshots of the Monitor screen at fixed sizes: a recorded events file with fixed times, a
frozen clock, two fake GPUs (GPU 0 much busier: the imbalance must show) and a fake host.

Regenerate after a deliberate UI change with:
    .venv/bin/python -m pytest tests/app/test_snapshots_monitor.py --snapshot-update
"""
from __future__ import annotations

import math
import os

import pytest

from torchdeck.app.main import TorchdeckApp
from torchdeck.app.sources.host import FakeHostSource, HostSample, ProcSample
from torchdeck.app.sources.nvml import FakeGPUSource, GPUSample
from torchdeck.engine import config as cfgmod
from torchdeck.engine import events
from torchdeck.engine.rundir.layout import RunDir

T0 = 1_750_000_000.0
NOW = T0 + 95.0  # the frozen clock: 95 s into the run
SUP, R0, R1 = 4100, 4101, 4102  # shown pids; the pid file holds the test's own, so the run reads as live


def gpu(i, util, used, pids, temp, power):
    return GPUSample(index=i, name="NVIDIA A100-SXM4-40GB", util=util, mem_used_mb=used, mem_total_mb=40960,
                     temp_c=temp, power_w=power, power_limit_w=400.0, pids=pids)


# no GPU process list: which rank uses which GPU comes from the devices the ranks reported
GPUS = [gpu(0, 98.0, 33800, [], 71, 352.0), gpu(1, 46.0, 12300, [], 52, 161.0)]
HOST = HostSample(cpu_percent=38.0, per_cpu=[41.0, 35.0], ram_used_mb=9100, ram_total_mb=31900, load1=1.72,
                  procs=[ProcSample(SUP, "python", 1.5, 160.0, None), ProcSample(R0, "python", 101.0, 2480.0, 0),
                         ProcSample(R1, "python", 99.0, 2410.0, 1)])


def recorded_events(name: str, rank1_silent_after: int | None = None) -> list[dict]:
    out = []

    def put(kind, dt, **f):
        e = events.make(kind, **f)
        e["t"] = T0 + dt
        out.append(e)

    put("run_started", 0, run=name, strategy="ddp", world_size=2, nproc_per_node=2, node_rank=0, num_nodes=1,
        global_batch=256, devices=["cuda:0", "cuda:1"], master_addr="127.0.0.1", master_port=29500, pid=SUP,
        host="gpu-box", total_steps=300)
    for r, pid in ((0, R0), (1, R1)):
        put("rank_ready", 2, rank=r, local_rank=r, device=f"cuda:{r}", pid=pid, host="gpu-box", threads=8)
    put("log", 3, rank=0, level="info", message="synthetic: 8192 train samples, 32 steps/epoch, 300 steps in all")
    for s in range(1, 181):
        t = 3 + s * 0.5
        for r in (0, 1):
            if r == 1 and rank1_silent_after is not None and s > rank1_silent_after:
                continue
            put("step", t + 0.01 * r, rank=r, epoch=s // 64, step=s, total_steps=300,
                loss=2.3 * math.exp(-s / 60) + 0.08 + 0.03 * math.sin(s / 3), accuracy=min(0.97, 0.1 + s / 190),
                samples_per_s=1290.0 if r == 0 else 1010.0, data_wait_s=0.004 if r == 0 else 0.03,
                compute_s=0.096, lr=0.1, comm_s=0.03 if r == 0 else 0.004)
        if s % 64 == 0:
            ep = s // 64 - 1
            for r in (0, 1):
                put("epoch_end", t + 0.2, rank=r, epoch=ep, step=s, train_loss=1.6 / (ep + 1.5),
                    train_acc=0.45 + 0.2 * ep, val_loss=1.5 / (ep + 1.6), val_acc=0.5 + 0.2 * ep)
            put("checkpoint", t + 0.3, rank=0, epoch=ep, step=s, path=f"checkpoints/ckpt-{s}.pt")
    put("rank_report", 90, rank=0, reports=[
        {"rank": r, "host": "gpu-box", "node_rank": 0, "epoch": 2, "step": 178, "samples_per_s": sps,
         "data_wait": dw, "device_mem_mb": mem, "t": T0 + 90} for r, sps, dw, mem in ((0, 1290.0, 0.04, 31750.0),
                                                                                      (1, 1010.0, 0.24, 10240.0))])
    put("log", 80, rank=None, level="warning", message="rank 1: data loader is slow (30% of step time waiting)")
    return out


@pytest.fixture
def app(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHDECK_PRESETS", str(tmp_path / "presets"))
    return TorchdeckApp(gpu_source=FakeGPUSource(GPUS), host_source=FakeHostSource(HOST), runs_root=tmp_path / "runs")


def make_run(tmp_path, **kw):
    """A run directory with a fixed name (a created one carries today's time)."""
    run = RunDir(tmp_path / "runs" / "20250615-101500-ddp-a100")
    run.path.mkdir(parents=True)
    cfgmod.save(cfgmod.from_dict({"name": "ddp-a100", "strategy": "ddp", "accelerator": "cpu", "devices": 2,
                                  "backend": "gloo"}), run.config_path)
    evs = recorded_events(run.name, **kw)
    with open(run.events_path, "w") as fh:
        fh.writelines(events.dumps(e) + "\n" for e in evs)
    run.pid_path.write_text(f"{os.getpid()}\n")
    return run, len(evs)


@pytest.fixture
def run_dir(tmp_path):
    return make_run(tmp_path)


def show(run_dir):
    run, n_events = run_dir

    async def run_before(pilot):
        from torchdeck.app.monitor.screen import MonitorScreen

        screen = MonitorScreen(run.path, now=lambda: NOW, sample_every=3600)  # one sample: no moving history
        await pilot.app.push_screen(screen)
        for _ in range(200):
            if screen.run_state.events == n_events and screen.gpu_history.by_index:
                break
            await pilot.pause(0.05)
        assert screen.run_state.events == n_events
        # a minute of history, as if sampled once a second: GPU 0 pegged, GPU 1 waiting on it
        for k in range(60):
            screen.gpu_history.add([gpu(0, 92 + 6 * math.sin(k / 4), 33800, [], 71, 352.0),
                                    gpu(1, 45 + 35 * math.sin(k / 3), 12300, [], 52, 161.0)])
        screen.repaint()
        await pilot.pause(1.3)  # the plots redraw at most once a second
        await pilot.pause(0.2)

    return run_before


@pytest.mark.parametrize("size", [(80, 24), (140, 45)], ids=["80x24", "140x45"])
def test_monitor_live_ddp_run(snap_compare, app, run_dir, size):
    assert snap_compare(app, terminal_size=size, run_before=show(run_dir))


def test_monitor_stale_rank_140x45(snap_compare, app, tmp_path):
    """Rank 1 stopped reporting at step 120 (t = 63 s); at 95 s it is flagged stale in red."""
    assert snap_compare(app, terminal_size=(140, 45), run_before=show(make_run(tmp_path, rank1_silent_after=120)))


def test_stacks_view_80x24(snap_compare, app, tmp_path, monkeypatch):
    """Rank 1 went silent; the watchdog's stacks event, opened with t: rank 1 in the user's
    forward, rank 0 waiting in backward (the gradient all-reduce)."""
    import time

    monkeypatch.setenv("TZ", "UTC")  # the time it was taken is shown in local time
    time.tzset()
    run, n = make_run(tmp_path, rank1_silent_after=120)
    site = "/venv/lib/python3.11/site-packages/torch"
    groups = [{"who": "rank 0", "ranks": [0], "where": "_engine_run_backward (autograd/graph.py:829) <- backward "
                                                        "(engine/optim.py:116)",
               "frames": [[f"{site}/autograd/graph.py", 829, "_engine_run_backward"],
                          [f"{site}/_tensor.py", 623, "backward"], ["/src/engine/optim.py", 116, "backward"],
                          ["/src/engine/train.py", 462, "fit"]]},
              {"who": "rank 1", "ranks": [1], "where": "stall_here (usermodels.py:29)",
               "frames": [["/home/me/usermodels.py", 29, "stall_here"],
                          [f"{site}/nn/modules/module.py", 1826, "inner"], ["/src/engine/train.py", 456, "fit"]]}]
    ev = events.make("stacks", rank=None, reason="ranks 0,1 silent for 10 s", summary="", groups=groups, files=[])
    ev["t"] = T0 + 75
    with open(run.events_path, "a") as fh:
        fh.write(events.dumps(ev) + "\n")

    async def run_before(pilot):
        from torchdeck.app.monitor.stacks import StacksScreen

        await show((run, n + 1))(pilot)
        await pilot.press("t")
        for _ in range(100):  # the view is pushed and drawn (0.3 s was not always enough under load)
            if isinstance(pilot.app.screen, StacksScreen) and "taken at" in str(
                    pilot.app.screen.query_one("#stacks-body").render()):
                break
            await pilot.pause(0.05)
        await pilot.pause(1.3)  # and the Monitor beneath it past its once-a-second redraw

    assert snap_compare(app, terminal_size=(80, 24), run_before=run_before)


# ----------------------------------------------------------------------------- 256 ranks on 32 nodes (issue 31)

H100 = [GPUSample(index=i, name="NVIDIA H100 80GB HBM3", util=93.0 + i % 3, mem_used_mb=62_000.0 + 300 * i,
                  mem_total_mb=81_559.0, temp_c=61.0 + i, power_w=650.0, power_limit_w=700.0, pids=[])
        for i in range(8)]  # node 0's own GPUs, as the Monitor on node 0 samples them


def fleet_run(tmp_path, seconds: int = 30):
    """bench.fake_run's recorded fleet, 32 nodes x 8 ranks, 30 s: node 17 slow with idle GPUs, rank
    203 a straggler, ranks 44/45 (node 5) and 130 (node 16) waiting for data, node 5's GPU 3 hot.
    Nodes 1-31 sample through node_sample events, node 0 through the Monitor's own sampler."""
    from bench import fake_run

    run = RunDir(tmp_path / "runs" / "20250615-101500-fleet-32x8")
    run.path.mkdir(parents=True)
    cfgmod.save(cfgmod.from_dict({"name": "fleet-32x8", "strategy": "ddp", "accelerator": "cpu", "devices": 8,
                                  "backend": "gloo"}), run.config_path)
    evs = fake_run.fleet_events(run.name, 32, 8, T0, seconds, node0_samples=False, pid=SUP)
    with open(run.events_path, "w") as fh:
        fh.writelines(events.dumps(e) + "\n" for e in evs)
    run.pid_path.write_text(f"{os.getpid()}\n")
    return run, len(evs), max(e["t"] for e in evs) + 0.5


def show_fleet(run_dir, keys=()):
    run, n_events, now = run_dir

    async def run_before(pilot):
        from torchdeck.app.monitor.nodes import NodesPane
        from torchdeck.app.monitor.screen import MonitorScreen

        screen = MonitorScreen(run.path, now=lambda: now, sample_every=3600)
        await pilot.app.push_screen(screen)
        for _ in range(200):
            if screen.run_state.events == n_events and screen.gpu_history.by_index:
                break
            await pilot.pause(0.05)
        assert screen.run_state.events == n_events
        screen.repaint()
        pane = screen.query_one(NodesPane)
        for key in keys:
            await pilot.press(key)
        opened = pane.order[len(keys) - 1] if keys else None
        for _ in range(200):  # the node open, its head focused (its background), its GPUs drawn
            slot = pane._slot_of(opened) if opened is not None else None
            if slot is None or (pilot.app.focused is slot.head and slot.gpus.display):
                break
            await pilot.pause(0.05)
        assert pane.open == opened and (slot is None or pilot.app.focused is slot.head)
        await pilot.wait_for_scheduled_animations()  # the list scrolled to the open node
        screen.repaint()
        assert pane.order[:4] == [5, 16, 17, 25]  # worth a look first
        await pilot.pause(1.3)  # the plots redraw at most once a second
        await pilot.wait_for_scheduled_animations()
        await pilot.pause(0.2)

    return run_before


def test_monitor_fleet_256_ranks_80x24(snap_compare, app, tmp_path):
    """80x24: the ranks worth a look, not 256 rows: median rank 94, the slowest 203 and node 17's,
    the most data wait 44/45/130, the balance line naming node 25; then the nodes pane."""
    app._gpu_source = FakeGPUSource(H100)
    assert snap_compare(app, terminal_size=(80, 24), run_before=show_fleet(fleet_run(tmp_path)))


def test_monitor_fleet_256_ranks_140x45_node_17_open(snap_compare, app, tmp_path):
    """140x45: every pane on one screen; the nodes pane lists the nodes worth a look first (5 data wait
    and a hot GPU, 16 data wait, 17 slow with idle GPUs, 25 the straggler's), and n pressed three
    times opened node 17: its 8 GPUs at ~58 % under its row; the GPU imbalance across 256 GPUs below."""
    app._gpu_source = FakeGPUSource(H100)
    assert snap_compare(app, terminal_size=(140, 45), run_before=show_fleet(fleet_run(tmp_path), keys="nnn"))


async def test_fleet_node_rows_open_on_click_and_enter_and_n_is_a_key_of_multi_node_runs_only(app, tmp_path):
    """A click on node 17's row opens its GPUs under it (its ranks 136-143 on them), Enter on the
    focused row closes it; the key bar offers n on this 32-node run and not on a one-node run."""
    from torchdeck.app.monitor.nodes import NodeHead, NodesPane
    from torchdeck.app.monitor.screen import MonitorScreen

    def keys(screen):
        return {b.action for b, enabled in ((ab.binding, ab.enabled) for ab in screen.active_bindings.values())
                if enabled and b.show}

    app._gpu_source = FakeGPUSource(H100)
    run, n_events, now = fleet_run(tmp_path, seconds=8)
    one, one_events = make_run(tmp_path)
    async with app.run_test(size=(140, 45)) as pilot:
        screen = MonitorScreen(run.path, now=lambda: now, sample_every=3600)
        await app.push_screen(screen)
        pane = screen.query_one(NodesPane)
        for _ in range(200):  # every event read, and the nodes worth a look listed first
            heads = {h.node: h for h in screen.query(NodeHead)}
            if screen.run_state.events == n_events and pane.order[:4] == [5, 16, 17, 25] and 17 in heads:
                break
            await pilot.pause(0.05)
        where, still = None, 0
        for _ in range(50):  # the layout settled: a click goes where the row is now
            still = still + 1 if heads[17].region == where else 0
            if still >= 3:
                break
            where = heads[17].region
            await pilot.pause(0.1)
        assert "next_node" in keys(screen)
        await pilot.click(heads[17])
        for _ in range(100):
            if pane.open is not None:
                break
            await pilot.pause(0.05)
        await pilot.pause(0.1)
        # the row under the pointer opened (node 17's, unless a repaint moved the rows under load
        # between the click's aim and its arrival): the clicked row has the focus, its GPUs below it
        clicked = app.focused
        assert isinstance(clicked, NodeHead) and pane.open == clicked.node, (pane.open, clicked)
        k, gpus = clicked.node, clicked.parent.gpus
        assert gpus.display and f"r{8 * k}" in str(gpus.render()) and f"r{8 * k + 7}" in str(gpus.render())
        await pilot.press("enter")
        await pilot.pause(0.1)
        assert pane.open is None and not gpus.display
        single = MonitorScreen(one.path, now=lambda: NOW, sample_every=3600)
        await app.push_screen(single)
        for _ in range(100):
            if single.run_state.events == one_events:
                break
            await pilot.pause(0.05)
        await pilot.pause(0.1)
        assert "next_node" not in keys(single) and "cycle_log" in keys(single)

