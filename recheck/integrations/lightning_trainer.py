"""Lightning: watch the first training batches with ``recheck.watch()``.

::

    trainer = lightning.pytorch.Trainer(max_steps=100, callbacks=[RecheckCallback(steps=2, fail_fast=True)])

A step is one training batch.  Each watched step is reported through Lightning's logger
(``lightning.pytorch.callbacks.recheck``) and as the metrics ``recheck/findings`` and
``recheck/verified`` given to the trainer's loggers; ``fail_fast=True`` raises
:class:`recheck.RecomputeMismatch` from the first step with findings.  Other keyword arguments go
to ``recheck.watch()``.  ``lightning`` is used, else ``pytorch_lightning``."""

from __future__ import annotations

import logging
from typing import Any

try:
    from lightning.pytorch.callbacks import Callback
    LOGGER_NAME = "lightning.pytorch.callbacks.recheck"
except ImportError:  # the older standalone package
    from pytorch_lightning.callbacks import Callback
    LOGGER_NAME = "pytorch_lightning.callbacks.recheck"

from recheck.findings import Report
from recheck.integrations.step_window import StepWindow

__all__ = ["RecheckCallback"]


class RecheckCallback(Callback):
    """Watch the first ``steps`` training batches of ``Trainer.fit()`` with ``recheck.watch()``."""

    def __init__(self, steps: int = 1, *, fail_fast: bool = False, **watch_options: Any) -> None:
        super().__init__()
        self.logger = logging.getLogger(LOGGER_NAME)
        self.window = StepWindow(steps, fail_fast, self.logger.log, watch_options)

    @property
    def report(self) -> Report:
        return self.window.report

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self.window.begin()

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        report = self.window.end()
        if report is not None:  # straight to the loggers: only the watched steps carry them
            metrics = {"recheck/findings": float(len(report)),
                       "recheck/verified": float(report.stats.get("verified", 0))}
            # the step Lightning's own metrics of this batch are logged at (global_step has moved on)
            step = getattr(trainer.fit_loop.epoch_loop, "_batches_that_stepped", trainer.global_step)
            for logger in trainer.loggers:
                logger.log_metrics(metrics, step=step)

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self.window.close()

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self.window.close()
