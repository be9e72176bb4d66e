"""The training loop, strategy-agnostic: it only talks to the Strategy interface.

One `Trainer` per rank. The hot path does no host sync and sends nothing except at log steps:
the loss and the task's metrics are summed on the device (engine/window.py, engine/sums.py) and
read once per step event. The stop agreement and the rank reports are engine/agreement.py;
evaluation is engine/evaluate.py.
"""
from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from . import checkpoint as ckpt
from .agreement import Agreement, Memory
from .batch import forward, samples_in, to_device, token_count
from .cache import NodeShare
from .data import TrainData
from .errors import TorchdeckError
from .evaluate import evaluate_model
from .events import EVENT_VERSION
from .losses import Loss
from .optim import set_speed_flags
from .sums import Sums
from .window import Window


_SYNCS = contextlib.nullcontext()  # the last micro-batch of a step: its backward syncs the gradients


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

    @classmethod
    def attach(cls, model, device) -> "CommClock | None":
        """Where the time goes: waiting for the other ranks (CPU DDP for now)."""
        if not (isinstance(model, torch.nn.parallel.DistributedDataParallel) and device.type == "cpu"):
            return None
        comm = cls()
        model.register_comm_hook(None, comm.hook)
        return comm

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


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def node_share(ctx, run_dir, device) -> NodeShare | None:
    """How this rank shares decoded data with the other ranks of its node (engine/cache.py)."""
    if not _distributed() or ctx.local_world_size < 2:
        return None

    def agree(flags):
        t = torch.tensor([float(f) for f in flags], dtype=torch.float64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        return [v > 0 for v in t.tolist()]

    return NodeShare(ctx.local_rank, ctx.local_world_size, f"{Path(run_dir).resolve()}|node{ctx.node_rank}",
                     dist.barrier, agree)


def without_dynamo(cfg):
    """train.compile off: nothing in the rank is compiled, so its optimizer and DDP go without
    importing torch._dynamo (engine/nodynamo.py), a second or two of CPU per rank."""
    from . import nodynamo
    from .optim import optimizer_class

    if not nodynamo.goes_without(cfg):
        return contextlib.nullcontext()
    nodynamo.prepare([c for c in (optimizer_class(cfg),) if c is not None])
    return nodynamo.ddp_without_dynamo()


@dataclass
class Position:
    """Where training is: optimizer steps done, epoch, micro-batches of that epoch consumed."""

    epoch: int = 0
    step: int = 0
    batches_done: int = 0


class Trainer:
    DATA_WAIT_WARN = 0.25

    def __init__(self, cfg, strategy, ctx, run_dir, emit, stop_requested=lambda: False):
        """emit(kind, **fields) reports an event; stop_requested() is this rank's local stop flag."""
        self.cfg, self.strategy, self.ctx, self.run_dir, self.emit = cfg, strategy, ctx, run_dir, emit
        t = cfg.train
        self.device = ctx.device
        set_speed_flags(cfg, self.device)

        self.loss_fn = Loss(t.loss)  # train.loss: its callable found before the data is built
        emit("phase", phase="data")
        self.data = data = TrainData(cfg, ctx, node_share(ctx, run_dir, self.device))
        self.train_ds, self.val_ds, self.info = data.train_ds, data.val_ds, data.info
        emit("phase", phase="model")
        model = self._build_model()
        data.open_loader(strategy.sampler(self.train_ds, ctx, shuffle=True, seed=t.seed), emit)
        self.sampler, self.loader, self.prep, self.val_prep = data.sampler, data.loader, data.prep, data.val_prep
        self.workers, self.worker_start, self.forks_workers = data.workers, data.worker_start, data.forks_workers
        self.micro_per_epoch, self.steps_per_epoch, self.total_steps = self._count_steps(len(data.inner))
        with without_dynamo(cfg):
            self.model, self.optimizer, self.scheduler, self.precision = strategy.setup(
                model, ctx, self.total_steps, self.steps_per_epoch)
        self.comm = CommClock.attach(self.model, self.device)
        # Strategy calls get the wrapped module; only the forward goes through the compiled one.
        self.forward_model = torch.compile(self.model) if t.compile else self.model
        from .models import mfu_meter

        self._mfu = mfu_meter(model, t.compile, self.device)  # step events' mfu: compiled, on a GPU
        self._targets_to = strategy.targets_device(ctx)  # model-parallel: the last stage's device
        self.memory = Memory(self.device)
        self.agreement = Agreement(ctx, self.device, self.comm, emit, stop_requested, t.report_every_s, self.memory)
        self.pos = Position()
        self.ckpt_dir = ckpt.checkpoint_dir(cfg, run_dir)
        self.last_saved_step = -1
        self.stopped = False
        self._first_batch = False  # fit() sets it: its first batch ends the start-up phase "batch"
        self._loss_said = False
        self._warned_data = False
        self._has_eval = bool(t.eval_every_epoch and self.val_ds is not None and len(self.val_ds) > 0)
        self._wait_total, self._samples_total = 0.0, 0  # for the rank reports

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

    def _count_steps(self, per_rank: int) -> tuple[int, int, int]:
        """Micro-batches and steps per epoch, and steps in all, from the samples this rank's sampler
        hands it."""
        t = self.cfg.train
        micro_per_epoch = per_rank // t.batch_size
        steps_per_epoch = micro_per_epoch // t.grad_accum
        if steps_per_epoch == 0:
            raise TrainError(
                f"train.batch_size {t.batch_size} x grad_accum {t.grad_accum} needs more samples per rank "
                f"than the {per_rank} this rank gets from {self.info.name} ({len(self.train_ds)} in all); "
                "lower the batch size or use more data")
        by_epochs = t.epochs * steps_per_epoch if t.epochs else math.inf
        return micro_per_epoch, steps_per_epoch, int(min(t.max_steps or math.inf, by_epochs))

    def _data_bottleneck(self, epoch: int, share: float) -> None:
        """Say once, on rank 0, when the ranks spend much of an epoch waiting for batches, and
        which knob to turn (the Monitor and `torchdeck run` show the log)."""
        if share < self.DATA_WAIT_WARN or self.ctx.rank != 0 or self._warned_data:
            return
        self._warned_data = True
        knob = self.data.bottleneck_knob()
        self.emit("log", level="warning", message=f"data is the bottleneck: the ranks waited for batches "
                                                  f"{share:.0%} of epoch {epoch + 1}; {knob}")

    def data_note(self) -> str:
        """How the batches come, for the run's log."""
        return self.data.note()

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
        self.agreement.start(self.pos.step)
        self._wait_total, self._samples_total = 0.0, 0
        self.forward_model.train()
        # Start-up's last two phases: the first batch (loader workers start: each imports torch)
        # and the steps up to the first step event (log_every_n_steps of them), told apart.
        self._first_batch = True
        self.emit("phase", phase="batch", step=self.pos.step, epoch=self.pos.epoch)  # where it trains from

    def _run_epoch(self, epoch: int) -> None:
        """One epoch, or the rest of it after a resume, up to max_steps or an agreed stop."""
        k = self.cfg.train.grad_accum
        self.sampler.set_epoch(epoch)
        self.sampler.skip = self.pos.batches_done * self.cfg.train.batch_size
        it = iter(self.loader)
        window = Window(self.device, self.comm, self.loss_fn)
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
            self._end_epoch(epoch, window.epoch_sums, waited)
            self.pos = Position(epoch + 1, self.pos.step, 0)
            if self.cfg.checkpoint.every_epoch and self.pos.step < self.total_steps:
                self.save_checkpoint()
        elif self._has_eval:  # max_steps ended it mid-epoch: still report where the model stands
            self._end_epoch(epoch, window.epoch_sums, waited, partial=True)

    def _train_step(self, it, epoch: int, micro: int, window: Window) -> None:
        """One optimizer step: forward and backward over grad_accum micro-batches (only the last
        backward syncs the gradients), then the update. One call per step, the forward inline: this
        is the hot path."""
        k, prec, loss_fn = self.cfg.train.grad_accum, self.precision, self.loss_fn
        for j in range(k):
            x, y, batch, b, tokens = self._batch(it, epoch, micro + j, window)
            with self.strategy.no_sync(self.model) if j < k - 1 else _SYNCS:
                with prec.autocast():
                    out = forward(self.forward_model, x)  # model(**x) for any Mapping
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

    def _say_loss(self, window: Window) -> None:
        """The first batch decided the loss: rank 0 says which, once."""
        self._loss_said = True
        window.decided()
        if self.ctx.rank == 0:
            self.emit("log", level="info", message=self.loss_fn.said)

    def _after_step(self, epoch: int, micro: int, window: Window) -> bool:
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
        if self.agreement.stop_now(self.pos, last, step >= self.total_steps, self._wait_total, self._samples_total):
            self.stopped = True
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

    def _batch(self, it, epoch: int, index: int, window: Window):
        """The next batch where the model wants it (device, augmentation, memory format; the
        targets where the strategy's output lands). Data wait is the time the loader took to hand
        it over; on the CPU the preparation after it counts too (the rank's own cores do it), on a
        GPU not: the copy and the batch kernels are queued device work, and the host blocks in them
        only while the GPU is behind (as Lightning's profiler keeps `train_dataloader_next` apart
        from `batch_to_device`)."""
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
        if self._targets_to is not None and isinstance(y, torch.Tensor):
            y = y.to(self._targets_to, non_blocking=True)
        waited = (time.perf_counter() if self.device.type == "cpu" else fetched) - t0
        window.data_wait += waited
        self._wait_total += waited
        return x, y, batch, samples_in(batch), tokens

    # ------------------------------------------------------------------ what the rank reports
    def _emit_step(self, epoch: int, step: int, window: Window, pause: bool = False) -> None:
        """One step event for the micro-batches since the last one (the log window). pause: what
        comes next is not a training step (evaluation, a checkpoint), so the supervisor's watchdog
        does not time it as one."""
        now = time.perf_counter()
        window.fold()
        window.close()
        fields = window.step_fields(now, self._mfu, float(self.scheduler.get_last_lr()[0]), pause, self.memory)
        self.emit("step", epoch=epoch, step=step, total_steps=self.total_steps, **fields)
        window.restart(now)

    def _end_epoch(self, epoch: int, sums: Sums, waited=(0.0, 0.0), partial: bool = False) -> None:
        """The epoch's training figures over every rank and, where the run evaluates, the validation
        set's. waited: (seconds waiting for data, seconds of the epoch) on this rank."""
        wait_s, wall_s = sums.all_reduce(*waited)  # the ranks' data waits ride along
        if wall_s > 0:
            self._data_bottleneck(epoch, wait_s / wall_s)
        val = {"loss": None, "accuracy": None, "metrics": {}}
        if self._has_eval:
            val = evaluate_model(self.forward_model, self.val_ds, self.ctx, self.cfg.train.batch_size, self.precision,
                                 channels_last=self.cfg.train.channels_last, prep=self.val_prep, loss=self.loss_fn)
        train = sums.figures(self.loss_fn.tokens)
        fields = dict(epoch=epoch, step=self.pos.step, train_loss=train["loss"], train_acc=train["accuracy"],
                      val_loss=val["loss"], val_acc=val["accuracy"], train_metrics=train["metrics"],
                      val_metrics=val["metrics"])
        if partial:
            fields["partial"] = True
        self.emit("epoch_end", **fields)
