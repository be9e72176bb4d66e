"""The benchmarks run: `python -m bench --quick` end to end, every piece, with real runs.

No timing is asserted (a shared 2-core machine is too noisy); what is asserted is that each
benchmark produced its numbers from real measurements, and the facts that do not depend on
speed: no event lost in the drain, the app does not import torch, the GPU part says why it
did not run.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _positive(x) -> bool:
    return isinstance(x, (int, float)) and x > 0


SMOKE = ["engine_vs_plain", "ddp_vs_plain", "monitoring_cost", "events_rate", "app", "scaling", "imagefolder_vs_plain",
         "cifar_vs_plain", "startup", "first_frame", "deepspeed_vs_plain", "loader_start", "gpu"]


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    """One `python -m bench --quick` for both tests below (bench's own order): the bench process and
    its torch import once, not once per test. Returns (the process, its JSON or None)."""
    tmp = tmp_path_factory.mktemp("bench")
    out = tmp / "bench.json"
    env = dict(os.environ, TORCHDECK_RUNS=str(tmp / "runs"))
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    p = subprocess.run([sys.executable, "-m", "bench", "--quick", "--only", ",".join(SMOKE), "--json", str(out)],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=1470)
    return p, json.loads(out.read_text()) if out.exists() else None


def _results(quick, names) -> dict:
    """The results of these benchmarks, failing with the bench's output where one did not run."""
    p, data = quick
    assert data is not None, p.stdout[-3000:] + p.stderr[-3000:]
    res = data["results"]
    assert list(res) == SMOKE, list(res)
    broken = {n: res[n]["error"] for n in names if "error" in res[n]}
    assert not broken, f"{broken}\n" + p.stdout[-3000:] + p.stderr[-3000:]
    return res


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_bench_quick_runs_every_benchmark(quick):
    p, data = quick
    res = _results(quick, [n for n in SMOKE if n != "deepspeed_vs_plain"])  # deepspeed_vs_plain: its own test below
    assert "### Targets" in p.stdout
    full = not data["quick"]  # what a quick run leaves out (its text says "quick: ... only") is checked on a full run
    assert full or all("quick:" in res[n]["text"] for n in ("ddp_vs_plain", "monitoring_cost", "scaling",
                                                            "imagefolder_vs_plain", "cifar_vs_plain", "loader_start"))
    # issue 36: a quick run is 3 at a time, its plain scripts forked (and says so); startup's stays a real start
    assert full or data["jobs"] == 3 and all(
        "forked from a process that imported torch" in res[n]["text"] for n in (
            "engine_vs_plain", "ddp_vs_plain", "imagefolder_vs_plain", "cifar_vs_plain", "loader_start"))
    assert "forked" not in res["startup"]["text"]
    assert full or data["env"]["omp_wait_policy"]  # a quick run's idle threads sleep (bench/__main__.py)

    evp = res["engine_vs_plain"]
    assert _positive(evp["ratio"])
    assert all(_positive(r["samples_per_s"]) and _positive(r["startup_s"])
               for r in evp["engine"] + evp["plain"] + evp["plain_batched"])
    assert _positive(evp["ratio_vs_batched"])

    ddp = res["ddp_vs_plain"]
    assert _positive(ddp["ratio_plain"]) and all(_positive(r["samples_per_s"]) for r in ddp["engine"] + ddp["plain"])
    assert ddp["plain"][0]["threads"] == max(1, os.cpu_count() // 2)  # the plain script pins threads per rank
    if full:
        assert _positive(ddp["ratio_naive"]) and all(_positive(r["samples_per_s"]) for r in ddp["plain_batched"])

    mon = res["monitoring_cost"]
    assert all(isinstance(c, float) for c in mon["costs"].values()) and len(mon["costs"]) == (3 if full else 2)
    w = mon["watcher"]
    assert w["events"] > 0 and w["samples"] > 0 and "sampler_error" not in w, w
    assert w["ranks_sampled"] == 2  # the supervisor and the one rank, as the Monitor samples them
    assert 0 < mon["emit_cost_s"] < 0.01
    assert all(_positive(r["window_s"]) and r["supervisor_cpu_s"] is not None for rs in mon["runs"].values() for r in rs)

    ev = res["events_rate"]
    assert all(r["written"] == r["events"] for shape in ev["runs"] for r in shape)
    assert _positive(ev["events_per_s"])

    sc = res["scaling"]
    assert [n for n, _ in sc["by_ranks"]] == ([1, 2] if full else [2]) and len(sc["by_batch"]) == (3 if full else 0)
    rows = [r for _, rs in sc["by_batch"] + sc["by_ranks"] for r in rs]
    assert all(_positive(r["step_s"]) and _positive(r["peak_rss_mb_per_rank"]) for r in rows)
    assert all(_positive(r["events_mb_per_hour"]) for _, rs in sc["by_ranks"] for r in rs)

    app = res["app"]
    if importlib.util.find_spec("torchdeck.app.main") is None:
        assert "skipped" in app
    else:
        assert not any(r["torch_imported"] for r in app["import"])  # first frame must not pay for torch
        assert _positive(app["first_screen"][0]["first_paint_s"])
        if importlib.util.find_spec("torchdeck.app.monitor") is not None:
            assert app["live"]["events_timed"] > 0 and _positive(app["live"]["cpu_fraction_of_core"])
        else:  # measured on `torchdeck attach` instead, and said so
            assert "NOT RUN" in app["text"] and app["attach"]["events_timed"] > 0

    img = res["imagefolder_vs_plain"]  # issue 17: a PNG folder it wrote, against the scripts
    for key in ("engine", "decode_once") + (("decode_once_batched", "tutorial", "streamed") if full else ()):
        assert img[key] and all(_positive(r["samples_per_s"]) and r["val_acc"] is not None for r in img[key]), key
    assert _positive(img["ratio"]) and img["acc_gap"] is not None

    cif = res["cifar_vs_plain"]
    assert cif["engine"] and cif["plain"] and all(_positive(r["samples_per_s"]) for r in cif["engine"] + cif["plain"])
    assert [(m["ranks"], m["cache"]) for m in cif["memory"]] == (
        [(2, "auto"), (2, "none"), (8, "auto"), (8, "none")] if full else [(2, "auto")])
    if full:
        assert all(_positive(r["samples_per_s"]) for r in cif["plain_batched"] + cif["plain_pinned"])
    assert all(_positive(m["node_pss_mb"]) for m in cif["memory"])

    st = res["startup"]
    assert all(_positive(r["first_step_s"]) for r in st["engine"] + st["plain"]) and _positive(st["ratio"])

    ff = res["first_frame"]  # the app against a Textual hello world, 80x24
    assert all(_positive(x) for x in ff["torchdeck_s"] + ff["hello_s"]) and _positive(ff["ratio"])

    ls = res["loader_start"]  # a streamed folder: loader workers forked or spawned, torchdeck and plain
    assert _positive(ls["ratio"])
    assert ls["auto"] and ls["plain_fork"]  # quick mode runs the pair the ratio needs (the rest: full run only)
    assert all(_positive(r["wall_s"]) and _positive(r["first_step_s"]) and r["first_step_s"] < r["wall_s"]
               for k in ("auto", "plain_fork") for r in ls[k])

    gpu = res["gpu"]
    if not data["env"]["cuda"]:
        assert "no CUDA" in gpu["skipped"] and "NOT RUN" in gpu["text"]
    else:
        assert all(_positive(r[1]) and _positive(r[2]) for r in gpu["rows"])


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_bench_quick_deepspeed(quick):
    """deepspeed_vs_plain (a quick run starts two DeepSpeed runs, ZeRO-3): throughput of torchdeck and of
    the tutorial-style script, and each rank's peak memory for ZeRO-3 (a full run: what grows with the model)."""
    from torchdeck.engine.strategies.deepspeed import installed

    data = quick[1]
    ds = _results(quick, ["deepspeed_vs_plain"])["deepspeed_vs_plain"]
    if not installed():
        assert "NOT RUN" in ds["text"] and "pip install" in ds["skipped"]
        return
    assert _positive(ds["ratio"])
    assert all(_positive(r["samples_per_s"]) for r in ds["engine"] + ds["plain"])
    assert ds["plain"][0]["threads"] == max(1, os.cpu_count() // 2)
    mem = ds["memory"]["per_strategy"]
    full = not data["quick"]
    # quick mode: ZeRO-3's peaks in torchdeck's throughput runs (the full run: mlp jobs for ddp, zero, 1, 2, 3
    # and the tiny-model runs)
    assert len(mem) == 5 if full else list(mem) == ["deepspeed ZeRO-3"]
    assert full or "quick:" in ds["text"] and "forked from a process that imported torch" in ds["text"]
    assert all(_positive(m) for v in mem.values() for m in v["peak_rss_mb"])
    if full:
        assert all(_positive(m) for v in mem.values() for m in v["tiny_model_peak_rss_mb"] + v["model_mb"])


def test_gpu_bench_pieces_work_before_a_gpu_is_found(tmp_path):
    """The GPU benchmark cannot run here; its parts that do not need a GPU are checked so the first
    GPU machine does not find them broken: every engine config it builds is valid for a host with
    2 GPUs, and the plain GPU script trains (bf16 autocast, channels_last) on --device cpu."""
    from bench import common as C
    from bench import gpu
    from torchdeck.engine.hardware import Hardware
    from torchdeck.engine.preflight import from_dict
    from torchdeck.engine.strategies import world_size

    s = dict(steps=4, warm=2, batch=8, train=64)
    hw = Hardware(gpu_count=2, mpi_available=False)
    cfgs = [gpu._cfg(s, **train) for _, train, _ in gpu.VARIANTS]
    cfgs += [gpu._cfg(s, "ddp", range(2), precision="bf16-mixed"),
             gpu._cfg(s, "dp", range(2), batch=16, precision="bf16-mixed")]
    for d in cfgs:
        cfg = from_dict(d, hw=hw)
        assert cfg.accelerator == "cuda" and cfg.model.name == "resnet18"
    assert [world_size(from_dict(d, hw=hw)) for d in cfgs[-2:]] == [2, 1]

    out = C.run_script("bench.baselines.plain_gpu", ["--device", "cpu", "--steps", "4", "--batch-size", "8",
                                                     "--train-size", "64", "--mark-every", "2", "--bf16",
                                                     "--channels-last"], timeout=300)
    assert out["device"] == "cpu" and [m[0] for m in out["marks"]] == [2, 4]
    assert 0 < out["loss"] < 100
    assert _positive(C.script_result(out, 8, 2)["samples_per_s"])


def test_step_overhead_bench_measures_both_loops():
    from bench import step_overhead

    res = step_overhead.run(reps=1, steps=300)
    assert all(0 < s < 0.1 for s in res["engine_s"] + res["plain_s"])
    assert "torchdeck adds" in res["text"]
