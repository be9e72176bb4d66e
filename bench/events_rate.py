"""4. The supervisor's event drain (engine.supervisor.EventWriter, the same thread a run uses)
fed by rank processes flooding a spawn-context queue with step events, as QueueReporter sends
them. Measures events written per second and how long a rank spends in queue.put.
Target: >= 10,000 events/s, and a put cost far below a training step."""
from __future__ import annotations

import time

from bench import common as C

NAME = "events_rate"
TARGET = 10_000


def _producer(q, rank: int, n: int, go, results) -> None:
    from torchdeck.engine import events

    results.put(("ready", rank))
    go.wait()
    t0 = time.perf_counter()
    for i in range(n):
        q.put(events.dumps(events.make(
            "step", rank=rank, epoch=0, step=i + 1, total_steps=n, loss=2.302585 - i * 1e-6,
            accuracy=0.1, samples_per_s=1234.5, data_wait_s=0.0012, compute_s=0.0345, lr=0.05)))
    put_s = time.perf_counter() - t0
    results.put(("done", put_s))


def flood(ranks: int, per_rank: int, path) -> dict:
    import torch.multiprocessing as mp

    from torchdeck.engine.events import read_all
    from torchdeck.engine.supervisor import EventWriter

    ctx = mp.get_context("spawn")
    q, results, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    writer = EventWriter(path, q)
    writer.start()
    procs = [ctx.Process(target=_producer, args=(q, r, per_rank, go, results)) for r in range(ranks)]
    for p in procs:
        p.start()
    for _ in procs:  # the clock starts once every rank has imported and waits at the line
        results.get(timeout=120)
    total = ranks * per_rank
    t0 = time.perf_counter()
    go.set()
    while writer.count < total and time.perf_counter() - t0 < 300:
        time.sleep(0.001)
    elapsed = time.perf_counter() - t0
    puts = [results.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(30)
    writer.stop()
    writer.close()
    lines = len(read_all(path))
    put_us = C.median([s / per_rank * 1e6 for _, s in puts])
    return {"ranks": ranks, "events": total, "written": lines, "elapsed_s": elapsed,
            "events_per_s": writer.count / elapsed, "put_us_per_event": put_us,
            "put_events_per_s_per_rank": C.median([per_rank / s for _, s in puts])}


def run(quick: bool = False, reps: int = 3) -> dict:
    root = C.tmpdir(NAME)
    shapes = [(2, 2000)] if quick else [(2, 25_000), (8, 6_250)]
    rows, raw = [], []
    for ranks, n in shapes:
        res = [flood(ranks, n, root / f"events-{ranks}-{i}.jsonl") for i in range(reps)]
        raw.append(res)
        if any(r["written"] != r["events"] for r in res):
            raise RuntimeError(f"events lost: {[(r['events'], r['written']) for r in res]}")
        rows.append([ranks, ranks * n, C.median([r["events_per_s"] for r in res]),
                     C.median([r["put_us_per_event"] for r in res])])
    worst = min(r[2] for r in rows)
    text = C.table(f"events_rate: ranks flooding the supervisor's EventWriter, median of {reps}",
                   ["ranks", "events", "written/s", "put µs/event (rank side)"], rows)
    text += f"\nslowest drain {C.fmt(worst)} events/s (target >= {TARGET}: {C.verdict(worst, TARGET)}); every event written"
    return {"name": NAME, "text": text, "runs": raw, "events_per_s": worst,
            "targets": [{"what": "events written/s", "value": worst, "target": f">= {TARGET}",
                         "verdict": C.verdict(worst, TARGET)}]}
