"""Issue 29: one plain torchrun-style DDP script (bench/baselines/ddp_script.py, 2 ranks, gloo)
under `torchrun --nproc-per-node 2` and under `torchdeck launch --nproc-per-node 2`, the same
machine, alternating; and under torchdeck launch with `torchdeck.log` every step.

Every number comes from the script's own rank 0: steps/s between the end of its warm-up step and
its last step, and the wall time at the end of its first step, less time.time() taken just
before the launcher command was started (command to first step: the launcher, the imports, the
process group, the data, one step). Targets: throughput torchdeck/torchrun >= 0.99, command to
first step torchdeck/torchrun <= 1.0, torchdeck.log every step costing < 1 % of throughput.

Threads: torchrun sets OMP_NUM_THREADS=1 per rank (when it is unset); torchdeck sets usable
cores / ranks. Where these differ, torchrun is also run with torchdeck's value (the better plain
script is the one compared against).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from bench import common as C

NAME = "launch_vs_torchrun"
RANKS = 2
TP_TARGET = 0.99
FIRST_TARGET = 1.0
LOG_TARGET = 0.01
SCRIPT = C.ROOT / "bench" / "baselines" / "ddp_script.py"


def sizes(quick: bool) -> dict:
    return dict(steps=12, warm=4, batch=32, train=1024) if quick else \
        dict(steps=400, warm=100, batch=64, train=8192)


def _exe(name: str, module: str) -> list[str]:
    exe = Path(sys.executable).with_name(name)
    return [str(exe)] if exe.exists() else [sys.executable, "-m", module]


def torchdeck_threads() -> int:
    """OMP_NUM_THREADS torchdeck launch plans for RANKS ranks on this machine (engine.affinity)."""
    from torchdeck.engine.affinity import usable_cpus

    return max(1, usable_cpus() // RANKS)


def _launch(kind: str, s: dict, root: Path, i: int, log: bool = False, omp: int | None = None) -> dict:
    out = root / f"{kind}-{'log-' if log else ''}{i}.json"
    runs = root / "runs"
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    env["TORCHDECK_RUNS"] = str(runs)
    if omp is not None:
        env["OMP_NUM_THREADS"] = str(omp)
    launcher = (_exe("torchrun", "torch.distributed.run") if kind == "torchrun"
                else _exe("torchdeck", "torchdeck.cli") + ["launch"])
    cmd = launcher + ["--nproc-per-node", str(RANKS), str(SCRIPT), "--steps", str(s["steps"]),
                      "--warm", str(s["warm"]), "--batch-size", str(s["batch"]),
                      "--train-size", str(s["train"]), "--out", str(out)] + (["--log-every-step"] if log else [])
    for attempt in (1, 2):
        before = set(runs.glob("*")) if runs.exists() else set()
        logf = root / f"{out.stem}.log"
        with open(logf, "w") as fh:
            t0 = time.time()
            p = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 env=env, cwd=str(C.ROOT))
            rc = p.wait(timeout=600)
            t_exit = time.time()
        text = logf.read_text(errors="replace")
        # a plain gloo script now and then aborts a rank at exit after it measured (as run_script)
        if rc == 0 or attempt == 2 or "terminate called without an active exception" not in text:
            break
        print(f"({NAME}: {kind} rank aborted at exit; repetition run again)", file=sys.stderr, flush=True)
    # torchdeck's watchdog can take the script's teardown after its last step (destroy_process_group,
    # exit: seconds on a loaded machine) for a slow step and signal the ranks for their stacks; a rank
    # already finalizing has lost faulthandler's handler and dies of SIGUSR2, the run "failed". The
    # script measured before that: its numbers count, and the failure is kept in the result.
    exit_failure = None
    if rc != 0 and kind == "torchdeck" and out.exists() and "SIGUSR2" in text:
        exit_failure = next((ln.strip() for ln in text.splitlines() if "root cause" in ln), f"exit {rc}, SIGUSR2")
        print(f"({NAME}: torchdeck launch exited {rc} after the script measured: {exit_failure})",
              file=sys.stderr, flush=True)
    elif rc != 0 or not out.exists():
        raise RuntimeError(f"{' '.join(cmd)} failed ({rc}):\n{text[-2000:]}")
    r = json.loads(out.read_text())
    res = {"steps_per_s": r["steps_per_s"], "samples_per_s": r["samples_per_s"],
           "first_step_s": r["t_first_step"] - t0, "script_start_s": r["t_start"] - t0, "command_s": t_exit - t0, "threads": r["threads"],
           "omp_num_threads": r["omp_num_threads"], "under_torchdeck": r["under_torchdeck"],
           "logged": r["logged"], "steps": r["steps"], "rc": rc, "exit_failure": exit_failure}
    if kind == "torchdeck":
        new = sorted(set(runs.glob("*")) - before)
        if new:  # where the start-up went: the supervisor's run_started and the ranks' rank_ready
            from torchdeck.engine import events

            evs = events.read_all(new[-1] / "events.jsonl")
            started = [e["t"] for e in evs if e.get("kind") == "run_started"]
            ready = [e["t"] for e in evs if e.get("kind") == "rank_ready"]
            res["supervisor_s"] = min(started) - t0 if started else None
            res["ranks_ready_s"] = max(ready) - t0 if ready else None
            steps = [e for e in evs if e.get("kind") == "step" and e.get("rank") == 0]
            res["step_events"] = len(steps)
            res["loss_events"] = sum(1 for e in steps if e.get("loss") is not None)  # torchdeck.log's
    return res


def run(quick: bool = False, reps: int = 3) -> dict:
    s = sizes(quick)
    root = C.tmpdir(NAME)
    planned = torchdeck_threads()
    counter = {"n": 0}

    def variant(kind, **kw):
        def go():
            counter["n"] += 1
            return _launch(kind, s, root, counter["n"], **kw)
        return go

    fns = [variant("torchrun"), variant("torchdeck"), variant("torchdeck", log=True)]
    labels = ["torchrun (OMP_NUM_THREADS its default, 1)", "torchdeck launch",
              "torchdeck launch, torchdeck.log every step"]
    if planned != 1:
        fns.append(variant("torchrun", omp=planned))
        labels.append(f"torchrun, OMP_NUM_THREADS={planned} (torchdeck's)")
    results = C.alternate(reps, *fns)
    tr, td, tl = results[:3]
    tr_omp = results[3] if len(results) > 3 else None

    med = lambda rs, k: C.median([r.get(k) for r in rs])
    # the plain script compared against: the faster torchrun (by median steps/s)
    base, base_label = tr, labels[0]
    if tr_omp and (med(tr_omp, "steps_per_s") or 0) > (med(tr, "steps_per_s") or 0):
        base, base_label = tr_omp, labels[3]
    b_tp, b_fs = med(base, "steps_per_s"), med(base, "first_step_s")
    d_tp, d_fs, l_tp = med(td, "steps_per_s"), med(td, "first_step_s"), med(tl, "steps_per_s")
    tp_ratio = d_tp / b_tp if d_tp and b_tp else None
    fs_ratio = d_fs / b_fs if d_fs and b_fs else None
    log_cost = 1 - l_tp / d_tp if l_tp and d_tp else None
    paired = lambda xs, ys, k: C.median([x[k] / y[k] for x, y in zip(xs, ys)])
    tp_paired = paired(td, base, "steps_per_s")
    fs_paired = paired(td, base, "first_step_s")
    log_paired = 1 - paired(tl, td, "steps_per_s")

    rows = []
    for label, rs in zip(labels, results):
        tp, fs = med(rs, "steps_per_s"), med(rs, "first_step_s")
        rows.append([label, tp, med(rs, "samples_per_s"), fs, med(rs, "script_start_s"), med(rs, "command_s"), rs[0]["omp_num_threads"],
                     tp / b_tp if tp and b_tp else None, fs / b_fs if fs and b_fs else None])
    text = C.table(f"{NAME}: bench/baselines/ddp_script.py, {RANKS} ranks gloo, cnn, batch {s['batch']}/rank, "
                   f"steps {s['warm']}..{s['steps']} timed by the script, median of {reps}, alternating",
                   ["launcher", "steps/s", "samples/s (global)", "command to 1st step s", "command to script start s",
                    "command total s",
                    "OMP threads", "steps/s vs torchrun", "1st step vs torchrun"], rows)
    text += (f"\nthroughput torchdeck/torchrun {C.fmt(tp_ratio, '.4g')} (paired {C.fmt(tp_paired, '.4g')}; "
             f"target >= {TP_TARGET}: {C.verdict(tp_ratio, TP_TARGET)}); "
             f"command to first step torchdeck/torchrun {C.fmt(fs_ratio, '.4g')} (paired {C.fmt(fs_paired, '.4g')}; "
             f"target <= {FIRST_TARGET}: {C.verdict(fs_ratio, FIRST_TARGET, higher_is_better=False)}); "
             f"torchdeck.log every step costs {C.fmt(log_cost * 100 if log_cost is not None else None)} % "
             f"(paired {C.fmt(log_paired * 100 if log_paired is not None else None)} %; target < {LOG_TARGET * 100:g} %: "
             f"{C.verdict(log_cost, LOG_TARGET, higher_is_better=False)}); compared against: {base_label}; "
             f"torchdeck's start-up, median: supervisor up {C.fmt(med(td, 'supervisor_s'))} s, ranks ready "
             f"{C.fmt(med(td, 'ranks_ready_s'))} s after the command; runs steps/s torchrun/torchdeck/log: "
             + ", ".join(f"{a['steps_per_s']:.2f}/{b['steps_per_s']:.2f}/{c['steps_per_s']:.2f}"
                         for a, b, c in zip(tr, td, tl))
             + "; first step s: " + ", ".join(f"{a['first_step_s']:.2f}/{b['first_step_s']:.2f}/{c['first_step_s']:.2f}"
                                              for a, b, c in zip(tr, td, tl)))
    fails = [r["exit_failure"] for r in td + tl if r.get("exit_failure")]
    if fails:
        text += (f"\nWARNING: {len(fails)} of {len(td) + len(tl)} torchdeck launch runs ended failed after the "
                 f"script measured (the watchdog's stack signal during a rank's exit): {fails[0]}")
    return {"name": NAME, "text": text, "sizes": s, "reps": reps, "torchdeck_threads": planned,
            "torchrun": tr, "torchdeck": td, "torchdeck_log": tl, "torchrun_torchdeck_threads": tr_omp,
            "compared_against": base_label, "ratio_throughput": tp_ratio, "paired_throughput": tp_paired,
            "ratio_first_step": fs_ratio, "paired_first_step": fs_paired, "log_cost": log_cost,
            "paired_log_cost": log_paired, "torchdeck_exit_failures": len(fails),
            "targets": [
                {"what": "launch/torchrun throughput", "value": tp_ratio, "target": f">= {TP_TARGET}",
                 "verdict": C.verdict(tp_ratio, TP_TARGET)},
                {"what": "launch/torchrun command to first step", "value": fs_ratio, "target": f"<= {FIRST_TARGET}",
                 "verdict": C.verdict(fs_ratio, FIRST_TARGET, higher_is_better=False)},
                {"what": "torchdeck.log every step, throughput cost", "value": log_cost, "target": f"< {LOG_TARGET}",
                 "verdict": C.verdict(log_cost, LOG_TARGET, higher_is_better=False)}]}
