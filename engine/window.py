"""What one rank saw since its last step event (a log window) and in its epoch so far.

Per micro-batch only its detached loss, predictions and extras are kept; `fold()` turns them
into named sums (engine/sums.py) a log window (or 64 micro-batches) at a time: one argmax per
step instead of five small ops, and on a GPU no extra kernels per step. Tokens and seconds are
counted on the host.
"""
from __future__ import annotations

import time

import torch

from .agreement import Memory
from .losses import logits_of
from .sums import Sums

FOLD_EVERY = 64  # micro-batches kept before they are folded into sums


class Window:
    def __init__(self, device, comm, loss):
        """comm: the rank's CommClock or None; loss: the run's Loss (its rule decides the layout)."""
        self.device, self.comm, self.loss = device, comm, loss
        self.classification = loss.classification or not loss.decided  # the first batch decides it
        self.sums = Sums.of(loss.rule, device)
        self.epoch_sums = Sums.of(loss.rule, device)
        self.epoch_samples = 0
        self._loss, self._pred, self._y, self._b, self._extra = [], [], [], [], []
        self.t0 = self.data_wait = self.comm0 = 0.0
        self.samples, self.tokens = 0, None
        self.restart(time.perf_counter())

    def restart(self, now: float) -> None:
        self.sums.zero_()
        self.t0, self.data_wait, self.samples, self.tokens = now, 0.0, 0, None
        self.comm0 = self.comm.total if self.comm is not None else 0.0

    def decided(self) -> None:
        """The first batch decided the loss: accuracy is counted, and has its slot, only for
        classification."""
        self.classification = self.loss.classification
        if self.sums.hits != self.classification:  # laid out before the rule was known: nothing in them yet
            self.sums, self.epoch_sums = Sums.of(self.loss.rule, self.device), Sums.of(self.loss.rule, self.device)

    def add(self, loss, out, y, b: int | None = None, extras=None, tokens: int | None = None) -> None:
        b = y.shape[0] if b is None else b
        self._loss.append(loss.detach())
        if self.classification:
            self._pred.append((out if isinstance(out, torch.Tensor) else logits_of(out)).detach().argmax(1))
            self._y.append(y)
        if extras:
            self._extra.append(torch.stack(extras))
        self._b.append(b)
        if len(self._b) >= FOLD_EVERY:
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
        parts = [weights.sum(), losses @ weights]
        if self._pred:
            parts.append(torch.cat(self._pred).eq(torch.cat(self._y)).sum().double())
        if self._extra:
            parts += list((torch.stack(self._extra).double() * weights.to(self._extra[0].device)[:, None]).sum(0)
                          .to(losses.device))
        self.sums.follow(self.loss.rule)  # extras named by the first batch that has them
        self.sums.add(torch.stack(parts))
        for pending in (self._loss, self._pred, self._y, self._b, self._extra):
            pending.clear()

    def close(self) -> None:
        """The window's sums into the epoch's."""
        self.epoch_sums.add_sums(self.sums)

    def step_fields(self, now: float, mfu, lr: float, pause: bool, mem: "Memory") -> dict:
        """The step event's fields for this window: its means (no perplexity: per step it is noise
        around the epoch's), its rates and the rank's own figures (node 0 gets every rank's step
        events, issue 31); mfu(tokens_per_s) where the rank measures it."""
        fig = self.sums.figures(self.loss.tokens, perplexity=False)
        n, wall = self.samples, max(now - self.t0, 1e-9)
        comm_s = None if self.comm is None else self.comm.total - self.comm0
        tokens_per_s = None if self.tokens is None else self.tokens / wall
        now_mb = mem.now_mb()
        return dict(loss=fig["loss"] if n else 0.0, accuracy=fig["accuracy"], metrics=fig["metrics"],
                    samples_per_s=n / wall, tokens_per_s=tokens_per_s,
                    mfu=mfu(tokens_per_s) if mfu is not None and self.tokens else None,
                    data_wait_s=self.data_wait, compute_s=max(0.0, wall - self.data_wait), lr=lr, comm_s=comm_s,
                    pause=pause, device_mem_mb=now_mb, peak_mem_mb=mem.peak_mb(now_mb),
                    data_wait=min(1.0, self.data_wait / wall), comm_wait=None if comm_s is None else min(1.0, comm_s / wall))
