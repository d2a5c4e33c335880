"""``transformers.Trainer``: watch the first training steps with ``recheck.watch()``.

::

    trainer = Trainer(model=model, args=args, train_dataset=data,
                      callbacks=[RecheckCallback(steps=2, fail_fast=True)])

A step is one optimizer step, with all its gradient-accumulation micro-batches.  Each watched step
is reported through transformers' logger (``transformers.trainer.recheck``); ``fail_fast=True``
raises :class:`recheck.RecomputeMismatch` from the first step with findings.  Other keyword
arguments go to ``recheck.watch()``."""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback
from transformers.utils import logging as hf_logging

from recheck.findings import Report
from recheck.integrations.step_window import StepWindow

__all__ = ["RecheckCallback"]

#: transformers' logger hierarchy: the messages follow ``transformers.logging.set_verbosity_*``.
LOGGER_NAME = "transformers.trainer.recheck"


class RecheckCallback(TrainerCallback):
    """Watch the first ``steps`` optimizer steps of ``Trainer.train()`` with ``recheck.watch()``."""

    def __init__(self, steps: int = 1, *, fail_fast: bool = False, **watch_options: Any) -> None:
        self.logger = hf_logging.get_logger(LOGGER_NAME)
        self.window = StepWindow(steps, fail_fast, self.logger.log, watch_options)

    @property
    def report(self) -> Report:
        return self.window.report

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.window.close()  # a watch left open by a run that raised

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.window.begin()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.window.end()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.window.close()

    def close(self) -> None:
        """End a watch that ``trainer.train()`` left open when it raised mid-step."""
        self.window.close()
