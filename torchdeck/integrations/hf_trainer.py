"""HuggingFace `Trainer`: `Trainer(..., callbacks=[TorchdeckCallback()])`."""
from __future__ import annotations

from transformers import TrainerCallback

from . import _common


class TorchdeckCallback(TrainerCallback):
    """The Trainer's own logs (every `logging_steps`: loss, learning_rate -> lr, grad_norm, epoch,
    and eval_* after an evaluation) as torchdeck.log events of each rank. No step= is passed:
    torchdeck's count of optimizer steps is the Trainer's global_step in a run not resumed, and a
    step= every `logging_steps` would hold the rank's live step at the last log in between.

    samples: this rank's per_device_train_batch_size x gradient_accumulation_steps per optimizer
    step, summed since the previous log, so samples/s is this rank's over the logging interval
    (not the world's: each rank reports its own). The Trainer's loss is already averaged over
    the ranks, so every rank shows the same loss. Its end-of-training summary (train_runtime,
    ...) is left out: torchdeck measures the run itself.
    """

    def __init__(self):
        self._samples = 0

    def on_step_end(self, args, state, control, **kwargs):
        # the state's: auto_find_batch_size may have lowered it; per process (x GPUs under DataParallel)
        per_device = (getattr(state, "train_batch_size", None) or getattr(args, "train_batch_size", None)
                      or args.per_device_train_batch_size)
        self._samples += per_device * max(1, args.gradient_accumulation_steps)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or "train_runtime" in logs:
            return
        samples, self._samples = self._samples or None, 0
        _common.log(_common.to_metrics(logs, rename={"learning_rate": "lr"}), samples=samples)
