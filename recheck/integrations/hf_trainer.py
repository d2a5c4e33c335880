"""``transformers.Trainer``: watch the first training steps with ``recheck.watch()``.

::

    from recheck.integrations.hf_trainer import RecheckCallback

    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    trainer = Trainer(model=model, args=args, train_dataset=data,
                      callbacks=[RecheckCallback(steps=2, fail_fast=True)])
    trainer.train()

A step is one optimizer step (``on_step_begin`` to ``on_step_end``), so it holds all of its
gradient-accumulation micro-batches.  Each watched step is reported through transformers'
logger (``transformers.trainer.recheck``: a warning with the report when something
differs, an info line when it is clean); ``fail_fast=True`` raises
:class:`recheck.RecomputeMismatch` from the first step with findings, which stops
``trainer.train()``.  ``callback.report`` merges the watched steps' reports.  Any other
keyword argument goes to ``recheck.watch()``.
"""

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
