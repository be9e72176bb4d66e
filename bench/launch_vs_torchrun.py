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


def sizes(quick: bool, steps: int | None = None) -> dict:
    s = dict(steps=12, warm=4, batch=32, train=1024) if quick else dict(steps=400, warm=100, batch=64, train=8192)
    if steps:  # the long form (main): more steps timed, the same warm-up
        s["steps"] = max(steps, s["warm"] + 1)
    return s


def _cpu_s(pid: int) -> float | None:
    """CPU seconds of a process so far, all its threads, by the scheduler (schedstat)."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    total = 0
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as fh:
                total += int(fh.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return total / 1e9


class _Sampler:
    """The CPU of one process (the torchdeck CLI following the run), sampled every 0.2 s with the
    wall time, so that its use between the script's own marks can be read off afterwards."""

    def __init__(self, pid: int):
        import threading

        self.pid, self.samples = pid, []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            c = _cpu_s(self.pid)
            if c is not None:
                self.samples.append((time.time(), c))

    def stop(self) -> None:
        self._stop.set()
        self._t.join()

    def between(self, t0: float, t1: float) -> float | None:
        """CPU seconds used between wall times t0 and t1 (linear between samples)."""
        def at(t):
            xs = self.samples
            for (ta, ca), (tb, cb) in zip(xs, xs[1:]):
                if ta <= t <= tb:
                    return ca + (cb - ca) * (t - ta) / (tb - ta) if tb > ta else ca
            return None
        a, b = at(t0), at(t1)
        return b - a if a is not None and b is not None else None


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
    launcher = (C.console("torchrun", "torch.distributed.run") if kind == "torchrun"
                else C.console("torchdeck", "torchdeck.cli") + ["launch"])
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
            cli = _Sampler(p.pid) if kind == "torchdeck" else None  # torchrun's own process is the ranks' parent
            rc = p.wait(timeout=600)
            t_exit = time.time()
            if cli is not None:
                cli.stop()
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
    # The launcher's CPU between the script's warm-up mark and its last step, by the scheduler: the
    # ranks' parent (torchrun's agent; torchdeck's supervisor) and, for torchdeck, the CLI following it.
    timed = r["t_end"] - r["t_warm"]
    parent = r.get("parent_cpu_s")
    cli_s = cli.between(r["t_warm"], r["t_end"]) if cli is not None else 0.0
    res["timed_s"] = timed
    res["parent_cpu_pct"] = parent / timed * 100 if parent is not None else None
    res["cli_cpu_pct"] = cli_s / timed * 100 if cli_s is not None else None
    res["launcher_cpu_pct"] = (res["parent_cpu_pct"] + (res["cli_cpu_pct"] or 0.0)
                               if res["parent_cpu_pct"] is not None else None)
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
            timed_evs = sum(1 for e in evs if e.get("kind") == "step" and r["t_warm"] <= (e.get("t") or 0) <= r["t_end"])
            res["events_per_s"] = timed_evs / timed if timed > 0 else None  # every rank's, in the timed window
            res["loss_events"] = sum(1 for e in steps if e.get("loss") is not None)  # torchdeck.log's
    return res


def _spread(xs) -> str:
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return "-"
    q = lambda f: xs[min(len(xs) - 1, int(round(f * (len(xs) - 1))))]
    return f"{C.fmt(xs[0], '.3g')}..{C.fmt(xs[-1], '.3g')} (quartiles {C.fmt(q(0.25), '.3g')}..{C.fmt(q(0.75), '.3g')})"


def run(quick: bool = False, reps: int = 3, steps: int | None = None) -> dict:
    s = sizes(quick, steps)
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
    # the spread behind the medians, and what the launcher's processes cost by accounting
    tl_td = [c["steps_per_s"] / b["steps_per_s"] for b, c in zip(td, tl)]
    td_tr = [b["steps_per_s"] / a["steps_per_s"] for a, b in zip(base, td)]
    text += (f"\npaired per repetition: torchdeck/torchrun {_spread(td_tr)}; log/no-log {_spread(tl_td)} "
             f"(log cost = 1 - that; {sum(1 for x in tl_td if x < 1)} of {len(tl_td)} pairs slower with log); "
             "steps/s spread: " + "; ".join(f"{lab.split(' (')[0]} {_spread([r['steps_per_s'] for r in rs])}"
                                             for lab, rs in zip(labels, results)))
    cpu = {k: med(rs, "launcher_cpu_pct") for k, rs in (("torchrun", base), ("torchdeck", td), ("log", tl))}
    eps_log, eps_td = med(tl, "events_per_s"), med(td, "events_per_s")
    per_event = None
    if cpu["log"] is not None and cpu["torchdeck"] is not None and eps_log and eps_td is not None and eps_log > eps_td:
        per_event = (cpu["log"] - cpu["torchdeck"]) / 100 / (eps_log - eps_td) * 1e6
    text += (f"\nlauncher CPU between the script's marks, % of one core (median; the ranks' parent, plus for torchdeck "
             f"the CLI following the run): torchrun {C.fmt(cpu['torchrun'])}, torchdeck {C.fmt(cpu['torchdeck'])} "
             f"(supervisor {C.fmt(med(td, 'parent_cpu_pct'))}, CLI {C.fmt(med(td, 'cli_cpu_pct'))}), torchdeck + log "
             f"{C.fmt(cpu['log'])} (supervisor {C.fmt(med(tl, 'parent_cpu_pct'))}, CLI {C.fmt(med(tl, 'cli_cpu_pct'))}); "
             f"step events/s {C.fmt(eps_td)} without log, {C.fmt(eps_log)} with: "
             f"{C.fmt(per_event, '.3g')} us of launcher CPU per extra event")
    fails = [r["exit_failure"] for r in td + tl if r.get("exit_failure")]
    if fails:
        text += (f"\nWARNING: {len(fails)} of {len(td) + len(tl)} torchdeck launch runs ended failed after the "
                 f"script measured (the watchdog's stack signal during a rank's exit): {fails[0]}")
    return {"name": NAME, "text": text, "sizes": s, "reps": reps, "torchdeck_threads": planned,
            "torchrun": tr, "torchdeck": td, "torchdeck_log": tl, "torchrun_torchdeck_threads": tr_omp,
            "compared_against": base_label, "ratio_throughput": tp_ratio, "paired_throughput": tp_paired,
            "ratio_first_step": fs_ratio, "paired_first_step": fs_paired, "log_cost": log_cost,
            "paired_log_cost": log_paired, "torchdeck_exit_failures": len(fails),
            "paired_log_ratios": tl_td, "paired_throughput_ratios": td_tr, "launcher_cpu_pct": cpu,
            "launcher_cpu_us_per_event": per_event, "load_avg_after": os.getloadavg(),
            "targets": [
                {"what": "launch/torchrun throughput", "value": tp_ratio, "target": f">= {TP_TARGET}",
                 "verdict": C.verdict(tp_ratio, TP_TARGET)},
                {"what": "launch/torchrun command to first step", "value": fs_ratio, "target": f"<= {FIRST_TARGET}",
                 "verdict": C.verdict(fs_ratio, FIRST_TARGET, higher_is_better=False)},
                {"what": "torchdeck.log every step, throughput cost", "value": log_cost, "target": f"< {LOG_TARGET}",
                 "verdict": C.verdict(log_cost, LOG_TARGET, higher_is_better=False)}]}


def main(argv=None) -> int:
    """The long form: python -m bench.launch_vs_torchrun --steps 1200 --reps 10 [--json PATH]."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m bench.launch_vs_torchrun")
    ap.add_argument("--steps", type=int, default=None, help="steps per run (timed from step 100; default 400)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", metavar="PATH")
    a = ap.parse_args(argv)
    load0 = os.getloadavg()
    t0 = time.time()
    res = run(quick=a.quick, reps=a.reps, steps=a.steps)
    res["load_avg_before"] = load0
    res["time_utc"] = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t0))
    res["elapsed_s"] = round(time.time() - t0, 1)
    print(res["text"])
    print(f"load average before {', '.join(f'{x:.2f}' for x in load0)}, after "
          f"{', '.join(f'{x:.2f}' for x in res['load_avg_after'])}; {res['elapsed_s']} s")
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
