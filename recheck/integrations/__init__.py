"""recheck inside training frameworks: callbacks that watch the first training steps.

* :class:`recheck.integrations.hf_trainer.RecheckCallback`, a ``transformers.TrainerCallback``
  for ``transformers.Trainer``;
* :class:`recheck.integrations.lightning_trainer.RecheckCallback`, a Lightning ``Callback``
  for ``lightning.pytorch.Trainer`` (or ``pytorch_lightning``).

Each watches the first ``steps`` training steps with ``recheck.watch()`` (every checkpoint
call compared with its own recomputation), reports each step through the framework's
logger and, with ``fail_fast=True``, stops training with :class:`recheck.RecomputeMismatch`
at the first step with findings.  Other keyword arguments go to ``recheck.watch()``
(``early_stop=``, ``store=``, tolerances).  Importing this package imports neither framework; each module
imports its own when it is imported.
"""
