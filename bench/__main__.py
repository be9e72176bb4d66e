"""python -m bench [--quick] [--json PATH] [--only a,b] [--reps N]

Runs every benchmark in one invocation (baselines and torchdeck side by side, alternating),
prints a table per benchmark and a summary of the targets; --json writes all the numbers.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import sys
import time
import traceback

ORDER = ["engine_vs_plain", "ddp_vs_plain", "monitoring_cost", "events_rate", "app", "scaling", "imagefolder_vs_plain",
         "cifar_vs_plain", "startup", "first_frame", "deepspeed_vs_plain", "compare_overhead", "loader_start", "launch_vs_torchrun", "lm_vs_plain", "gpu",
         "fleet", "long_run"]


def environment() -> dict:
    import torch

    return {"python": platform.python_version(), "torch": torch.__version__, "cores": os.cpu_count(),
            "torch_threads": torch.get_num_threads(), "cuda": torch.cuda.is_available(),
            "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
            "platform": platform.platform(), "load_avg": os.getloadavg(),
            "time_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench")
    ap.add_argument("--quick", action="store_true", help="tiny sizes, one repetition: proves they run")
    ap.add_argument("--json", metavar="PATH", help="write every number to this JSON file")
    ap.add_argument("--only", default="", help=f"comma-separated subset of: {', '.join(ORDER)}")
    ap.add_argument("--reps", type=int, default=0, help="repetitions per measurement (default 3; --quick 1)")
    a = ap.parse_args(argv)
    names = [n.strip() for n in a.only.split(",") if n.strip()] or ORDER
    unknown = [n for n in names if n not in ORDER]
    if unknown:
        ap.error(f"unknown benchmark(s) {unknown}; choose from {ORDER}")
    reps = a.reps or (1 if a.quick else 3)
    env = environment()
    print(f"torchdeck benchmarks: {'quick' if a.quick else 'full'}, reps {reps}, torch {env['torch']}, "
          f"{env['cores']} cores, CUDA {'yes: ' + ', '.join(env['gpus']) if env['cuda'] else 'no'}, "
          f"load {', '.join(f'{x:.1f}' for x in env['load_avg'])}", flush=True)
    results, failed = {}, []
    for name in names:
        t0 = time.monotonic()
        try:
            mod = importlib.import_module(f"bench.{name}")
            res = mod.run(quick=a.quick, reps=reps)
        except Exception as exc:  # one broken benchmark must not hide the others' numbers
            traceback.print_exc()
            res = {"name": name, "error": f"{type(exc).__name__}: {exc}", "targets": [],
                   "text": f"\n### {name}\nFAILED: {type(exc).__name__}: {exc}"}
            failed.append(name)
        res["elapsed_s"] = round(time.monotonic() - t0, 1)
        results[name] = res
        print(res["text"] + f"\n({name}: {res['elapsed_s']} s)", flush=True)
    print("\n### Targets\n")
    for name in names:
        for t in results[name].get("targets", []):
            v = t["value"]
            print(f"- {name}: {t['what']}: {v if not isinstance(v, float) else f'{v:.4g}'} "
                  f"(target {t['target']}): {t['verdict']}")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"env": env, "quick": a.quick, "reps": reps, "command": " ".join(sys.argv),
                       "results": results}, fh, indent=1, default=str)
        print(f"\nwrote {a.json}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
