"""13. `torchdeck compare` adds nothing to the runs it compares: each strategy's samples/s inside a
comparison (`torchdeck compare PRESET --strategies cpu,ddp --steps N`, the command a user types)
against the same config run alone (the exact config the comparison planned for that strategy,
started on its own), alternating. Both sides are read with the same function (rank 0's step
marks after the warm-up steps), not with engine.runs.compare's own figures. Target: in a
comparison >= 0.95x alone for every strategy."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from bench import common as C

NAME = "compare_overhead"
TARGET = 0.95
STRATEGIES = ("cpu", "ddp")
GLOBAL_BATCH = 128


def _torchdeck() -> list[str]:
    exe = Path(sys.executable).with_name("torchdeck")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "torchdeck.cli"]


def run(quick: bool = False, reps: int = 3) -> dict:
    from torchdeck.engine import events
    from torchdeck.engine.runs import compare

    root = C.tmpdir(NAME)
    steps, warm = (30, 10) if quick else (200, 50)
    preset = root / "job.yaml"
    preset.write_text(yaml.safe_dump(C.engine_config(train={"batch_size": GLOBAL_BATCH, "report_every_s": 0},
                                                     nodes={"master_port": 0})))
    _, entries = compare.plan(str(preset), list(STRATEGIES), [], steps=steps)
    env = dict(os.environ, TORCHDECK_RUNS=str(root / "runs"))

    def rate(run_dir: Path) -> float | None:
        return C.throughput(C.step_marks(events.read_all(run_dir / "events.jsonl")), GLOBAL_BATCH, warm)

    def in_comparison():
        p = subprocess.run(_torchdeck() + ["compare", str(preset), "--strategies", ",".join(STRATEGIES),
                                           "--steps", str(steps)], env=env, capture_output=True, text=True,
                           timeout=900, stdin=subprocess.DEVNULL)
        if p.returncode != 0:
            raise RuntimeError(f"torchdeck compare failed ({p.returncode}): {p.stdout[-1500:]} {p.stderr[-1500:]}")
        where = Path(next(ln for ln in p.stdout.splitlines() if ln.startswith("comparison directory: "))
                     .split(": ", 1)[1])
        plan = json.loads((where / compare.PLAN_FILE).read_text())
        return {e["strategy"]: rate(where / e["run"]) for e in plan["entries"]}

    def alone():
        out = {}
        for e in entries:
            res = C.run_engine(e.cfg.to_dict(), root / "alone")
            out[e.strategy] = rate(res["run"].path)
        return out

    a, c = C.alternate(reps, alone, in_comparison)
    rows, targets = [], []
    for s in STRATEGIES:
        ra, rc = C.median([x[s] for x in a]), C.median([x[s] for x in c])
        ratio = rc / ra if ra and rc else None
        rows.append([s, ra, rc, ratio])
        targets.append({"what": f"{s}: samples/s in a comparison / alone", "value": ratio, "target": f">= {TARGET}",
                        "verdict": C.verdict(ratio, TARGET)})
    text = C.table(f"compare_overhead: {steps} steps, global batch {GLOBAL_BATCH}, steps {warm}-{steps} timed, "
                   f"median of {reps}", ["strategy", "alone samples/s", "in compare samples/s", "ratio"], rows)
    return {"name": NAME, "alone": a, "in_comparison": c, "rows": rows, "targets": targets, "text": text}


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    print(run(quick=a.quick, reps=a.reps)["text"])
