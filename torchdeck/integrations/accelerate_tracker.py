"""Accelerate: `Accelerator(log_with=TorchdeckTracker())`, then `accelerator.init_trackers(...)`
and `accelerator.log(...)` as with any tracker."""
from __future__ import annotations

import os

from accelerate.tracking import GeneralTracker

from . import _common


class TorchdeckTracker(GeneralTracker):
    """`accelerator.log(values, step=step)` as a torchdeck.log event: values["loss"] (or
    loss_key) is the run's loss curve, the other numbers its metrics (with the optimizer's "lr"
    unless logged), at the script's own step.

    Accelerate calls trackers on the main process only, so the loss is rank 0's. With
    samples_per_step (this rank's batch size x gradient accumulation steps) every rank reports
    samples/s: rank 0 with each accelerator.log, the others at each optimizer step (their
    optimizer steps are counted by torchdeck in any case). A call may also pass its own count:
    `accelerator.log(values, step, log_kwargs={"torchdeck": {"samples": n, "tokens": t}})`.
    """

    name = "torchdeck"
    requires_logging_directory = False
    main_process_only = False  # built on every rank: the others count their samples too

    def __init__(self, samples_per_step: int | None = None, loss_key: str = "loss"):
        super().__init__()
        self.loss_keys = (loss_key, "loss", "train_loss")
        self.samples_per_step = _common.check_samples(samples_per_step)
        self._started = False
        self._watch = None
        if os.environ.get("TORCHDECK_EVENTS_FD"):  # only under torchdeck: elsewhere log() does nothing
            self._watch = _common.StepWatch(self.samples_per_step, on_step=self._step_without_logs)

    @property
    def tracker(self):
        return None  # nothing of its own to unwrap: the events go to torchdeck's run

    def start(self):
        # init_trackers runs on the main process only: from here on this rank gets log() calls
        self._started = True

    def _step_without_logs(self) -> None:
        if not self._started and self.samples_per_step:
            _common.log({}, samples=self._watch.take())

    def store_init_configuration(self, values: dict):
        pass  # the run directory keeps the command line; hyperparameters are the script's own

    def log(self, values: dict, step: int | None = None, samples=None, tokens=None, **kwargs):
        metrics = _common.to_metrics(values, loss_keys=self.loss_keys)
        if self._watch is not None:
            taken = self._watch.take()
            samples = taken if samples is None else samples
            metrics = self._watch.add_lr(metrics)
        _common.log(metrics, step=step, samples=samples, tokens=tokens)

    def finish(self):
        if self._watch is not None:
            self._watch.remove()
            self._watch = None
