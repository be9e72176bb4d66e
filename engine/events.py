"""The event schema: what ranks and the supervisor report, one JSON object per line.

Shared by the engine (writes `events.jsonl`) and the app (tails it). Importable without torch.
Every event carries `v` (schema version), `kind`, `t` (unix time, float seconds); rank events
carry `rank`. Values are plain numbers, strings and lists: never tensors.

Kinds and their fields (beyond v, kind, t):

    run_started    run, strategy, world_size, nproc_per_node, node_rank, num_nodes,
                   global_batch, devices (list of device strings per local rank),
                   master_addr, master_port, pid (supervisor), host, total_steps, epochs,
                   end_epoch (1-based epoch the last step is in), ends_by (train.epochs |
                   train.max_steps | null), steps_per_epoch (null: not known before the data is built),
                   loss (torchdeck's loop: train.loss as configured; "auto (decided on the first
                   batch)": rank 0's log says the rule it took, engine/losses.py);
                   a user's script (strategy script): run_kind "script" (absent: torchdeck's own
                   loop) and command (the rank's command line as the user reads it: ["python",
                   "train.py", args...], ["python", "-m", module, ...], or the executable's), with
                   global_batch, total_steps, epochs, end_epoch, ends_by and steps_per_epoch null
    phase          rank, phase: what a starting rank does now (rendezvous | script | data | model | resume |
                   batch | steps), until its first step event; the run's start-up is read from these.
                   A user's script: rendezvous while its init_process_group waits, then script
                   "batch" also carries step and epoch: the position it trains from (a checkpoint's)
    rank_ready     rank, local_rank, device, pid, host, threads, cpus (the cores it is bound to, or null);
                   a user's script: device from CUDA_VISIBLE_DEVICES (null: unset), threads from
                   OMP_NUM_THREADS, cpus null
    step           one per train.log_every_n_steps steps, at the last step, and at the step a stop
                   ended the run on (its final position, even between two windows):
                   rank, epoch, step (optimizer steps done), total_steps, loss,
                   samples_per_s, data_wait_s, compute_s, lr, accuracy (train batch; null where the
                   task is not classification), metrics ({name: float}: a loss callable's or the
                   model output's extra metrics, this rank's mean over the window; {} when none),
                   tokens_per_s (batches with input_ids: tokens, the real ones under an
                   attention_mask, per second on this rank; null otherwise),
                   comm_s: of compute_s, the seconds a gradient all-reduce (or the stop/report
                   collective) was in flight, i.e. waiting for the other ranks; null where not
                   measured (measured today: DDP on the CPU); mfu (train.compile on a GPU:
                   model FLOPs/token x tokens_per_s / the GPU's peak dense bf16 FLOP/s,
                   engine/models.py; null on the CPU, for an unknown GPU or a model without
                   flops_per_token())
                   torchdeck's loop also sends, each rank its own (what rank_report carried):
                   device_mem_mb (CUDA memory allocated on its GPU; on CPU the rank's RSS),
                   peak_mem_mb (max_memory_allocated on a GPU, peak RSS on CPU), data_wait (share
                   0..1 of the window spent waiting for batches), comm_wait (share 0..1 of the
                   window in the all-reduce; null: not measured)
                   A user's script (torchdeck launch, engine/launch/report.py) sends: rank, step,
                   steps_per_s (optimizer steps/s over the last window; null: not known yet),
                   epoch and loss (null unless logged); from torchdeck.log also metrics ({name:
                   float}, the logged numbers but loss), samples_per_s, tokens_per_s (null: not
                   given), skipped (values that were not numbers; absent when none)
    epoch_end      rank, epoch, step, train_loss, train_acc, val_loss, val_acc (null: no eval);
                   train_acc and val_acc null unless the task is classification; train_metrics and
                   val_metrics ({name: float}, reduced over the ranks: the extra metrics, and
                   perplexity = exp(loss) for token cross-entropy; {} when none)
    checkpoint     rank, epoch, step, batches_done (micro-batches into that epoch), path
    log            rank (null: supervisor), level (info|warning|error), message
    error          rank, host, pid, exception, message, traceback
    rank_exited    rank, exitcode, signal (name or null)
    restart        rank (null), attempt (1, 2... the restarts so far), max_restarts (train.max_restarts),
                   cause (the failed attempt's root cause), lost_s (seconds of work redone: since the
                   checkpoint it resumes from, or the attempt's whole time for a script), resume_step
                   (the checkpoint's step our loop resumes at; 0 from the start, null for a script),
                   checkpoint (its path, or null). Written by the supervisor after the failed
                   attempt's rank_exited events, before it starts the ranks again: one run, N+1 parts
    rank_report    rank (always 0: the rank that gathered it), reports: one entry per global rank,
                   in rank order, all taken at the same optimizer step through one all-gather,
                   about every train.report_every_s seconds (and at the last step):
                     {rank, host, node_rank, epoch, step,
                      samples_per_s   this rank's rate since the previous report,
                      data_wait       share (0..1) of that time spent waiting for batches,
                      device_mem_mb   CUDA memory allocated on its GPU; on CPU the rank's RSS,
                      comm_wait       share (0..1) in the all-reduce (comm_s above; null: not measured),
                      peak_mem_mb     the most so far: max_memory_allocated on a GPU, peak RSS on CPU,
                      t               the rank's own unix time when it took the sample}
                   Only node 0's events.jsonl has it. Old runs only: since node streaming
                   (engine/nodes) each rank's step events carry these figures and nothing gathers.
    node_sample    one per node and second, written by node 0's supervisor (its own, and those each
                   other node's supervisor streams to it): node_rank, host (the node's host name),
                   gpus: [one per GPU NVML sees, {index, name, util, mem_used_mb, mem_total_mb,
                   temp_c, power_w, power_limit_w, pids, uuid, mem_util, fan_pct}] (engine/sources
                   GPUSample's fields; [] without NVML), host_stats: {cpu_percent, per_cpu,
                   ram_used_mb, ram_total_mb, load1} (engine/sources HostSample's, without procs)
    stacks         rank (null), reason (why they were taken: "rank 1 silent for 12 s", "collective
                   timeout"), summary (one line, see engine/rundir/stacks.py summary), groups: one
                   entry per place, {who, ranks, where, frames: [[file, line, func], ...] innermost
                   first}, files (the rank<N>.stacks files read)
    node_lost      rank (null), node_rank, host: a node whose supervisor node 0 stopped hearing
                   (engine/nodes/liveness.py says when), ranks (that node's global ranks), why (how
                   it went: "its connection closed without a goodbye", "no heartbeat for 10 s",
                   ...), lost_t (unix time it was last known alive), message (the sentence the
                   run's root cause starts with). Written by node 0's supervisor, which then ends
                   its own ranks: the run fails with that node as its cause
    run_finished   status (finished|failed|stopped|preempted), exit_codes (list per local rank),
                   root_cause (str or null), elapsed_s, failed_local_rank (a failed run only, when
                   the supervisor knows it: the index in exit_codes of the rank the root cause
                   names, the first to fail; status.json has it too)

`epoch` (step, epoch_end, checkpoint, rank_report) is the engine's 0-based index of the epoch
(at an epoch's end in a checkpoint: the epochs done). People read epochs from 1 everywhere:
metrics.csv, the views, the logs; `epoch_number` is the one place that turns one into the other.

Rank events that another node's supervisor streamed to node 0 (engine/nodes) keep all their
fields and gain node_rank and host (that node's) when they lack them; every event of a node's
ranks and samples is written by node 0 into the one events.jsonl.

Events from a rank's channel (engine/launch/channel.py) may also carry dropped (the events that
rank dropped just before this one, its pipe being full) and truncated (true: fields were left out
to fit the line in 4096 bytes).

Changing a field's meaning bumps EVENT_VERSION; adding a field does not.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Iterator

EVENT_VERSION = 1

KINDS = (
    "run_started",
    "rank_ready",
    "phase",
    "step",
    "epoch_end",
    "checkpoint",
    "log",
    "error",
    "rank_exited",
    "restart",
    "rank_report",
    "node_sample",
    "stacks",
    "node_lost",
    "run_finished",
)

def epoch_number(index, default: int | None = None) -> int | None:
    """The 1-based epoch people read, from an event's 0-based `epoch` index; `default` when the
    value is not a whole number >= 0 (an events file is input)."""
    if isinstance(index, bool) or not isinstance(index, (int, float)) or index != index:
        return default
    try:
        n = int(index)
    except (OverflowError, ValueError):
        return default
    return n + 1 if n >= 0 and n == index else default


def make(kind: str, **fields) -> dict:
    if kind not in KINDS:
        raise ValueError(f"unknown event kind {kind!r}")
    ev = {"v": EVENT_VERSION, "kind": kind, "t": time.time()}
    ev.update(fields)
    return ev


def dumps(ev: dict) -> str:
    return json.dumps(ev, separators=(",", ":"), allow_nan=True)


def parse(line: bytes) -> dict | None:
    """One line of an events file as an event; None for a line that is not a JSON object."""
    try:
        ev = json.loads(line)
    except (ValueError, RecursionError):
        return None
    return ev if isinstance(ev, dict) else None


CHUNK_BYTES = 1 << 20  # one read of an events file: a reader's memory stays flat however long the run
MAX_LINE = 16 << 20  # no event is this long: a "line" past it is garbage, dropped up to its newline


class Lines:
    """The complete lines of a byte stream read in chunks of any size (a chunk may end inside a
    line or a character): the piece after the last newline waits for the next chunk. A piece
    longer than MAX_LINE is dropped up to its newline and counted in `overlong`."""

    def __init__(self):
        self.partial = b""
        self.skipping = False
        self.overlong = 0

    def split(self, chunk: bytes) -> list[bytes]:
        lines = (self.partial + chunk).split(b"\n")
        self.partial = lines.pop()
        if self.skipping:
            if lines:
                lines, self.skipping = lines[1:], False  # the rest of the overlong line
            else:
                self.partial = b""
        if len(self.partial) > MAX_LINE:
            self.overlong += 1
            self.partial, self.skipping = b"", True
        return lines


def iter_events(path: str | Path, chunk_bytes: int | None = None) -> Iterator[dict]:
    """Every complete event of a file, read CHUNK_BYTES at a time (a day-long run's file is GBs:
    neither it nor a line without an end is ever held whole); a partly written last line and
    lines that are not events are skipped. Reading a growing file as it grows, counting what it
    skips: engine.runs.follow.EventTail."""
    lines = Lines()
    try:
        with open(path, "rb") as fh:
            while True:
                chunk = fh.read(chunk_bytes or CHUNK_BYTES)
                if not chunk:
                    return
                for line in lines.split(chunk):
                    if line.strip():
                        ev = parse(line)
                        if ev is not None:
                            yield ev
    except OSError:
        return


def read_all(path: str | Path) -> list[dict]:
    """Every complete event in a file, as a list (iter_events)."""
    return list(iter_events(path))
