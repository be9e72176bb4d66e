"""Metrics where other tools read them: `metrics.csv` beside events.jsonl (pandas, a spreadsheet,
gnuplot) and, with `logging.tensorboard: true`, TensorBoard event files in `tensorboard/`.

One row per step event (every rank's) and one per epoch end (train and validation figures,
reduced over the ranks: every rank sends the same, rank 0's is the row, so
`df[df.kind == "epoch_end"]` is one row per epoch), with
fixed flat columns so the file can be written as the run goes and read while it grows. A task's
own metrics (a loss callable's extras, perplexity: engine/sums.py) have names only the run
knows, and may first appear mid-run: they go in JSON columns (`metrics` for a step,
`train_metrics` and `val_metrics` for an epoch end, {name: value}; empty when none), so the header
never changes and every row keeps the same columns. The
supervisor feeds it live from its event writer; `torchdeck metrics RUN` rebuilds both from a past
run's events.jsonl. No torch (the supervisor of a CPU run never imports it): TensorBoard files hold
the `tensorboard` package's own Event protos (an optional extra), framed here a batch at a time
(masked_crc32c); without the package the run says so once and keeps the CSV, as Lightning falls
back to its CSV logger.
"""
from __future__ import annotations

import csv
import itertools
import json
import math
import os
import socket
import struct
import time
from pathlib import Path

from .events import epoch_number

COLUMNS = ("t", "kind", "rank", "epoch", "step", "loss", "accuracy", "lr", "samples_per_s", "data_wait_s",
           "compute_s", "train_loss", "train_acc", "val_loss", "val_acc",
           "tokens_per_s", "metrics", "train_metrics", "val_metrics")
JSON_COLUMNS = ("metrics", "train_metrics", "val_metrics")  # {name: value}, as JSON in one cell
KINDS = ("step", "epoch_end")
_SESSION_KINDS = ("restart", "run_started")  # the ranks start (again): steps may be redone (TensorBoard)
# what each kind plots in TensorBoard, under which tag (step figures per rank: ranks differ)
_TB_TAGS = {"step": ("loss", "accuracy", "lr", "samples_per_s", "tokens_per_s", "data_wait_s", "compute_s"),
            "epoch_end": ("train_loss", "train_acc", "val_loss", "val_acc")}
_TB_DICTS = {"step": (("metrics", ""),), "epoch_end": (("train_metrics", "train_"), ("val_metrics", "val_"))}
TB_MISSING = ("logging.tensorboard: the tensorboard package is not installed (pip install tensorboard, "
              "or torchdeck's [tensorboard] extra); writing metrics.csv only")


def wanted(line: str) -> bool:
    """Cheap test on a serialized event before parsing it (the writer thread sees every line)."""
    return any(f'"kind":"{kind}"' in line for kind in (*KINDS, *_SESSION_KINDS))


def row(ev: dict) -> list | None:
    """The CSV row of one event, or None for events that carry no metrics (and the other ranks'
    copies of an epoch end)."""
    if not isinstance(ev, dict) or ev.get("kind") not in KINDS:
        return None
    if ev["kind"] == "epoch_end" and ev.get("rank") not in (0, None, -1):
        return None
    out = []
    for col in COLUMNS:
        v = ev.get(col)
        if col == "epoch":
            v = epoch_number(v)  # counted from 1, as everywhere people read it (events carry the index)
        if col in JSON_COLUMNS:
            out.append(json.dumps(v, separators=(",", ":"), allow_nan=True) if isinstance(v, dict) and v else "")
            continue
        if isinstance(v, float) and not math.isfinite(v):
            v = str(v)  # nan / inf: spelled the way pandas reads them back
        out.append("" if v is None or isinstance(v, (dict, list)) else v)
    return out


def tensorboard_available() -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec("tensorboard") is not None
    except (ImportError, ValueError):
        return False


_TB_BATCH = 4096  # records framed and written at a time (~1 MB): their checksums are one numpy pass
_tb_files = itertools.count()


_CRC_TABLE: list[int] = []  # CRC-32C (Castagnoli) of each byte value, built on first use


def _crc_table() -> list[int]:
    if not _CRC_TABLE:
        for byte in range(256):
            c = byte
            for _ in range(8):
                c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1  # the polynomial, bit-reversed
            _CRC_TABLE.append(c)
    return _CRC_TABLE


def _mask(crc: int) -> int:
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def masked_crc32c(chunks: list[bytes]) -> list[int]:
    """TFRecord's masked CRC-32C of each chunk (what TensorBoard's reader checks). Many chunks at
    once: one numpy step a byte position (the tensorboard package's own is a Python loop a byte:
    80 % of an export's time, a day's 8-rank run being 6.9 M records); a few (a live run's flush):
    that loop, cheaper than numpy's setup."""
    table = _crc_table()
    if len(chunks) < 32:
        out = []
        for chunk in chunks:
            crc = 0xFFFFFFFF
            for b in chunk:
                crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
            out.append(_mask(crc ^ 0xFFFFFFFF))
        return out
    import numpy as np

    lens = np.fromiter(map(len, chunks), dtype=np.int64, count=len(chunks))
    valid = np.arange(int(lens.max())) < lens[:, None]
    data = np.zeros(valid.shape, np.uint8)
    data[valid] = np.frombuffer(b"".join(chunks), np.uint8)  # row-major: each chunk's bytes in its row
    lookup, crc = np.array(table, np.uint32), np.full(len(chunks), 0xFFFFFFFF, np.uint32)
    for i in range(valid.shape[1]):
        crc = np.where(valid[:, i], lookup[(crc ^ data[:, i]) & 0xFF] ^ (crc >> 8), crc)
    crc ^= np.uint32(0xFFFFFFFF)
    return (((crc >> 15) | (crc << 17)) + np.uint32(0xA282EAD8)).tolist()  # uint32: wraps as the mask does


class _TBWriter:
    """TensorBoard scalars: the tensorboard package's Event protos, framed as TFRecords here
    (length, its masked CRC, the event, its CRC) a batch at a time (masked_crc32c). No torch."""

    def __init__(self, logdir: Path):
        from tensorboard.compat.proto.event_pb2 import Event, SessionLog
        from tensorboard.compat.proto.summary_pb2 import Summary

        logdir.mkdir(parents=True, exist_ok=True)
        self._Event, self._Summary, self._SessionLog = Event, Summary, SessionLog
        self._started = False  # this session's start, written at its first step (_session_start)
        name = f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}.{next(_tb_files)}"
        self._fh = open(logdir / name, "wb")
        self._pending: list[bytes] = []
        self._put(Event(wall_time=time.time(), file_version="brain.Event:2"))  # version 2: no purge on a step back
        self.flush()

    def add(self, ev: dict) -> None:
        kind = ev["kind"]
        values = []
        pairs = [(key, ev.get(key)) for key in _TB_TAGS[kind]]
        for field, prefix in _TB_DICTS[kind]:  # the task's own metrics, each its own tag
            got = ev.get(field)
            pairs += [(f"{prefix}{name}", v) for name, v in got.items()] if isinstance(got, dict) else []
        for key, v in pairs:
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                tag = f"rank{ev.get('rank')}/{key}" if kind == "step" else f"epoch/{key}"
                values.append(self._Summary.Value(tag=tag, simple_value=float(v)))
        if values:
            t, step = float(ev.get("t") or 0.0), int(ev.get("step") or 0)
            if not self._started:
                self._session_start(t, step)
            self._put(self._Event(wall_time=t, step=step, summary=self._Summary(value=values)))

    def restart(self) -> None:
        """The ranks start again (our loop from its checkpoint, a script at steps of its own) and
        redo steps: a session starts at the next one (the CSV keeps both attempts: every event)."""
        self._started = False

    def _session_start(self, t: float, step: int) -> None:
        """TensorBoard's own sign of a restart: its readers drop the points at `step` and after
        that came before. Written at every session's first step: a requeued run's supervisor
        writes a second file in the same folder, and TensorBoard's plugin reader takes the first
        start it sees as no restart."""
        self._started = True
        self._put(self._Event(wall_time=t, step=step, session_log=self._SessionLog(status=self._SessionLog.START)))

    def _put(self, event) -> None:
        self._pending.append(event.SerializeToString())
        if len(self._pending) >= _TB_BATCH:
            self.flush()

    def flush(self) -> None:
        if not self._pending:
            return
        records, self._pending = self._pending, []
        heads = [struct.pack("<Q", len(r)) for r in records]
        head_crcs, crcs = masked_crc32c(heads), masked_crc32c(records)
        self._fh.write(b"".join(h + struct.pack("<I", hc) + r + struct.pack("<I", c)
                                for h, hc, r, c in zip(heads, head_crcs, records, crcs)))
        self._fh.flush()

    def close(self) -> None:
        try:
            self.flush()
        finally:
            self._fh.close()


class MetricsSink:
    """Appends metric rows to a CSV file (header first when the file is new) and, when asked and
    installed, to TensorBoard. `note` is the one line to tell the user (TensorBoard missing)."""

    def __init__(self, csv_path: Path | None, tensorboard_dir: Path | None = None, stream=None):
        self.note: str | None = None
        self._fh = self._csv = None
        self._own = True  # the file is ours to close (not a stream given: stdout)
        if stream is not None:
            self._fh, self._own = stream, False
            self._csv = csv.writer(stream)
            self._csv.writerow(COLUMNS)
        elif csv_path is not None:
            csv_path = Path(csv_path)
            new = not csv_path.exists() or csv_path.stat().st_size == 0
            self._fh = open(csv_path, "a", newline="")
            self._csv = csv.writer(self._fh)
            if new:
                self._csv.writerow(COLUMNS)
        self._tb = None
        if tensorboard_dir is not None:
            if tensorboard_available():
                self._tb = _TBWriter(Path(tensorboard_dir))
            else:
                self.note = TB_MISSING
        self.rows = 0

    def add(self, ev: dict) -> None:
        if self._tb is not None and isinstance(ev, dict) and ev.get("kind") in _SESSION_KINDS:
            self._tb.restart()  # a restart, or a requeued run's supervisor (SLURM): the same events.jsonl
        r = row(ev)
        if r is None:
            return
        if self._csv is not None:
            self._csv.writerow(r)
        if self._tb is not None:
            self._tb.add(ev)
        self.rows += 1

    def add_line(self, line: str) -> None:
        if wanted(line):
            try:
                self.add(json.loads(line))
            except ValueError:
                pass

    def flush(self) -> None:
        if self._fh is not None:
            self._fh.flush()
        if self._tb is not None:
            self._tb.flush()

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close() if self._own else self._fh.flush()
        if self._tb is not None:
            self._tb.close()


def convert(events_path: Path, csv_path: Path | None = None, tensorboard_dir: Path | None = None,
            stream=None) -> MetricsSink:
    """A past run's events into a new CSV file (or `stream`: stdout for `--csv -`) and/or
    TensorBoard folder; returns the sink (rows, note)."""
    from . import events

    if csv_path is not None and stream is None:
        Path(csv_path).unlink(missing_ok=True)
    sink = MetricsSink(None if stream is not None else csv_path, tensorboard_dir, stream)
    try:
        for ev in events.iter_events(events_path):  # line by line: a day-long run's file is GBs
            sink.add(ev)
    finally:
        sink.close()
    return sink
