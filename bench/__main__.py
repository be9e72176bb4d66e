"""python -m bench [--quick] [--json PATH] [--only a,b] [--reps N] [--jobs N]

Runs every benchmark in one invocation (baselines and torchdeck side by side, alternating),
prints a table per benchmark and a summary of the targets; --json writes all the numbers.
--quick runs them 3 at a time (--jobs): it proves they run, and its numbers disturb each other;
a full run is one at a time. (3 on 2 cores: while one lane's processes start, rendezvous or
poll, a core would idle; a third lane is there to fill it, with the same CPU spent.) A quick run's
processes wait for work with their OpenMP threads asleep (OMP_WAIT_POLICY=PASSIVE): a one-process
run's two threads spinning for each other while the lanes keep both cores busy doubled its CPU.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import sys
import threading
import time
import traceback

ORDER = ["engine_vs_plain", "ddp_vs_plain", "monitoring_cost", "events_rate", "app", "scaling", "imagefolder_vs_plain",
         "cifar_vs_plain", "startup", "first_frame", "deepspeed_vs_plain", "compare_overhead", "loader_start", "launch_vs_torchrun", "lm_vs_plain", "gpu",
         "fleet", "long_run"]
# Rough seconds each takes in a quick run, 3 lanes on 2 cores (issue 36: its elapsed_s in two runs of
# the smoke set, 2026-11-28, rounded; waits for processes and fork servers included, which CPU-seconds
# leave out), to share them out so that the lanes end together
QUICK_COST = {"deepspeed_vs_plain": 30, "imagefolder_vs_plain": 24, "loader_start": 20, "startup": 16,
              "cifar_vs_plain": 13, "ddp_vs_plain": 11, "monitoring_cost": 11, "scaling": 10,
              "engine_vs_plain": 6, "app": 5, "first_frame": 3, "events_rate": 1}
# Run in this order in one lane: loader_start reads the PNG folder imagefolder_vs_plain wrote
TOGETHER = [("imagefolder_vs_plain", "loader_start")]


def environment() -> dict:
    import torch

    return {"python": platform.python_version(), "torch": torch.__version__, "cores": os.cpu_count(),
            "torch_threads": torch.get_num_threads(), "cuda": torch.cuda.is_available(),
            "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
            "platform": platform.platform(), "load_avg": os.getloadavg(),
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
            "time_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())}


def lanes(names: list[str], jobs: int) -> list[list[str]]:
    """names shared out into at most `jobs` lanes, the costliest first onto the least loaded lane
    (QUICK_COST), a TOGETHER group kept in one lane in its order."""
    groups = [[n] for n in names if not any(n in g for g in TOGETHER)]
    groups += [[n for n in g if n in names] for g in TOGETHER if any(n in names for n in g)]
    groups.sort(key=lambda g: -sum(QUICK_COST.get(n, 5) for n in g))
    out, load = [[] for _ in range(jobs)], [0] * jobs
    for g in groups:
        i = load.index(min(load))
        out[i] += g
        load[i] += sum(QUICK_COST.get(n, 5) for n in g)
    return [lane for lane in out if lane]


def run_lanes(names: list[str], jobs: int, reps: int, meanwhile) -> tuple[dict, list[str]]:
    """The lanes side by side, a thread each (their work is waiting on processes, and one fork
    server, bench.common.fork_script, serves them all), meanwhile() called once they started;
    returns every result and the names that failed."""
    got = [None] * jobs
    threads = [threading.Thread(target=lambda i, lane: got.__setitem__(i, run_here(lane, True, reps)),
                                args=(i, lane), name=f"lane{i}") for i, lane in enumerate(lanes(names, jobs))]
    for t in threads:
        t.start()
    meanwhile()
    for t in threads:
        t.join()
    results, failed = {}, []
    for res, bad in filter(None, got):
        results.update(res)
        failed += bad
    return {n: results[n] for n in names}, failed


def run_here(names: list[str], quick: bool, reps: int) -> tuple[dict, list[str]]:
    results, failed = {}, []
    for name in names:
        t0 = time.monotonic()
        try:
            mod = importlib.import_module(f"bench.{name}")
            res = mod.run(quick=quick, reps=reps)
        except Exception as exc:  # one broken benchmark must not hide the others' numbers
            traceback.print_exc()
            res = {"name": name, "error": f"{type(exc).__name__}: {exc}", "targets": [],
                   "text": f"\n### {name}\nFAILED: {type(exc).__name__}: {exc}"}
            failed.append(name)
        res["elapsed_s"] = round(time.monotonic() - t0, 1)
        results[name] = res
        print(res["text"] + f"\n({name}: {res['elapsed_s']} s)", flush=True)
    return results, failed


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench")
    ap.add_argument("--quick", action="store_true", help="tiny sizes, one repetition, 3 at a time: proves they run")
    ap.add_argument("--json", metavar="PATH", help="write every number to this JSON file")
    ap.add_argument("--only", default="", help=f"comma-separated subset of: {', '.join(ORDER)}")
    ap.add_argument("--reps", type=int, default=0, help="repetitions per measurement (default 3; --quick 1)")
    ap.add_argument("--jobs", type=int, default=0, help="benchmarks run at a time (--quick only; default 3)")
    a = ap.parse_args(argv)
    names = [n.strip() for n in a.only.split(",") if n.strip()] or ORDER
    unknown = [n for n in names if n not in ORDER]
    if unknown:
        ap.error(f"unknown benchmark(s) {unknown}; choose from {ORDER}")
    if a.jobs > 1 and not a.quick:
        ap.error(f"--jobs {a.jobs} runs benchmarks side by side, each disturbing the others' numbers: "
                 "only with --quick (a full run is one at a time)")
    if a.quick:  # before any torch import here; every process of the run inherits it (module docstring)
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    reps = a.reps or (1 if a.quick else 3)
    jobs = a.jobs or (3 if a.quick else 1)
    t0 = time.monotonic()
    head = "quick" + (f", {jobs} at a time" if jobs > 1 else "") + \
        f", OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}" if a.quick else "full"
    env = {}

    def header():
        env.update(environment())
        print(f"torchdeck benchmarks: {head}, reps {reps}, torch {env['torch']}, "
              f"{env['cores']} cores, CUDA {'yes: ' + ', '.join(env['gpus']) if env['cuda'] else 'no'}, "
              f"load {', '.join(f'{x:.1f}' for x in env['load_avg'])}", flush=True)
    if jobs > 1 and len(names) > 1:
        results, failed = run_lanes(names, jobs, reps, header)
    else:
        header()
        results, failed = run_here(names, a.quick, reps)
    wall = round(time.monotonic() - t0, 1)
    print(f"\n### Targets ({wall} s in all)\n")
    for name in names:
        for t in results[name].get("targets", []):
            v = t["value"]
            print(f"- {name}: {t['what']}: {v if not isinstance(v, float) else f'{v:.4g}'} "
                  f"(target {t['target']}): {t['verdict']}")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"env": env, "quick": a.quick, "reps": reps, "jobs": jobs, "wall_s": wall,
                       "command": " ".join(sys.argv), "results": results}, fh, indent=1, default=str)
        print(f"\nwrote {a.json}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
