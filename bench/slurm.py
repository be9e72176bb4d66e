"""Issue 38: a SLURM job with a torchdeck supervisor per node against the same job as `export --sbatch`
wrote it before (srun + torchrun per node, no supervisor), on the local two-node cluster
(tests/slurm/cluster.sh: n1 and n2 on this machine, its 2 cores shared).

Measured from the login node's side (this process): from `sbatch` to the first step event seen in
the job's run directory (node 0's events.jsonl for ours; any node's for torchrun's), alternating,
median of the reps; target <= 1.1x. And each node's supervisor CPU as a share of one core: the
supervisor process alone (its threads: the event writer, the node link, the node sampler; not its
ranks), from the first step to its last sample before the end (steady state) and over its whole life.

    python -m bench.slurm                 # 4 reps a side, 3000 steps each (about 6 min)
    python -m bench.slurm --reps 2 --steps 1000 --log-every 1   # every step logged: the supervisors' busiest
"""
from __future__ import annotations

import argparse
import copy
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil

from bench import common as C

NAME = "slurm"
TARGET_RATIO = 1.1
TARGET_CPU = 0.02  # of one core, per node
JOB_S = 600
CLUSTER = C.ROOT / "tests" / "slurm" / "cluster.sh"


def job_config(steps: int, log_every: int) -> dict:
    """Two nodes x one gloo DDP rank, an mlp on synthetic data; log_every 1 is the supervisors'
    busiest case (each of node 1's step events crosses the node link), 10 the default."""
    return {"name": "bench-slurm", "strategy": "ddp", "devices": 1, "nodes": {"num_nodes": 2},
            "model": {"name": "mlp", "hidden": 64},
            "data": {"train_size": 4096, "val_size": 64, "image_size": 8, "num_workers": 0},
            "optimizer": {"name": "sgd", "lr": 0.05},
            "train": {"batch_size": 16, "epochs": 100, "max_steps": steps, "eval_every_epoch": False,
                      "log_every_n_steps": log_every, "threads_per_rank": 1},
            "checkpoint": {"every_epoch": False}}


def cluster_env() -> dict:
    """SLURM_CONF of the local cluster, started if it is not up."""
    if not os.environ.get("SLURM_CONF"):
        out = subprocess.run(["bash", str(CLUSTER), "up"], capture_output=True, text=True, timeout=600)
        if out.returncode != 0:
            raise RuntimeError(f"no local SLURM cluster: {out.stderr[-1000:]}")
        os.environ["SLURM_CONF"] = out.stdout.strip().splitlines()[-1].split("=", 1)[1]
    return dict(os.environ)


def sbatch(script: Path, cwd: Path, env: dict) -> tuple[str, float]:
    t0 = time.time()
    r = subprocess.run(["sbatch", "--parsable", str(script)], cwd=cwd, env=env, capture_output=True, text=True,
                       timeout=60)
    if r.returncode != 0:
        raise RuntimeError(f"sbatch refused {script}: {r.stderr}")
    return r.stdout.strip().split(";")[0], t0


class Job:
    """A submitted job, followed with squeue: when it left PENDING (other jobs on the cluster can
    hold the two nodes: that wait is not the job's)."""

    def __init__(self, job: str, t0: float):
        self.id, self.t0, self.running_t = job, t0, None

    def queued(self) -> bool:
        r = subprocess.run(["squeue", "-h", "-j", self.id, "-o", "%T"], capture_output=True, text=True, timeout=60)
        state = r.stdout.strip()
        if state and state != "PENDING" and self.running_t is None:
            self.running_t = time.time()
        return bool(state)

    def result(self, first: float) -> dict:
        pending = (self.running_t or self.t0) - self.t0
        return {"job": self.id, "first_step_s": first - self.t0, "pending_s": pending,
                "running_to_step_s": first - self.t0 - pending}


def output_tail(folder: Path) -> str:
    return "\n".join(f"--- {p}\n{p.read_text()[-1500:]}" for p in sorted(folder.glob("**/*.out")) + sorted(folder.glob("**/*.log")))


def first_step_t(paths) -> float | None:
    """The wall time of the first step event in any of these events files."""
    from torchdeck.engine import events

    ts = [e["t"] for p in paths for e in events.read_all(p) if e.get("kind") == "step"]
    return min(ts) if ts else None


class SupervisorCPU:
    """Each node's supervisor process, sampled while the job runs: CPU seconds at the first step and
    at the last sample; the share of one core over that window and over its life."""

    def __init__(self, run_dir: Path, nodes: int):
        self.pid_files = [run_dir / "supervisor.pid"] + [run_dir / f"node{k}" / "supervisor.pid" for k in range(1, nodes)]
        self.procs: dict[int, psutil.Process] = {}
        self.at_first: dict[int, tuple[float, float]] = {}
        self.last: dict[int, tuple[float, float]] = {}
        self.born: dict[int, float] = {}

    def sample(self, stepped: bool) -> None:
        for k, f in enumerate(self.pid_files):
            try:
                if k not in self.procs:
                    self.procs[k] = psutil.Process(int(f.read_text().strip()))
                    self.born[k] = self.procs[k].create_time()
                t = self.procs[k].cpu_times()
                now = (time.time(), t.user + t.system)
            except (OSError, ValueError, psutil.Error):
                continue
            if stepped and k not in self.at_first:
                self.at_first[k] = now
            self.last[k] = now

    def shares(self) -> list[dict]:
        out = []
        for k in sorted(self.procs):
            (t1, c1), born = self.last[k], self.born[k]
            t0, c0 = self.at_first.get(k, (t1, c1))
            out.append({"node": k, "steady": (c1 - c0) / (t1 - t0) if t1 > t0 else None,
                        "life": c1 / (t1 - born) if t1 > born else None, "window_s": t1 - t0})
        return out


def run_ours(cfg, root: Path, env: dict) -> dict:
    """A run directory made as submission makes it, its batch_script, sbatch."""
    from torchdeck.engine.rundir.layout import RunDir
    from torchdeck.engine.slurm.script import batch_script

    rd = RunDir.create(cfg, root, {"cwd": str(root)})
    script = rd.path / "job.sbatch"
    script.write_text(batch_script(cfg, str(rd.path)))
    job = Job(*sbatch(script, root, env))
    cpu, first = SupervisorCPU(rd.path, cfg.nodes.num_nodes), None
    deadline = time.monotonic() + JOB_S
    while job.queued() and time.monotonic() < deadline:
        if first is None:
            first = first_step_t([rd.events_path])
        cpu.sample(first is not None)
        time.sleep(0.1 if first is None else 0.5)
    final = rd.final_status() or {}
    if final.get("status") != "finished" or first is None:
        raise RuntimeError(f"job {job.id} ended {final}\n{output_tail(rd.path)}")
    return {**job.result(first), "cpu": cpu.shares()}


def run_torchrun(cfg, root: Path, env: dict) -> dict:
    """The same job as export --sbatch wrote it before issue 38 (engine.export.torchrun_sbatch)."""
    from torchdeck.engine.export import torchrun_sbatch

    where = root / f"tr-{time.time_ns()}"
    where.mkdir()
    script = where / "job.sbatch"
    cfg = copy.deepcopy(cfg)  # a port of its own: the cluster's other jobs may hold 29500 on n1
    cfg.nodes.master_port = random.randrange(30000, 40000, 2)
    script.write_text(torchrun_sbatch(cfg))
    env = dict(env, TORCHDECK_RUNS=str(where / "runs"), TORCHDECK_VENV=str(Path(sys.executable).parent.parent))
    job = Job(*sbatch(script, where, env))
    first, deadline = None, time.monotonic() + JOB_S
    while job.queued() and time.monotonic() < deadline:
        if first is None:
            first = first_step_t(list((where / "runs").glob("*/node*/events.jsonl")))
        time.sleep(0.1 if first is None else 0.5)
    if first is None:
        raise RuntimeError(f"job {job.id}: no step seen\n{output_tail(where)}")
    return job.result(first)


def run(quick: bool = False, reps: int = 4, steps: int = 3000, log_every: int = 10) -> dict:
    from torchdeck.engine import config as cfgmod

    reps, steps = (1, 60) if quick else (reps, steps)
    cfg = cfgmod.from_dict(job_config(steps, log_every))
    env, root = cluster_env(), C.tmpdir("slurm")
    load = [os.getloadavg()]
    try:
        ours, theirs = C.alternate(reps, lambda: run_ours(cfg, root, env), lambda: run_torchrun(cfg, root, env))
        load.append(os.getloadavg())
    finally:
        shutil.rmtree(root, ignore_errors=True)
    med = lambda ms, k: C.median([m[k] for m in ms])
    o, t = med(ours, "running_to_step_s"), med(theirs, "running_to_step_s")
    ratio, raw = o / t, med(ours, "first_step_s") / med(theirs, "first_step_s")
    shares = [c for m in ours for c in m["cpu"]]
    steady = max((c["steady"] for c in shares if c["steady"] is not None), default=None)
    each = lambda ms: " ".join(f"{m['first_step_s']:.1f}" + (f" ({m['pending_s']:.1f})" if m["pending_s"] >= 0.5 else "")
                               for m in ms)
    rows = [["torchrun per node (export --sbatch before issue 38)", each(theirs), med(theirs, "first_step_s"), t, 1.0, 1.0],
            ["a torchdeck supervisor per node", each(ours), med(ours, "first_step_s"), o, raw, ratio]]
    res = {"name": NAME, "load": load, "ours": ours, "torchrun": theirs, "ratio": ratio, "ratio_with_pending": raw,
           "cpu_steady_max": steady}
    res["text"] = C.table(f"slurm: sbatch to the first step event seen in the run directory (step {log_every}), "
                          f"2 nodes x 1 gloo rank, {steps} steps",
                          ["job", "s each rep (pending behind other jobs)", "median s", "median s, running to step",
                           "vs torchrun", "vs torchrun, pending left out"], rows)
    cpu_rows = [[m["job"], c["node"], f"{c['window_s']:.1f}", f"{100 * c['steady']:.2f}" if c["steady"] is not None else "-",
                 f"{100 * c['life']:.2f}" if c["life"] is not None else "-"] for m in ours for c in m["cpu"]]
    res["text"] += C.table("slurm: each node's supervisor CPU, % of one core",
                           ["job", "node", "steady window s", "first step to end", "whole life (imports too)"], cpu_rows)
    res["text"] += "\nload average before/after: " + "; ".join(", ".join(f"{x:.1f}" for x in l) for l in load)
    res["targets"] = [
        {"what": "sbatch to first step (time pending behind other jobs left out), supervisor per node vs torchrun per node",
         "value": ratio,
         "target": f"<= {TARGET_RATIO}", "verdict": C.verdict(ratio, TARGET_RATIO, higher_is_better=False)},
        {"what": "supervisor CPU per node, steady (share of a core)", "value": steady,
         "target": f"< {TARGET_CPU}", "verdict": C.verdict(steady, TARGET_CPU, higher_is_better=False)}]
    return res


if __name__ == "__main__":
    ap = argparse.ArgumentParser(prog="python -m bench.slurm")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--reps", type=int, default=4)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--log-every", type=int, default=10, help="train.log_every_n_steps (1: every step, the busiest)")
    a = ap.parse_args()
    out = run(quick=a.quick, reps=a.reps, steps=a.steps, log_every=a.log_every)
    print(out["text"])
    for t in out["targets"]:
        print(f"- {t['what']}: {C.fmt(t['value'])} (target {t['target']}): {t['verdict']}")
