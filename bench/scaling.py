"""6. How a torchdeck run grows on this machine: step time and peak RSS against batch size
(strategy cpu) and against ranks (1 = cpu, 2 = ddp over gloo), and how big events.jsonl gets
per hour at the default logging rate (extrapolated from the measured runs)."""
from __future__ import annotations

from pathlib import Path

from bench import common as C

NAME = "scaling"


def _peak_rss_mb(pids_hwm: dict) -> tuple[float | None, float | None]:
    if not pids_hwm:
        return None, None
    vals = list(pids_hwm.values())
    return max(vals) / 1024, sum(vals) / 1024


def _vm_hwm_kb(pid: int) -> int | None:
    """Peak resident set of a live process (Linux /proc), so a short peak is not missed by polling."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def _measure(cfg: dict, root: Path, per_step: int, warm: int) -> dict:
    import psutil

    from torchdeck.engine.runs.control import run_processes

    hwm: dict[int, int] = {}

    def poll(run):
        sup = run.supervisor_pid()
        for p in run_processes(run):
            try:
                if p.pid == sup or "resource_tracker" in " ".join(p.cmdline()):
                    continue
            except psutil.Error:
                continue
            v = _vm_hwm_kb(p.pid)
            if v:
                hwm[p.pid] = max(hwm.get(p.pid, 0), v)

    res = C.run_engine(cfg, root, on_poll=poll)
    marks = [m for m in C.step_marks(res["events"]) if m[0] >= warm]
    step_s = None
    if len(marks) >= 2:
        step_s = (marks[-1][1] - marks[0][1]) / (marks[-1][0] - marks[0][0])
    # events.jsonl growth at this logging rate: step-event bytes over the timed window
    lines = res["run"].events_path.read_bytes().splitlines()
    t0, t1 = (marks[0][1], marks[-1][1]) if len(marks) >= 2 else (0, 0)
    window = sum(len(l) + 1 for l in lines if b'"kind":"step"' in l and t0 < _t(l) <= t1)
    per_hour_mb = window / (t1 - t0) * 3600 / 1e6 if t1 > t0 else None
    peak, total = _peak_rss_mb(hwm)
    return {"step_s": step_s, "samples_per_s": per_step / step_s if step_s else None,
            "peak_rss_mb_per_rank": peak, "peak_rss_mb_all_ranks": total,
            "events_mb_per_hour": per_hour_mb, "events_file_bytes": res["run"].events_path.stat().st_size}


def _t(line: bytes) -> float:
    import json

    return json.loads(line)["t"]


def run(quick: bool = False, reps: int = 3) -> dict:
    root = C.tmpdir(NAME)
    reps = min(reps, 3)
    steps, warm = (12, 4) if quick else (120, 40)
    # quick: the 2-rank run only, the measuring is the same for one rank (engine_vs_plain runs one),
    # on a smaller set (each rank generates it: 6144 samples cost ~2.5 CPU-s)
    batches = [] if quick else [16, 64, 256]
    data = {"train_size": 2048, "val_size": 64} if quick else {"train_size": 4096}
    by_batch, by_ranks = [], []
    for b in batches:
        cfg = C.engine_config(data={"train_size": 4096}, train={"batch_size": b, "max_steps": steps})
        rs = [_measure(cfg, root, b, warm) for _ in range(reps)]
        by_batch.append((b, rs))
    if by_batch:
        by_ranks.append((1, dict(by_batch)[64]))  # one rank at batch 64 is the batch-64 row
    cfg = C.engine_config(strategy="ddp", devices=2, backend="gloo", data=data,
                          train={"batch_size": 64, "max_steps": steps})
    by_ranks.append((2, [_measure(cfg, root, 128, warm) for _ in range(reps)]))
    med = lambda rs, k: C.median([r[k] for r in rs])
    text = "" if not by_batch else C.table(f"scaling vs batch size: cpu, cnn, steps {warm}..{steps} timed, median of {reps}",
                   ["batch", "step ms", "samples/s", "peak RSS MB (rank)"],
                   [[b, (med(rs, "step_s") or 0) * 1e3, med(rs, "samples_per_s"), med(rs, "peak_rss_mb_per_rank")]
                    for b, rs in by_batch])
    text += C.table(f"scaling vs ranks: batch 64/rank, median of {reps}",
                    ["ranks", "step ms", "samples/s (global)", "peak RSS MB per rank", "peak RSS MB all ranks",
                     "events.jsonl MB/hour (default logging)"],
                    [[n, (med(rs, "step_s") or 0) * 1e3, med(rs, "samples_per_s"), med(rs, "peak_rss_mb_per_rank"),
                      med(rs, "peak_rss_mb_all_ranks"), med(rs, "events_mb_per_hour")] for n, rs in by_ranks])
    if quick:
        text += "\nquick: 2 ranks only, 2048 samples (the batch sizes and 1 rank: full run)"
    return {"name": NAME, "text": text, "by_batch": by_batch, "by_ranks": by_ranks, "targets": []}
