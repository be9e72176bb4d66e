"""The docs' pictures, drawn by the app itself: `python docs/screenshots.py` rewrites docs/images/*.svg,
`python docs/screenshots.py --check` says which no longer match what the app draws (exit 1); either
takes picture names (monitor-80x24) to do only those.

Each screen is driven as its snapshot tests drive it (tests/app/test_snapshots_*.py, test_runs.py,
test_compare_screen.py): run directories written with fixed times, a frozen clock, fake GPUs and a
fake host, TZ=UTC, a relative runs folder. So a picture changes only when a screen does, and needs no
GPU and no training. Rerun it when a screen changes; tests/test_docs_pictures.py fails until you do.
"""
from __future__ import annotations

import asyncio
import contextlib
import math
import os
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
IMAGES = ROOT / "docs" / "images"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.app import test_compare_screen as compare_t  # noqa: E402  (the snapshot tests' recorded runs)
from tests.app import test_runs as runs_t  # noqa: E402
from tests.app import test_snapshots_configure as configure_t  # noqa: E402
from tests.app import test_snapshots_monitor as monitor_t  # noqa: E402
from tests.app.screen_helpers import svg_rows  # noqa: E402

SIZES = ((80, 24), (140, 45))
SCENES = ("configure", "monitor", "monitor-256", "runs", "compare")


def picture_names() -> list[str]:
    return [f"{scene}-{w}x{h}" for scene in SCENES for w, h in SIZES]


# ----------------------------------------------------------------------------- an 8-rank DDP run

RANKS = 8
SLOW = 5  # the rank whose data loader cannot keep up: its GPU waits, the others wait for it


def _h100(i: int, util: float) -> object:
    from torchdeck.app.sources.nvml import GPUSample

    return GPUSample(index=i, name="NVIDIA H100 80GB HBM3", util=util, mem_used_mb=61_000.0 + 400 * i,
                     mem_total_mb=81_559.0, temp_c=60.0 + i, power_w=300.0 + 4 * util, power_limit_w=700.0, pids=[])


def _eight_gpus(k: int = 0) -> list:
    return [_h100(i, (52 + 20 * math.sin(k / 3)) if i == SLOW else 93 + 4 * math.sin((k + i) / 4))
            for i in range(RANKS)]


def _eight_rank_events(name: str) -> list[dict]:
    from torchdeck.engine import events

    t0, out = monitor_t.T0, []

    def put(kind, dt, **f):
        e = events.make(kind, **f)
        e["t"] = t0 + dt
        out.append(e)

    put("run_started", 0, run=name, strategy="ddp", world_size=RANKS, nproc_per_node=RANKS, node_rank=0,
        num_nodes=1, global_batch=2048, devices=[f"cuda:{r}" for r in range(RANKS)], master_addr="127.0.0.1",
        master_port=29500, pid=monitor_t.SUP, host="gpu-box", total_steps=600)
    for r in range(RANKS):
        put("rank_ready", 2, rank=r, local_rank=r, device=f"cuda:{r}", pid=monitor_t.R0 + r, host="gpu-box",
            threads=8)
    put("log", 3, rank=0, level="info", message="imagenet-100: 126,689 train samples, 61 steps/epoch")
    for s in range(1, 181):
        for r in range(RANKS):
            slow = r == SLOW
            put("step", 3 + s * 0.5 + 0.01 * r, rank=r, epoch=s // 61, step=s, total_steps=600,
                loss=4.6 * math.exp(-s / 70) + 0.6 + 0.04 * math.sin(s / 3 + r), accuracy=min(0.8, 0.02 + s / 260),
                samples_per_s=410.0 if slow else 515.0 - 3 * r, data_wait_s=0.06 if slow else 0.004,
                compute_s=0.41, lr=0.4, comm_s=0.02 if slow else 0.09)
        if s % 61 == 0:
            ep = s // 61 - 1
            for r in range(RANKS):
                put("epoch_end", 3 + s * 0.5 + 0.2, rank=r, epoch=ep, step=s, train_loss=3.1 / (ep + 1.4),
                    train_acc=0.3 + 0.2 * ep, val_loss=3.0 / (ep + 1.5), val_acc=0.33 + 0.2 * ep)
            put("checkpoint", 3 + s * 0.5 + 0.3, rank=0, epoch=ep, step=s, path=f"checkpoints/ckpt-{s}.pt")
    put("log", 80, rank=None, level="warning", message=f"rank {SLOW}: data loader is slow (13% of step time waiting)")
    put("rank_report", 90, rank=0, reports=[
        {"rank": r, "host": "gpu-box", "node_rank": 0, "epoch": 2, "step": 178,
         "samples_per_s": 410.0 if r == SLOW else 515.0 - 3 * r, "data_wait": 0.13 if r == SLOW else 0.01,
         "device_mem_mb": 60_000.0 + 400 * r, "t": t0 + 90} for r in range(RANKS)])
    return out


def _eight_rank_run(root: Path):
    from torchdeck.engine import config as cfgmod
    from torchdeck.engine import events
    from torchdeck.engine.rundir.layout import RunDir

    run = RunDir(root / "20250615-101500-resnet-8xh100")
    run.path.mkdir(parents=True)
    cfgmod.save(cfgmod.from_dict({"name": "resnet-8xh100", "strategy": "ddp", "accelerator": "cpu",
                                  "devices": RANKS, "backend": "gloo"}), run.config_path)
    evs = _eight_rank_events(run.name)
    run.events_path.write_text("".join(events.dumps(e) + "\n" for e in evs))
    run.pid_path.write_text(f"{os.getpid()}\n")  # this process: the run reads as live
    return run, len(evs)


def _show_eight(run_dir):
    run, n_events = run_dir

    async def run_before(pilot):
        from torchdeck.app.monitor.screen import MonitorScreen

        screen = MonitorScreen(run.path, now=lambda: monitor_t.NOW, sample_every=3600)
        await pilot.app.push_screen(screen)
        for _ in range(200):
            if screen.run_state.events == n_events and screen.gpu_history.by_index:
                break
            await pilot.pause(0.05)
        assert screen.run_state.events == n_events, (screen.run_state.events, n_events)
        # The picture must not depend on timing: the sampler (one sample, then an hour's wait) is
        # stopped and its sample dropped, so the history is exactly this minute whenever it came.
        screen.workers.cancel_group(screen, "monitor-samples")
        await pilot.pause(0.2)
        screen.gpu_history.by_index.clear()
        for k in range(60):  # a minute of history, as if sampled once a second
            screen.gpu_history.add(_eight_gpus(k))
        screen.repaint()
        await pilot.pause(1.3)  # the plots redraw at most once a second
        screen.query_one("#mon-log").scroll_end(animate=False, immediate=True)  # its tail, not a deferred scroll
        await pilot.wait_for_scheduled_animations()
        await pilot.pause(0.2)

    return run_before


# ----------------------------------------------------------------------------- one scene per screen

def _scene(scene: str, size: tuple[int, int], here: Path):
    """(app, what to do before the picture) for one screen, its files made under `here` (the cwd)."""
    from torchdeck.app.main import TorchdeckApp
    from torchdeck.app.sources.host import FakeHostSource, HostSample, ProcSample
    from torchdeck.app.sources.nvml import FakeGPUSource

    runs = Path("runs")
    if scene == "configure":
        return TorchdeckApp(gpu_source=configure_t.fake_gpus(), runs_root=runs), configure_t.settle
    # a node with 8 GPUs: its supervisor and 8 ranks, 32 cores busy with them and their loaders
    procs = [ProcSample(monitor_t.SUP, "python", 1.5, 160.0, None)] + [
        ProcSample(monitor_t.R0 + r, "python", 100.0, 2400.0 + 10 * r, r) for r in range(RANKS)]
    host = FakeHostSource(HostSample(cpu_percent=41.0, per_cpu=[44.0, 39.0] * 16, ram_used_mb=88_000,
                                     ram_total_mb=515_000, load1=13.2, procs=procs))
    if scene == "monitor":
        app = TorchdeckApp(gpu_source=FakeGPUSource(_eight_gpus()), host_source=host, runs_root=runs)
        return app, _show_eight(_eight_rank_run(here / "runs"))
    if scene == "monitor-256":  # node 0 of 32 (the snapshot tests' host is a 2-core box with 2 ranks)
        app = TorchdeckApp(gpu_source=FakeGPUSource(monitor_t.H100), host_source=host, runs_root=runs)
        return app, monitor_t.show_fleet(monitor_t.fleet_run(here), keys="nnn" if size[1] >= 45 else "")
    if scene == "runs":
        _runs_list(runs)
        _comparison(runs)

        async def show_runs(pilot):  # the cursor on the failed run: its root cause under the table
            await runs_t.open_runs(pilot)
            await pilot.press("down", "down", "down")
            await pilot.pause(0.3)
        return TorchdeckApp(runs_root=runs, gpu_source=FakeGPUSource([])), show_runs
    if scene == "compare":
        _comparison(runs)
        return TorchdeckApp(runs_root=runs, gpu_source=FakeGPUSource([])), compare_t.open_comparison
    raise ValueError(scene)


def _comparison(root: Path) -> None:
    """tests/app/test_compare_screen.py's comparison (cpu, ddp, fsdp; dp skipped), but for the cpu
    run's loss: the same as ddp's there, its curve would hide under ddp's, its legend naming nothing."""
    import json

    from torchdeck.engine import events

    where = compare_t.make_comparison(root)
    events_path = next(where.glob("*-tiny-cpu")) / "events.jsonl"
    lines = []
    for line in events_path.read_text().splitlines():
        ev = json.loads(line)
        if ev.get("kind") == "step":
            ev["loss"] = 2.3 * math.exp(-ev["step"] / 30) + 0.25
        lines.append(events.dumps(ev))
    events_path.write_text("\n".join(lines) + "\n")


def _runs_list(root: Path) -> None:
    """tests/app/test_runs.py's picture: a failed, a stopped, a finished and a lost run."""
    import subprocess

    from torchdeck.engine import events

    t0 = compare_t.T0
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    ep = events.make("epoch_end", rank=0, epoch=3, step=40, train_loss=0.2, train_acc=0.95, val_loss=0.25,
                     val_acc=0.934)
    se, st = runs_t.started_event, runs_t.step_event
    runs_t.fixed_run(root, "20251101-120000-broke", [se(t0), st(t0 + 9, 3)],
                     {"status": "failed", "exit_codes": [1, -9], "elapsed_s": 12.5,
                      "root_cause": "rank 1 killed by signal 9 (SIGKILL): the OOM killer? see rank1.log"})
    runs_t.fixed_run(root, "20251101-113000-halted", [se(t0 - 1800), st(t0 - 1790, 7)],
                     {"status": "stopped", "exit_codes": [0, 0], "root_cause": None, "elapsed_s": 30.0})
    runs_t.fixed_run(root, "20251101-110000-quickstart", [se(t0 - 3600), st(t0 - 3550, 40, 40), ep],
                     {"status": "finished", "exit_codes": [0, 0], "root_cause": None, "elapsed_s": 52.3})
    runs_t.fixed_run(root, "20251101-100000-vanished", [se(t0 - 7200, "cpu", 1), st(t0 - 7100, 12)], pid=dead.pid)


@contextlib.contextmanager
def _isolated(here: Path):
    """cwd, TZ and the presets folder as the snapshot tests set them; put back afterwards."""
    saved = {k: os.environ.get(k) for k in ("TZ", "TORCHDECK_PRESETS", "OMP_NUM_THREADS")}
    cwd = os.getcwd()
    os.environ.update(TZ="UTC", TORCHDECK_PRESETS=str(here / "presets"))
    os.environ.pop("OMP_NUM_THREADS", None)
    time.tzset()
    os.chdir(here)
    try:
        yield
    finally:
        os.chdir(cwd)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        time.tzset()


async def _draw(scene: str, size: tuple[int, int], here: Path) -> str:
    app, run_before = _scene(scene, size, here)
    async with app.run_test(size=size) as pilot:
        await run_before(pilot)
        return app.export_screenshot(title="torchdeck")


def draw(name: str) -> str:
    """The SVG the app draws today for picture `name` (e.g. "monitor-140x45")."""
    scene, _, dims = name.rpartition("-")
    size = tuple(int(n) for n in dims.split("x"))
    with tempfile.TemporaryDirectory() as tmp, _isolated(Path(tmp)):
        return asyncio.run(_draw(scene, size, Path(tmp)))


def normalised(svg: str) -> str:
    """What stays the same between two renders of the same screen: Rich names each export's ids
    after a hash of its content (terminal-1234567-r1, -line-3, -clip-terminal): drop the number."""
    return re.sub(r"terminal-\d+", "terminal", svg)


def stale(names: list[str] | None = None) -> list[tuple[str, str]]:
    """(picture, why) for each committed picture that differs from what the app draws now."""
    out = []
    for name in names or picture_names():
        path = IMAGES / f"{name}.svg"
        if not path.exists():
            out.append((name, "missing"))
            continue
        new, old = draw(name), path.read_text(encoding="utf-8")
        if normalised(new) != normalised(old):
            out.append((name, _difference(old, new)))
    return out


def screen_rows(svg: str) -> list[str]:
    """The picture's text, row by row, as a person reads it."""
    return [row.rstrip() for row in svg_rows(svg)]


def _difference(old: str, new: str) -> str:
    before, now = screen_rows(old), screen_rows(new)
    for i in range(max(len(before), len(now))):
        a = before[i] if i < len(before) else "<none>"
        b = now[i] if i < len(now) else "<none>"
        if a != b:
            return f"row {i + 1} was {a.strip()!r}, is now {b.strip()!r}"
    return "the same text, other colours or styles"


def main(argv: list[str]) -> int:
    """Every picture, or those named (`python docs/screenshots.py monitor-80x24 runs-140x45`)."""
    names = [a for a in argv if not a.startswith("-")] or picture_names()
    unknown = sorted(set(names) - set(picture_names()))
    if unknown:
        print(f"no picture {', '.join(unknown)}; the pictures: {', '.join(picture_names())}", file=sys.stderr)
        return 2
    if "--check" in argv:
        bad = stale(names)
        for name, why in bad:
            print(f"docs/images/{name}.svg is stale: {why}")
        print(f"{len(names) - len(bad)} of {len(names)} pictures match the app"
              + ("; run python docs/screenshots.py" if bad else ""))
        return 1 if bad else 0
    IMAGES.mkdir(parents=True, exist_ok=True)
    for name in names:
        started = time.monotonic()
        svg = draw(name)
        path = IMAGES / f"{name}.svg"
        path.write_text(svg, encoding="utf-8")
        print(f"{path.relative_to(ROOT)}: {len(svg):,} bytes, {time.monotonic() - started:.1f} s")
    return 0

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
