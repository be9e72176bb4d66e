"""What the cross-node view (rank_report, issue 7) costs a 2-rank gloo run on CPU. Target < 1 %.

    python -m bench.rank_report_cost [--quick] [--reps N]

1. End to end: the tutorial CNN under DDP with 2 ranks, step time with train.report_every_s
   0 (off), 5 (the default) and 0.25 (a report at every stop agreement, 20x the default rate),
   each run started as `torchdeck export --torchrun` prints it (torchrun, the engine's worker):
   the report exists only there. Under torchdeck's own supervisor the ranks' events stream to
   node 0 instead (issue 31) and report_every_s is set to 0, so a supervised run would time the
   same loop three times.
2. The collective itself, in a 2-rank gloo group: the real Agreement.should_stop, once as the
   plain stop agreement (all-reduce of 2 numbers) and once as a report (all-gather of every
   rank's row, RSS read, event built on rank 0). The extra time per report divided by
   report_every_s is the share of training time the view costs at that setting.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from bench import common as C

REPORT_RATES = (("off (0)", 0), ("default (5 s)", 5.0), ("every agreement (0.25 s)", 0.25))


def _step_ms(res: dict, batch: int, warm: int) -> float | None:
    sps = C.throughput(C.step_marks(res["events"]), batch, warm)
    return None if not sps else 1000.0 * batch / sps


def torchrun_engine(cfg_dict: dict, root: Path, timeout: float = 600) -> dict:
    """The engine's worker under torchrun on one node, as `torchdeck export --torchrun` prints it;
    its events."""
    from torchdeck.engine import config as cfgmod
    from torchdeck.engine import events

    where = Path(tempfile.mkdtemp(dir=root))
    cfg_path, run_dir = where / "run.yaml", where / "run"
    cfgmod.save(cfgmod.from_dict(cfg_dict), cfg_path)
    nproc = str(cfg_dict.get("devices", 1))
    done = subprocess.run(C.console("torchrun", "torch.distributed.run")
                          + ["--standalone", "--nnodes", "1", "--nproc-per-node", nproc,
                             "-m", "torchdeck.engine.worker", str(cfg_path), "--run-dir", str(run_dir)],
                          cwd=where, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"torchrun exited {done.returncode}: {done.stderr[-2000:]}")
    return {"events": events.read_all(run_dir / "events.jsonl")}


def end_to_end(quick: bool, reps: int) -> dict:
    steps = 120 if quick else 400
    root = C.tmpdir("rank-report")
    out: dict[str, list] = {label: [] for label, _ in REPORT_RATES}
    for i in range(reps):
        order = REPORT_RATES[i % 3:] + REPORT_RATES[:i % 3]
        for label, every in order:
            cfg = C.engine_config(strategy="ddp", devices=2,
                                  train={"batch_size": 64, "max_steps": steps, "report_every_s": every})
            res = torchrun_engine(cfg, root)
            reports = sum(1 for e in res["events"] if e.get("kind") == "rank_report")
            out[label].append((_step_ms(res, 64, 20), reports))
    return out


def _micro_rank(rank: int, port: int, iters: int, q) -> None:
    import torch
    import torch.distributed as dist

    from torchdeck.engine.agreement import Agreement, Memory
    from torchdeck.engine.config import from_dict
    from torchdeck.engine.strategies.base import RankContext
    from torchdeck.engine.train import Position

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    cfg = from_dict({"strategy": "ddp", "devices": 2})
    dev, pos, sent = torch.device("cpu"), Position(), []
    agree = Agreement(RankContext(rank, rank, 2, 2, 0, dev, cfg), dev, None, lambda kind, **f: sent.append(f),
                      lambda: False, 1e-9, Memory(dev))  # only the agreement, no model or data
    agree.start(0)
    result = {}
    for label, every in (("agreement", 0.0), ("report", 1e-9), ("agreement", 0.0), ("report", 1e-9)):
        agree.report_every_s = every
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            pos.step += 1
            agree._next_report = 0
            agree.should_stop(pos, 0.0, pos.step * 64)
        result[label] = (time.perf_counter() - t0) / iters  # the second pass (warm) wins
    if rank == 0:
        q.put((result, len(sent)))
    dist.destroy_process_group()


def micro(iters: int) -> dict:
    import torch.multiprocessing as mp

    from torchdeck.engine.supervisor import free_port

    ctx = mp.get_context("spawn")
    q = ctx.SimpleQueue()
    mp.start_processes(_micro_rank, args=(free_port(), iters, q), nprocs=2, start_method="spawn")
    result, sent = q.get()
    return {"agreement_ms": 1000 * result["agreement"], "report_ms": 1000 * result["report"], "events": sent}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.rank_report_cost")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args(argv)

    m = micro(200 if args.quick else 2000)
    extra = max(0.0, m["report_ms"] - m["agreement_ms"])
    print(C.table("one agreement, 2 ranks, gloo on loopback (mean per call)", ["path", "ms"], [
        ["stop agreement only (all-reduce of 2 numbers)", C.fmt(m["agreement_ms"], ".3f")],
        ["as a rank report (all-gather of 8 x 2, RSS, event)", C.fmt(m["report_ms"], ".3f")],
        ["extra per report", C.fmt(extra, ".3f")],
        ["share of training time at report_every_s 5", f"{extra / 5000:.5%}"],
    ]))
    e2e = end_to_end(args.quick, args.reps)
    base = statistics.median([x for x, _ in e2e[REPORT_RATES[0][0]] if x])
    rows = []
    for label, _ in REPORT_RATES:
        ms = statistics.median([x for x, _ in e2e[label] if x])
        rows.append([label, C.fmt(ms, ".2f"), " ".join(C.fmt(x, ".2f") for x, _ in e2e[label]),
                     str(e2e[label][0][1]), f"{ms / base - 1:+.2%}"])
    print()
    print(C.table(f"2-rank DDP, CNN, batch 64/rank, medians of {args.reps}",
                  ["report_every_s", "ms/step", "runs", "reports/run", "vs off"], rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
