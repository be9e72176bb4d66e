"""Lightning (`lightning` or `pytorch_lightning`): `Trainer(logger=TorchdeckLogger(samples_per_step=B))`."""
from __future__ import annotations

import os
import sys

# The standalone pytorch_lightning package is the same code under another name: a script that
# imported it gets a logger of its kind, without a second copy of Lightning imported beside it.
if "pytorch_lightning" in sys.modules and "lightning" not in sys.modules:
    from pytorch_lightning.loggers import Logger
else:
    try:
        from lightning.pytorch.loggers import Logger
    except ImportError:  # only pytorch-lightning installed
        from pytorch_lightning.loggers import Logger

from . import _common


class TorchdeckLogger(Logger):
    """What the LightningModule logs (`self.log("train_loss", loss)`, every `log_every_n_steps`)
    as torchdeck.log events of each rank: "loss" (or train_loss, train_loss_step, or loss_key) is
    the run's loss curve, the other numbers (epoch, val_*, the optimizer's lr unless logged) its
    metrics. Lightning calls a logger on every rank, so each rank shows its own loss (unless
    logged with sync_dist=True).

    The step is torchdeck's count of optimizer steps (1 after the first), not Lightning's: it
    logs a training step with the number of steps done before it (0 after the first).
    samples_per_step: this rank's batch size x accumulate_grad_batches; a logger never sees a
    batch, so samples/s needs it (counted at each optimizer step, sent with the next log).
    """

    def __init__(self, samples_per_step: int | None = None, loss_key: str = "loss"):
        super().__init__()
        self.loss_keys = (loss_key, "loss", "train_loss", "train_loss_step", "loss_step")
        self.samples_per_step = _common.check_samples(samples_per_step)
        self._watch = None
        if os.environ.get("TORCHDECK_EVENTS_FD"):  # only under torchdeck: elsewhere log() does nothing
            self._watch = _common.StepWatch(self.samples_per_step)

    @property
    def name(self) -> str:
        return "torchdeck"

    @property
    def version(self) -> str:
        return os.environ.get("TORCHELASTIC_RUN_ID", "")

    def log_hyperparams(self, params, *args, **kwargs) -> None:
        pass  # the run directory keeps the command line; hyperparameters are the script's own

    def log_metrics(self, metrics, step=None) -> None:
        metrics = _common.to_metrics(metrics, loss_keys=self.loss_keys)
        samples = None
        if self._watch is not None:
            samples = self._watch.take()
            metrics = self._watch.add_lr(metrics)
        _common.log(metrics, samples=samples)

    def finalize(self, status: str) -> None:
        if self._watch is not None:
            self._watch.remove()
            self._watch = None
