"""Shared pieces: configs, running the engine for real, reading throughput from events, tables.

Timings come from timestamps taken inside the training processes (step events for torchdeck,
marks at the same steps for the baselines), so process start-up and imports stay out of
throughput numbers and are reported separately.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def engine_config(**over) -> dict:
    """A cpu run of the tutorial CNN on the synthetic set, without eval or epoch checkpoints, so
    the steps measured are training steps only; `over` is a nested dict merged on top."""
    cfg = {
        "name": "bench", "strategy": "cpu", "accelerator": "cpu", "devices": 1,
        "model": {"name": "cnn"},
        "data": {"dataset": "synthetic", "train_size": 8192, "val_size": 2048},
        "optimizer": {"name": "sgd", "lr": 0.05, "momentum": 0.9},
        "train": {"batch_size": 64, "epochs": 1000, "max_steps": 200, "eval_every_epoch": False,
                  "log_every_n_steps": 10},
        "checkpoint": {"every_epoch": False, "keep_last": 1},
        "nodes": {"master_port": 0},
    }
    return merge(cfg, over)


def merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def run_engine(cfg_dict: dict, root: Path, timeout: float = 600, on_poll=None) -> dict:
    """Launch a real run (supervisor process, spawned ranks) and wait for it; on_poll(run) is
    called every 50 ms while it runs (e.g. to sample memory)."""
    from torchdeck.engine import events
    from torchdeck.engine.runs import control as launch
    from torchdeck.engine.config import from_dict

    cfg = from_dict(cfg_dict)
    t_launch = time.time()
    run = launch.start(cfg, root)
    deadline = time.monotonic() + timeout
    final = None
    while time.monotonic() < deadline:
        final = run.final_status()
        if final is not None:
            break
        if on_poll is not None:
            on_poll(run)
        time.sleep(0.05)
    if final is None:
        launch.kill(run)
        raise RuntimeError(f"run {run.path} did not finish in {timeout:.0f} s")
    evs = events.read_all(run.events_path)
    if final.get("status") != "finished":
        raise RuntimeError(f"run {run.path} {final.get('status')}: {final.get('root_cause')}")
    return {"run": run, "events": evs, "t_launch": t_launch}


def step_marks(evs: list[dict], rank: int = 0) -> list[tuple[int, float]]:
    return sorted((e["step"], e["t"]) for e in evs if e.get("kind") == "step" and e.get("rank") == rank)


def throughput(marks, samples_per_step: int, warm_steps: int) -> float | None:
    """Samples/s between the first mark at or after warm_steps and the last mark."""
    marks = sorted(marks)
    use = [m for m in marks if m[0] >= warm_steps]
    if len(use) < 2:
        return None
    (s0, t0), (s1, t1) = use[0], use[-1]
    return (s1 - s0) * samples_per_step / max(t1 - t0, 1e-9)


def engine_result(res: dict, samples_per_step: int, warm_steps: int) -> dict:
    evs = res["events"]
    ready = [e["t"] for e in evs if e.get("kind") == "rank_ready"]
    marks = step_marks(evs)
    steps = [e for e in evs if e.get("kind") == "step" and e.get("rank") == 0 and e["step"] > warm_steps]
    wait = sum(e.get("data_wait_s") or 0.0 for e in steps)
    busy = wait + sum(e.get("compute_s") or 0.0 for e in steps)
    return {
        "samples_per_s": throughput(marks, samples_per_step, warm_steps),
        "startup_s": (max(ready) - res["t_launch"]) if ready else None,
        "first_step_s": (marks[0][1] - res["t_launch"]) if marks else None,
        # rank 0's own data-wait share after the warm-up (the Monitor's wait column for these steps)
        "data_wait": wait / busy if busy else None,
    }


def console(name: str, module: str) -> list[str]:
    """The command for a console script of this venv (torchrun, torchdeck), or python -m its module
    when it was not installed as a script."""
    exe = Path(sys.executable).with_name(name)
    return [str(exe)] if exe.exists() else [sys.executable, "-m", module]


def run_script(module: str, args: list[str], timeout: float = 600, env: dict | None = None,
               forked: bool = False, imports: tuple[str, ...] = ()) -> dict:
    """Run `python -m module args` and parse the JSON object it prints last.

    forked (a --quick run only): the script is forked from a process that has imported torch
    (fork_script), and its ranks are forked from it (baselines.start_ranks) instead of each importing
    torch afresh; its training is the same code, its start-up is not a user's."""
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in e.get("PYTHONPATH", "").split(os.pathsep) if p])
    e.update(env or {})
    for attempt in (1, 2):
        t_launch = time.time()
        if forked:
            p = fork_script(module, args, timeout, env or {}, imports)
        else:
            p = subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True,
                               timeout=timeout, env=e, cwd=str(ROOT))
        # A plain script's gloo teardown now and then aborts a rank at exit ("terminate called
        # without an active exception", SIGABRT) after it measured: run that repetition again.
        if p.returncode == 0 or attempt == 2 or "terminate called without an active exception" not in p.stderr:
            break
        print(f"({module}: a rank aborted at exit; repetition run again)", file=sys.stderr, flush=True)
    if p.returncode != 0:
        raise RuntimeError(f"{module} failed ({p.returncode}{', forked' if forked else ''}):\n{p.stderr[-2000:]}")
    out = json.loads(p.stdout.strip().splitlines()[-1])
    out["t_launch"] = t_launch
    return out


# What a forked script and its ranks would otherwise import each: torch._dynamo is what the first
# optimizer or DDP pulls in, as much again as torch itself.
PRELOAD = ["torch", "torch._dynamo", "torch.distributed", "torch.nn.parallel", "torch.utils.data",
           "torchdeck.engine.data", "torchdeck.engine.models"]


FORKED_NOTE = ("quick: the plain scripts and their ranks forked from a process that imported torch "
               "(their start-up is not a user's)")


def fork_script(module: str, args: list[str], timeout: float, env: dict,
                imports: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """`python -m module args` forked from a multiprocessing fork server that imported PRELOAD once
    for this process (the smoke run starts ~15 baseline processes; each import costs ~4 CPU-s on
    2 cores). imports: more modules the script's ranks use (deepspeed), imported before it runs.
    Returns what subprocess.run would (returncode, stdout, stderr)."""
    import multiprocessing as mp
    import signal

    from bench.baselines import RANK_START_ENV

    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)  # read when the server starts (the first call)
    with tempfile.TemporaryDirectory(prefix="torchdeck-bench-fork-") as d:
        out, err = Path(d) / "stdout", Path(d) / "stderr"
        proc = ctx.Process(target=_forked_main, args=(module, list(args), {**env, RANK_START_ENV: "fork"},
                                                      tuple(imports), str(out), str(err)), name=module)
        proc.start()
        proc.join(timeout)
        if proc.exitcode is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # the script and the ranks it forked
            except ProcessLookupError:
                pass
            proc.join()
            raise subprocess.TimeoutExpired([module, *args], timeout)
        code = proc.exitcode if proc.exitcode >= 0 else 128 - proc.exitcode
        text = lambda f: f.read_text(errors="replace") if f.exists() else ""  # not there: it died before
        return subprocess.CompletedProcess([module, *args], code, text(out), text(err))


def _forked_main(module: str, args: list[str], env: dict, imports: tuple[str, ...], out: str, err: str) -> None:
    """In the forked child: its own process group, stdout and stderr to files (the ranks it forks
    inherit them), the environment and argv the script would have had, then the script as __main__."""
    import importlib
    import runpy

    os.setsid()
    for fd, path in ((1, out), (2, err)):
        f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(f, fd)
        os.close(f)
    os.environ.update(env)
    os.chdir(ROOT)
    for name in imports:
        importlib.import_module(name)
    sys.argv = [module, *args]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


def script_result(out: dict, samples_per_step: int, warm_steps: int) -> dict:
    marks = [tuple(m) for m in out["marks"]]
    return {
        "samples_per_s": throughput(marks, samples_per_step, warm_steps),
        "startup_s": out["t_ready"] - out["t_launch"],
        "first_step_s": (marks[0][1] - out["t_launch"]) if marks else None,
    }


def alternate(reps: int, *fns):
    """Run each fn reps times, rotating which goes first (a, b, c / b, c, a / ...), to cancel drift;
    returns one list of results per fn."""
    out = [[] for _ in fns]
    for i in range(reps):
        for j in range(len(fns)):
            k = (i + j) % len(fns)
            out[k].append(fns[k]())
    return out


def tmpdir(prefix: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=f"torchdeck-bench-{prefix}-"))


def fmt(v, spec=".3g") -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return format(v, spec)
    return str(v)


def table(title: str, header: list[str], rows: list[list]) -> str:
    cells = [header] + [[fmt(c) for c in r] for r in rows]
    widths = [max(len(str(r[i])) for r in cells) for i in range(len(header))]
    line = lambda r: "| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths)) + " |"
    out = [f"\n### {title}\n", line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [line(r) for r in cells[1:]]
    return "\n".join(out)


def verdict(value, target, higher_is_better=True) -> str:
    if value is None:
        return "not measured"
    ok = value >= target if higher_is_better else value <= target
    return "met" if ok else "MISSED"
