"""Issue 37: `torchdeck runs` over a folder of many run directories (target < 1 s for 500).

Each directory is a copy of one finished 8-rank run of 3 minutes written by bench.long_run's
make_run (the supervisor's own writer, so each has the view checkpoint and row summary the
supervisor leaves); events.jsonl is hard-linked into every copy (the command only stats it and
reads its last bytes), the small files are copied. `torchdeck runs` is timed to exit, with its
CPU time (what a loaded machine inflates least) and peak RSS from /usr/bin/time, alternating with
the code in RUNS_LIST_BEFORE where given.

    python -m bench.runs_list                                  # 500 directories, 4 reps
    RUNS_LIST_BEFORE=/tmp/old python -m bench.runs_list        # also the code in /tmp/old
        # (`git archive <commit> | tar -x -C /tmp/old`: the same directories, the old reader)
    RUNS_LIST_N=100 python -m bench.runs_list --reps 2
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from bench import common as C

NAME = "runs_list"
TARGET_S = 1.0
MINUTES = 3


def make_folder(root: Path, n: int) -> Path:
    """`n` run directories under root/runs, copies of one made by long_run.make_run."""
    from bench.long_run import make_run

    rd, _ = make_run(root / "src", MINUTES / 60)
    runs = root / "runs"
    runs.mkdir(parents=True)
    for i in range(n):
        dst = runs / f"20261128-{i // 60:02d}{i % 60:02d}00-bench-fake-{i:03d}"
        dst.mkdir()
        for f in rd.path.iterdir():
            if f.is_dir():
                shutil.copytree(f, dst / f.name)
            elif f.name == "events.jsonl":
                os.link(f, dst / f.name)
            else:
                shutil.copy2(f, dst / f.name)
    return runs


def time_runs(runs: Path, code_root: Path) -> dict:
    """`torchdeck runs` from the code in `code_root`: seconds to exit, peak RSS, rows listed."""
    env = dict(os.environ, TORCHDECK_RUNS=str(runs), COLUMNS="200")
    env["PYTHONPATH"] = os.pathsep.join([str(code_root)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    out = runs.parent / "time.txt"
    t0 = time.perf_counter()
    p = subprocess.run(["/usr/bin/time", "-f", "%M %U %S", "-o", str(out), sys.executable, "-m", "torchdeck.cli.main", "runs"],
                       env=env, cwd=str(code_root), capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise RuntimeError(f"torchdeck runs ended {p.returncode}:\n{p.stdout[-1500:]}\n{p.stderr[-1500:]}")
    rows = sum(1 for ln in p.stdout.splitlines() if "bench-fake-" in ln)
    rss_kb, user, system = out.read_text().strip().splitlines()[-1].split()
    return {"s": wall, "cpu_s": float(user) + float(system), "rss_mb": int(rss_kb) / 1024, "rows": rows,
            "stdout": p.stdout}


def run(quick: bool = False, reps: int = 4) -> dict:
    n = 20 if quick else int(os.environ.get("RUNS_LIST_N", "500"))
    before = os.environ.get("RUNS_LIST_BEFORE")
    trees = [("after", C.ROOT)] + ([("before", Path(before))] if before else [])
    root = C.tmpdir("runs-list")
    load = [os.getloadavg()]
    try:
        runs = make_folder(root, n)
        got = C.alternate(reps, *[(lambda p=p: time_runs(runs, p)) for _, p in trees])
        load.append(os.getloadavg())
    finally:
        shutil.rmtree(root, ignore_errors=True)
    res, rows = {"name": NAME, "n": n, "load": load}, []
    for (k, _), ms in zip(trees, got):
        assert all(m["rows"] == n for m in ms), [m["rows"] for m in ms]
        res[k] = {"s": C.median([m["s"] for m in ms]), "runs_s": [m["s"] for m in ms],
                  "cpu_s": C.median([m["cpu_s"] for m in ms]), "rss_mb": max(m["rss_mb"] for m in ms)}
        rows.append([k, n, f"{min(res[k]['runs_s']):.2f}-{max(res[k]['runs_s']):.2f}", f"{res[k]['s']:.2f}",
                     f"{res[k]['cpu_s']:.2f}", f"{res[k]['rss_mb']:.0f}"])
    if before:
        same = {m["stdout"] for ms in got for m in ms}
        res["same_output"] = len(same) == 1
    res["text"] = C.table(f"runs_list: `torchdeck runs` over {n} run directories ({MINUTES}-minute 8-rank runs)",
                          ["code", "directories", "seconds (range)", "median s", "median CPU s (user+sys)", "peak RSS (MB)"], rows)
    res["text"] += "\nload average before/after: " + "; ".join(", ".join(f"{x:.1f}" for x in l) for l in load)
    if before:
        res["text"] += f"\nsame output both ways: {res['same_output']}"
    res["targets"] = [{"what": f"torchdeck runs over {n} run directories (s)", "value": res["after"]["s"],
                       "target": f"< {TARGET_S}", "verdict": C.verdict(res["after"]["s"], TARGET_S, higher_is_better=False)}]
    return res


if __name__ == "__main__":
    ap = argparse.ArgumentParser(prog="python -m bench.runs_list")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--reps", type=int, default=4)
    a = ap.parse_args()
    print(run(quick=a.quick, reps=a.reps)["text"])
