"""The training loop, strategy-agnostic: it only talks to the Strategy interface.

One `Trainer` per rank. The hot path does no host sync and sends nothing except at log steps:
losses and accuracy are summed on the device and read once per step event.
"""
from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import DataLoader, Subset

from . import affinity
from . import checkpoint as ckpt
from .cache import NodeShare
from .data import BatchPrep, BatchTensors, TrainData, keep_batch
from .errors import TorchdeckError
from .events import EVENT_VERSION
from .losses import Loss, batch_size, forward, logits_of, slice_batch, to_device, token_count
from .optim import Precision, set_speed_flags


STOP_CHECK_S = 0.25  # how often ranks agree on a stop request, in training time
MAX_STOP_INTERVAL = 50  # steps
_SYNCS = contextlib.nullcontext()  # the last micro-batch of a step: its backward syncs the gradients
# One row per rank in the gathered report; flag and per_step double as the stop agreement.
REPORT_ROW = ("flag", "per_step", "epoch", "step", "samples_per_s", "data_wait", "device_mem_mb", "t", "peak_mem_mb",
              "comm_wait")


class CommClock:
    """Seconds a rank's gradient all-reduce is in flight, from a DDP comm hook around the default
    all-reduce: wall clock at the first bucket's launch and at the last one's completion (on
    the CPU the completion callback runs when gloo is done). The all-reduce evens the ranks out:
    the rank the others wait for spends the least time here."""

    def __init__(self):
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        self._allreduce = allreduce_hook
        self.total = 0.0
        self._first = self._last = None

    def hook(self, state, bucket):
        if self._first is None:
            self._first = time.perf_counter()
        return self._allreduce(state, bucket).then(self._done)

    def _done(self, fut):
        self._last = time.perf_counter()
        return fut.value()

    def settle(self) -> None:
        """Once per optimizer step, after its syncing backward."""
        if self._first is not None and self._last is not None:
            self.total += max(0.0, self._last - self._first)
        self._first = self._last = None


class TrainError(TorchdeckError):
    """A config that cannot train on this data (e.g. batch larger than the data set)."""


def plain_layout(model) -> None:
    """Give every weight a plain (row-major) layout. Tests the last stride too: a 1x1 conv's
    channels_last weight passes is_contiguous() with a last stride of C."""
    for p in model.parameters():
        if p.dim() and (p.stride(-1) != 1 or not p.is_contiguous()):
            p.data = p.data.clone(memory_format=torch.contiguous_format)


def eval_shard(dataset, rank: int, world: int) -> tuple[Subset, int]:
    """Rank's share of the val set padded to equal length (so every rank runs the same number of
    forwards, which FSDP needs), and how many of its samples are real."""
    n = len(dataset)
    idx = list(range(rank, n, world))
    per = math.ceil(n / world) if n else 0
    valid = len(idx)
    if idx and valid < per:
        idx += [idx[-1]] * (per - valid)
    elif not idx and per:
        idx = [0] * per
    return Subset(dataset, idx), valid


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def _all_reduce(t: torch.Tensor, op=None) -> torch.Tensor:
    if _distributed():
        dist.all_reduce(t, op=op or dist.ReduceOp.SUM)
    return t


@torch.no_grad()
def evaluate_model(model, dataset, ctx, batch_size: int, precision: Precision | None = None,
                   num_workers: int = 0, channels_last: bool = False, prep: BatchPrep | None = None,
                   loss: Loss | None = None) -> dict:
    """Loss (and accuracy, for classification; extra metrics) over the whole set, sharded over ranks
    and summed so every rank gets the global value: `loss` is the run's (engine/losses.py; a fresh
    auto one decides on the first batch). In-memory sets are read a batch at a time (decoded images
    normalized by `prep`, as in training)."""
    loss = loss if loss is not None else Loss()
    world = ctx.world_size if _distributed() else 1
    rank = ctx.rank if _distributed() else 0
    shard, valid = eval_shard(dataset, rank, world)
    dev = ctx.device
    if isinstance(dataset, torch.utils.data.TensorDataset):
        prep = prep or BatchPrep(dataset, device=dev)
        loader = DataLoader(BatchTensors(dataset), batch_size=batch_size, sampler=shard.indices,
                            collate_fn=keep_batch)
    else:
        loader = DataLoader(shard, batch_size=batch_size, shuffle=False, num_workers=num_workers,
                            **affinity.loader_kwargs())
    sums = None  # loss, correct, count, extra metrics...
    was_training = model.training
    model.eval()
    seen = 0
    autocast = precision.autocast if precision is not None else contextlib.nullcontext
    for batch in loader:
        b = _samples_in(batch)
        n = max(0, min(b, valid - seen))
        seen += b
        # the model's own loss or a callable's sees only the real samples (the forward count stays
        # the same on every rank, which FSDP needs); the built-in losses slice the output
        if 0 < n < b and loss.decided and loss.rule in ("output", "callable"):
            batch = slice_batch(batch, n)
        batch = to_device(batch, dev)
        x, y = loss.split(batch)
        if isinstance(x, torch.Tensor):
            if prep is not None and prep.normalize:
                x = prep(x, train=False)
            if channels_last and x.dim() == 4:
                x = x.contiguous(memory_format=torch.channels_last)
        with autocast():
            out = forward(model, x)
        if n == 0:
            continue
        if isinstance(out, torch.Tensor) and out.device != dev:  # model-parallel: logits on the last stage
            out = out.to(dev)
        if not loss.decided:
            loss(out, y, batch)  # decides the rule on this first batch (torchdeck eval)
        extras, correct = None, None
        if loss.rule in ("output", "callable"):  # the batch was cut to the real samples above
            value, extras = loss(out, y, batch)
            value = value.double() * n
        else:
            logits = logits_of(out).float()
            logits, y = (logits[:n], y[:n]) if n < b else (logits, y)
            if loss.classification:  # as before: the summed cross-entropy and the argmax hits
                value = F.cross_entropy(logits, y, reduction="sum").double()
                correct = (logits.argmax(1) == y).sum().double()
            else:
                value, extras = loss(logits, y, batch)
                value = value.double() * n
        row = [value, correct if correct is not None else torch.zeros((), dtype=torch.float64, device=dev),
               torch.tensor(float(n), dtype=torch.float64, device=dev)]
        row += [e.double() * n for e in (extras or [])]
        part = torch.stack([r.to(dev) for r in row])
        sums = part if sums is None else sums + part
    model.train(was_training)
    if sums is None:  # no batch at all on this rank: its share of the reduction still counts
        sums = torch.zeros(3 + len(loss.names), dtype=torch.float64, device=dev)
    _all_reduce(sums)
    total = sums.tolist()
    loss_sum, correct, count, extra = total[0], total[1], max(total[2], 1.0), total[3:]
    metrics = loss.metrics(loss_sum, extra, count)
    return {"loss": loss_sum / count, "accuracy": correct / count if loss.classification else None,
            "metrics": metrics, "samples": int(count), "loss_rule": loss.said}


def _samples_in(batch) -> int:
    if isinstance(batch, (list, tuple)) and len(batch) == 2 and isinstance(batch[1], torch.Tensor):
        return batch[1].shape[0]  # (x, y): as before
    return batch_size(batch)


@dataclass
class Position:
    """Where training is: optimizer steps done, epoch, micro-batches of that epoch consumed."""

    epoch: int = 0
    step: int = 0
    batches_done: int = 0


class _Window:
    """What one rank saw since its last step event (and in its epoch so far). Per micro-batch only
    its detached loss and predictions are kept; fold() turns them into sums a log window (or 64
    micro-batches) at a time: one argmax per step instead of five small ops, and on a GPU no
    extra kernels per step. sums: loss sum, correct (classification), then the extra metrics'
    sums (engine/losses.py), weighted by samples as the loss is; tokens are counted on the host."""

    def __init__(self, device, comm, classification: bool = True):
        self.device, self.comm, self.classification = device, comm, classification
        self.sums = torch.zeros(2, dtype=torch.float64, device=device)  # loss sum, correct, extras...
        self.epoch_sums = torch.zeros(2, dtype=torch.float64, device=device)
        self.epoch_samples = 0
        self._loss, self._pred, self._y, self._b, self._extra = [], [], [], [], []
        self.restart(time.perf_counter())

    def restart(self, now: float) -> None:
        self.sums.zero_()
        self.t0, self.data_wait, self.samples, self.tokens = now, 0.0, 0, None
        self.comm0 = self.comm.total if self.comm is not None else 0.0

    def add(self, loss, out, y, b: int | None = None, extras=None, tokens: int | None = None) -> None:
        b = y.shape[0] if b is None else b
        self._loss.append(loss.detach())
        if self.classification:
            self._pred.append((out if isinstance(out, torch.Tensor) else logits_of(out)).detach().argmax(1))
            self._y.append(y)
        if extras:
            self._extra.append(torch.stack(extras))
        self._b.append(b)
        if len(self._b) >= 64:
            self.fold()
        self.samples += b
        self.epoch_samples += b
        if tokens is not None:
            self.tokens = (self.tokens or 0) + tokens

    def fold(self) -> None:
        if not self._loss:
            return
        losses = torch.stack(self._loss).double()
        weights = torch.tensor(self._b, dtype=torch.float64, device=losses.device)
        loss_sum = losses @ weights
        if self._pred:
            correct = torch.cat(self._pred).eq(torch.cat(self._y)).sum().double()
        else:
            correct = torch.zeros((), dtype=torch.float64, device=losses.device)
        parts = [loss_sum, correct]
        if self._extra:
            parts += list((torch.stack(self._extra).double() * weights.to(self._extra[0].device)[:, None]).sum(0)
                          .to(losses.device))
        folded = torch.stack(parts).to(self.device)
        if folded.numel() > self.sums.numel():  # the extra metrics' names came with the first batch
            self.sums = _grown(self.sums, folded.numel())
        self.sums[:folded.numel()].add_(folded)
        for pending in (self._loss, self._pred, self._y, self._b, self._extra):
            pending.clear()

    def close(self) -> None:
        """The window's sums into the epoch's."""
        if self.sums.numel() > self.epoch_sums.numel():
            self.epoch_sums = _grown(self.epoch_sums, self.sums.numel())
        self.epoch_sums += self.sums


def _grown(t: torch.Tensor, n: int) -> torch.Tensor:
    return torch.cat([t, torch.zeros(n - t.numel(), dtype=t.dtype, device=t.device)])


class Trainer:
    def __init__(self, cfg, strategy, ctx, run_dir, emit, stop_requested=lambda: False):
        """emit(kind, **fields) reports an event; stop_requested() is this rank's local stop flag."""
        self.cfg, self.strategy, self.ctx, self.run_dir = cfg, strategy, ctx, run_dir
        self.emit, self.stop_requested = emit, stop_requested
        t = cfg.train
        self.device = ctx.device
        set_speed_flags(cfg, self.device)

        self.loss_fn = Loss(t.loss)  # train.loss: its callable found before the data is built
        emit("phase", phase="data")
        self.data = data = TrainData(cfg, ctx, self._node_share())
        self.train_ds, self.val_ds, self.info = data.train_ds, data.val_ds, data.info
        emit("phase", phase="model")
        model = self._build_model()
        data.open_loader(strategy.sampler(self.train_ds, ctx, shuffle=True, seed=t.seed), emit)
        self.sampler, self.loader, self.prep, self.val_prep = data.sampler, data.loader, data.prep, data.val_prep
        self.workers, self.worker_start, self.forks_workers = data.workers, data.worker_start, data.forks_workers
        self._count_steps(len(data.inner))
        self.model, self.optimizer, self.scheduler, self.precision = strategy.setup(
            model, ctx, self.total_steps, self.steps_per_epoch)
        self.comm = self._comm_clock()
        # Strategy calls get the wrapped module; only the forward goes through the compiled one.
        self.forward_model = torch.compile(self.model) if t.compile else self.model
        from .models import mfu_meter

        self._mfu = mfu_meter(model, t.compile, self.device)  # step events' mfu: compiled, on a GPU
        self.pos = Position()
        self._first_batch = False  # fit() sets it: its first batch ends the start-up phase "batch"
        self.ckpt_dir = ckpt.checkpoint_dir(cfg, run_dir)
        self.last_saved_step = -1
        self.stopped = False
        self.report_every_s = t.report_every_s
        self._next_report = 1  # first report at the first agreement: every rank is seen early
        self._proc = None  # psutil.Process, for the rank's RSS on CPU

    def _build_model(self):
        """The model in the weight layout the strategy can hold (sharding and byte views need plain)."""
        from .models import build_model

        t, strategy = self.cfg.train, self.strategy
        model = build_model(self.cfg, self.info)
        if strategy.channels_last_weights:
            return model.to(memory_format=torch.channels_last) if t.channels_last else model
        plain_layout(model)  # a user's model may come channels-last itself
        if t.channels_last and self.ctx.rank == 0:
            self.emit("log", level="info", message=(
                f"train.channels_last: {strategy.name} keeps the weights in plain layout (it shards or "
                "byte-views them); the batches go channels-last, so convolutions still run NHWC"))
        return model

    def _count_steps(self, per_rank: int) -> None:
        """Steps per epoch and in all, from the samples this rank's sampler hands it."""
        t = self.cfg.train
        self.micro_per_epoch = per_rank // t.batch_size
        self.steps_per_epoch = self.micro_per_epoch // t.grad_accum
        if self.steps_per_epoch == 0:
            raise TrainError(
                f"train.batch_size {t.batch_size} x grad_accum {t.grad_accum} needs more samples per rank "
                f"than the {per_rank} this rank gets from {self.info.name} ({len(self.train_ds)} in all); "
                "lower the batch size or use more data")
        by_epochs = t.epochs * self.steps_per_epoch if t.epochs else math.inf
        self.total_steps = int(min(t.max_steps or math.inf, by_epochs))

    def _comm_clock(self) -> CommClock | None:
        """Where the time goes: waiting for the other ranks (CPU DDP for now)."""
        if not (isinstance(self.model, torch.nn.parallel.DistributedDataParallel) and self.device.type == "cpu"):
            return None
        comm = CommClock()
        self.model.register_comm_hook(None, comm.hook)
        return comm

    DATA_WAIT_WARN = 0.25

    def _data_bottleneck(self, epoch: int, share: float) -> None:
        """Say once, on rank 0, when the ranks spend much of an epoch waiting for batches, and
        which knob to turn (the Monitor and `torchdeck run` show the log)."""
        if share < self.DATA_WAIT_WARN or self.ctx.rank != 0 or getattr(self, "_warned_data", False):
            return
        self._warned_data = True
        knob = self.data.bottleneck_knob()
        self.emit("log", level="warning", message=f"data is the bottleneck: the ranks waited for batches "
                                                  f"{share:.0%} of epoch {epoch + 1}; {knob}")

    def data_note(self) -> str:
        """How the batches come, for the run's log."""
        return self.data.note()

    def _node_share(self) -> NodeShare | None:
        """How this rank shares decoded data with the other ranks of its node (engine/cache.py)."""
        c = self.ctx
        if not _distributed() or c.local_world_size < 2:
            return None

        def agree(flags):
            t = torch.tensor([float(f) for f in flags], dtype=torch.float64, device=self.device)
            dist.all_reduce(t, op=dist.ReduceOp.MIN)
            return [v > 0 for v in t.tolist()]

        return NodeShare(c.local_rank, c.local_world_size, f"{Path(self.run_dir).resolve()}|node{c.node_rank}",
                         dist.barrier, agree)

    # ------------------------------------------------------------------ checkpoints
    def resume(self) -> None:
        if self.cfg.checkpoint.resume:
            self.emit("phase", phase="resume")
        found = ckpt.resolve_resume(self.cfg, self.run_dir, dirs=self.strategy.checkpoint_dirs)
        if found is None:
            if self.cfg.checkpoint.resume and self.ctx.rank == 0:
                self.emit("log", level="warning",
                          message=f"resume: latest: no checkpoint in {self.ckpt_dir}; starting from scratch")
            return
        path, state = found
        c = self.ctx
        self.strategy.load_checkpoint(self, path, state)
        ckpt.set_rng_state(state["rng"])
        self.pos = Position(int(state["epoch"]), int(state["step"]), int(state["batches_done"]))
        self.last_saved_step = self.pos.step
        if c.rank == 0:
            note = ""
            if state.get("world_size") not in (None, c.world_size):
                note = f" (saved with world size {state['world_size']}, now {c.world_size}: data order differs)"
            from .fmt import epoch_at

            self.emit("log", level="info", message=f"resumed from {path} at "
                                                   f"{epoch_at(self.pos.epoch, self.pos.batches_done)}, "
                                                   f"step {self.pos.step}{note}")

    def save_checkpoint(self) -> None:
        """Every rank takes part (sharded strategies gather, DeepSpeed ranks write their shards)."""
        c = self.ctx
        meta = {
            "format": ckpt.FORMAT, "events_version": EVENT_VERSION,
            "epoch": self.pos.epoch, "step": self.pos.step, "batches_done": self.pos.batches_done,
            "world_size": c.world_size, "rng": ckpt.rng_state(), "config": self.cfg.to_dict(),
            "data": {"name": self.info.name, "in_channels": self.info.get("in_channels"),
                     "num_classes": self.info.get("num_classes"), "image_size": self.info.get("image_size")},
        }
        path = self.strategy.save_checkpoint(self, meta)
        if c.rank == 0:
            self.emit("checkpoint", epoch=self.pos.epoch, step=self.pos.step, batches_done=self.pos.batches_done,
                      path=str(path))
        self.last_saved_step = self.pos.step
        if _distributed():
            dist.barrier()

    # ------------------------------------------------------------------ stop agreement and reports
    def _should_stop(self, wait_total: float = 0.0, samples_total: int = 0, final: bool = False) -> bool:
        """All ranks agree on stopping at the same step: one tiny all-reduce (MAX) of the local stop
        flag and the step time, every `stop_interval` steps. The interval adapts to about
        STOP_CHECK_S of training, from the all-reduced (so identical) step time: cheap for fast
        steps (a gloo all-reduce is ~0.1-1 ms), prompt for slow ones.

        Every ~report_every_s the same collective becomes an all-gather of each rank's progress
        row instead, so the cross-node view costs no extra collective. Whether this check is a
        report is decided from the step count and the agreed step time, never from a rank's own
        clock, so every rank enters the same collective."""
        now = time.perf_counter()
        per_step = (now - self._check_t) / max(1, self.pos.step - self._check_step)
        self._check_t, self._check_step = now, self.pos.step
        flag = 1.0 if self.stop_requested() else 0.0
        try:
            return self._agree(flag, per_step, wait_total, samples_total, now, final)
        finally:
            if self.comm is not None:  # a rank that arrives late waits least here too
                self.comm.total += time.perf_counter() - now

    def _agree(self, flag, per_step, wait_total, samples_total, now, final) -> bool:
        if self.report_every_s > 0 and (self.pos.step >= self._next_report or final):
            rows = self._gather_report(flag, per_step, wait_total, samples_total, now)
            flag = max(r[0] for r in rows)
            per_step = max(r[1] for r in rows)
            self._next_report = self.pos.step + max(1, int(self.report_every_s / max(per_step, 1e-6)))
        elif _distributed():
            t = torch.tensor([flag, per_step], dtype=torch.float64, device=self.device)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            flag, per_step = t.tolist()
        self.stop_interval = int(min(MAX_STOP_INTERVAL, max(1, STOP_CHECK_S / max(per_step, 1e-6))))
        return flag > 0

    def _start_reports(self) -> None:
        """Hosts and node ranks do not change: exchange them once, not in every report."""
        import socket

        self._report_t, self._report_wait, self._report_samples = time.perf_counter(), 0.0, 0
        self._report_comm = self.comm.total if self.comm is not None else 0.0
        me = (socket.gethostname(), self.ctx.node_rank)
        if _distributed():
            everyone = [None] * self.ctx.world_size
            dist.all_gather_object(everyone, me)
            self._hosts = everyone
        else:
            self._hosts = [me]

    def _device_mem_mb(self) -> float:
        if self.device.type == "cuda":
            return torch.cuda.memory_allocated(self.device) / 2 ** 20
        if self._proc is None:
            import psutil

            self._proc = psutil.Process()
        return self._proc.memory_info().rss / 2 ** 20

    def _peak_mem_mb(self, now_mb: float | None = None) -> float:
        """The most this rank has held so far: what decides whether a job fits (sampling the current
        figure from outside misses short peaks and short runs). now_mb: _device_mem_mb() just read."""
        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.device) / 2 ** 20
        import resource

        # KiB on Linux; the kernel's high-water mark lags the RSS psutil reads by a few pages
        return max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 10,
                   self._device_mem_mb() if now_mb is None else now_mb)

    def _gather_report(self, flag, per_step, wait_total, samples_total, now) -> list[list[float]]:
        """Every rank's REPORT_ROW, through one all-gather; rank 0 emits them as a rank_report."""
        window = max(now - self._report_t, 1e-9)
        row = [flag, per_step, float(self.pos.epoch), float(self.pos.step),
               (samples_total - self._report_samples) / window,
               min(1.0, (wait_total - self._report_wait) / window),
               self._device_mem_mb(), time.time(), self._peak_mem_mb(),
               -1.0 if self.comm is None else min(1.0, (self.comm.total - self._report_comm) / window)]
        self._report_t, self._report_wait, self._report_samples = now, wait_total, samples_total
        self._report_comm = self.comm.total if self.comm is not None else 0.0
        mine = torch.tensor(row, dtype=torch.float64, device=self.device)
        if _distributed():
            out = [torch.empty_like(mine) for _ in range(self.ctx.world_size)]
            dist.all_gather(out, mine)
            rows = torch.stack(out).tolist()
        else:
            rows = [row]
        if self.ctx.rank == 0:
            reports = []
            for rank, r in enumerate(rows):
                host, node_rank = self._hosts[rank]
                reports.append({"rank": rank, "host": host, "node_rank": node_rank, "epoch": int(r[2]),
                                "step": int(r[3]), "samples_per_s": r[4], "data_wait": r[5],
                                "device_mem_mb": r[6], "t": r[7], "peak_mem_mb": r[8],
                                "comm_wait": r[9] if r[9] >= 0 else None})
            self.emit("rank_report", reports=reports)
        return rows

    # ------------------------------------------------------------------ the loop
    def fit(self) -> Position:
        """Train to the end (max_steps, epochs) or an agreed stop; a final checkpoint where it ends."""
        self._start_fit()
        max_epochs = self.cfg.train.epochs or 10 ** 9
        while self.pos.step < self.total_steps and self.pos.epoch < max_epochs and not self.stopped:
            self._run_epoch(self.pos.epoch)
        if self.last_saved_step != self.pos.step:
            self.save_checkpoint()
        return self.pos

    def _start_fit(self) -> None:
        """The stop agreement's and the reports' clocks start here, not at construction (resume, the
        worker's log and a fork-safe wait come between)."""
        t = self.cfg.train
        self._check_t, self._check_step, self.stop_interval = time.perf_counter(), self.pos.step, 1
        self._next_check = self.pos.step + 1
        if self.report_every_s > 0:
            self._start_reports()
        self._wait_total, self._samples_total = 0.0, 0  # for the rank reports
        self._has_eval = t.eval_every_epoch and self.val_ds is not None and len(self.val_ds) > 0
        self.forward_model.train()
        # Start-up's last two phases: the first batch (loader workers start: each imports torch)
        # and the steps up to the first step event (log_every_n_steps of them), told apart.
        self._first_batch = True
        self.emit("phase", phase="batch", step=self.pos.step, epoch=self.pos.epoch)  # where it trains from
        self._elsewhere = None  # model-parallel: whether the logits come out on another device than the batch
        self._loss_said = False

    def _run_epoch(self, epoch: int) -> None:
        """One epoch, or the rest of it after a resume, up to max_steps or an agreed stop."""
        k = self.cfg.train.grad_accum
        self.sampler.set_epoch(epoch)
        self.sampler.skip = self.pos.batches_done * self.cfg.train.batch_size
        it = iter(self.loader)
        window = _Window(self.device, self.comm, self.loss_fn.classification or not self.loss_fn.decided)
        ep_wait0, ep_t0 = self._wait_total, time.perf_counter()
        micro = self.pos.batches_done
        while micro + k <= self.steps_per_epoch * k and self.pos.step < self.total_steps:
            self._train_step(it, epoch, micro, window)
            micro += k
            if self._after_step(epoch, micro, window):
                break
        window.fold()
        window.close()
        if self.stopped:
            return
        waited = (self._wait_total - ep_wait0, time.perf_counter() - ep_t0)
        if micro + k > self.steps_per_epoch * k:  # the epoch is complete
            self._end_epoch(epoch, window.epoch_sums, window.epoch_samples, self._has_eval, waited)
            self.pos = Position(epoch + 1, self.pos.step, 0)
            if self.cfg.checkpoint.every_epoch and self.pos.step < self.total_steps:
                self.save_checkpoint()
        elif self._has_eval:  # max_steps ended it mid-epoch: still report where the model stands
            self._end_epoch(epoch, window.epoch_sums, window.epoch_samples, self._has_eval, waited, partial=True)

    def _train_step(self, it, epoch: int, micro: int, window: "_Window") -> None:
        """One optimizer step: forward and backward over grad_accum micro-batches (only the last
        backward syncs the gradients), then the update. One call per step, the forward inline: this
        is the hot path."""
        k, prec, loss_fn = self.cfg.train.grad_accum, self.precision, self.loss_fn
        for j in range(k):
            x, y, batch, b, tokens = self._batch(it, epoch, micro + j, window)
            with self.strategy.no_sync(self.model) if j < k - 1 else _SYNCS:
                with prec.autocast():
                    out = forward(self.forward_model, x)  # model(**x) for any Mapping
                    if self._elsewhere is None:  # model-parallel: logits on the last stage's device
                        self._elsewhere = (isinstance(out, torch.Tensor) and isinstance(y, torch.Tensor)
                                           and out.device != y.device)
                    if self._elsewhere:
                        y = y.to(out.device, non_blocking=True)
                    loss, extras = loss_fn(out, y, batch)
                prec.backward(loss / k if k > 1 else loss)
            if not self._loss_said:
                self._say_loss(window)
            window.add(loss, out, y, b, extras, tokens)
            self._samples_total += b
        if self.comm is not None:
            self.comm.settle()
        prec.step(self.optimizer, self.model)
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()

    def _say_loss(self, window: "_Window") -> None:
        """The first batch decided the loss: rank 0 says which, once; accuracy is counted only
        where the task is classification."""
        self._loss_said = True
        window.classification = self.loss_fn.classification
        if self.ctx.rank == 0:
            self.emit("log", level="info", message=self.loss_fn.said)

    def _after_step(self, epoch: int, micro: int, window: "_Window") -> bool:
        """The step's bookkeeping: position, step event, stop agreement, periodic checkpoint.
        True: the ranks agreed to stop here."""
        t, k, every_n = self.cfg.train, self.cfg.train.grad_accum, self.cfg.checkpoint.every_n_steps
        self.pos.step += 1
        self.pos.batches_done = micro
        step = self.pos.step
        epoch_done = micro + k > self.steps_per_epoch * k
        last = step >= self.total_steps or epoch_done
        logged = step % t.log_every_n_steps == 0 or last
        if logged:
            self._emit_step(epoch, step, window, pause=last or self._saves_soon(step))
        if self._stop_now(step, last):
            if not logged:  # the final position, not the last window's: every view shows it
                self._emit_step(epoch, step, window, pause=True)
            return True
        if (every_n and step % every_n == 0 and step < self.total_steps
                and not (epoch_done and self.cfg.checkpoint.every_epoch)):
            self.save_checkpoint()
        return False

    def _saves_soon(self, step: int) -> bool:
        """A periodic save after this step event or within the next log window: the watchdog must
        not time it as a step."""
        every_n, n = self.cfg.checkpoint.every_n_steps, self.cfg.train.log_every_n_steps
        return bool(every_n and (step + n - 1) // every_n > (step - 1) // every_n and step < self.total_steps)

    def _batch(self, it, epoch: int, index: int, window: "_Window"):
        """The next batch where the model wants it (device, augmentation, memory format). Data wait
        is the time the loader took to hand it over; on the CPU the preparation after it counts too
        (the rank's own cores do it), on a GPU not: the copy and the batch kernels are queued device
        work, and the host blocks in them only while the GPU is behind (as Lightning's profiler
        keeps `train_dataloader_next` apart from `batch_to_device`)."""
        t0 = time.perf_counter()
        batch = next(it)
        fetched = time.perf_counter()
        if self._first_batch:
            self._first_batch = False
            self.emit("phase", phase="steps")
        tokens = token_count(batch)  # input_ids (real ones, with an attention_mask): read on the host
        if self.device.type != "cpu":  # on the CPU the loader's tensors are already where they go
            batch = to_device(batch, self.device)  # whole: tuples and dicts, nested
        x, y = self.loss_fn.split(batch)  # model(x) or model(**x), and the targets
        if isinstance(x, torch.Tensor):
            if self.prep.active:
                x = self.prep(x, epoch, index)
            if self.cfg.train.channels_last and x.dim() == 4:
                x = x.contiguous(memory_format=torch.channels_last)
        waited = (time.perf_counter() if self.device.type == "cpu" else fetched) - t0
        window.data_wait += waited
        self._wait_total += waited
        return x, y, batch, _samples_in(batch), tokens

    def _emit_step(self, epoch: int, step: int, window: "_Window", pause: bool = False) -> None:
        """One step event for the micro-batches since the last one (the log window). pause: what
        comes next is not a training step (evaluation, a checkpoint), so the supervisor's watchdog
        does not time it as one."""
        now = time.perf_counter()
        window.fold()
        window.close()
        loss_sum, correct, *extra = window.sums.tolist()
        n = window.samples
        wall = max(now - window.t0, 1e-9)
        comm = self.comm
        comm_s = None if comm is None else comm.total - window.comm0
        mem = self._device_mem_mb()  # each rank's own figures: node 0 gets every rank's step events (issue 31)
        self.emit("step", epoch=epoch, step=step, total_steps=self.total_steps,
                  loss=loss_sum / max(n, 1), accuracy=correct / max(n, 1) if self.loss_fn.classification else None,
                  metrics={name: v / max(n, 1) for name, v in zip(self.loss_fn.names, extra)},
                  samples_per_s=n / wall, tokens_per_s=None if window.tokens is None else window.tokens / wall,
                  mfu=self._mfu(window.tokens / wall) if self._mfu is not None and window.tokens else None,
                  data_wait_s=window.data_wait,
                  compute_s=max(0.0, wall - window.data_wait), lr=float(self.scheduler.get_last_lr()[0]),
                  comm_s=comm_s, pause=pause, device_mem_mb=mem, peak_mem_mb=self._peak_mem_mb(mem),
                  data_wait=min(1.0, window.data_wait / wall), comm_wait=None if comm_s is None else min(1.0, comm_s / wall))
        window.restart(now)

    def _stop_now(self, step: int, last: bool) -> bool:
        """Every stop_interval steps (and at the last): agree with the other ranks whether to stop."""
        if step >= self._next_check or last:
            if self._should_stop(self._wait_total, self._samples_total, final=step >= self.total_steps):
                self.stopped = True
                return True
            self._next_check = step + self.stop_interval
        return False

    def _end_epoch(self, epoch, sums, samples, has_eval, waited=(0.0, 0.0), partial=False) -> None:
        """waited: (seconds waiting for data, seconds of the epoch) on this rank."""
        extra = torch.tensor([float(samples), *waited], dtype=torch.float64, device=sums.device)
        sums = _all_reduce(torch.cat([sums, extra]))  # the extra metrics' sums ride along
        loss_sum, correct, *metric_sums, n, wait_s, wall_s = sums.tolist()
        if wall_s > 0:
            self._data_bottleneck(epoch, wait_s / wall_s)
        val = {"loss": None, "accuracy": None, "metrics": {}}
        if has_eval:
            val = evaluate_model(self.forward_model, self.val_ds, self.ctx, self.cfg.train.batch_size, self.precision,
                                 channels_last=self.cfg.train.channels_last, prep=self.val_prep, loss=self.loss_fn)
        lf = self.loss_fn
        train_metrics = lf.metrics(loss_sum, metric_sums, n) if n else {}
        fields = dict(epoch=epoch, step=self.pos.step, train_loss=loss_sum / n if n else None,
                      train_acc=correct / n if n and lf.classification else None, val_loss=val["loss"],
                      val_acc=val["accuracy"], train_metrics=train_metrics, val_metrics=val["metrics"])
        if partial:
            fields["partial"] = True
        self.emit("epoch_end", **fields)
