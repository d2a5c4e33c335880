"""recheck inside training frameworks: callbacks that watch the first training steps with
``recheck.watch()`` (:mod:`.hf_trainer` for ``transformers.Trainer``, :mod:`.lightning_trainer` for
Lightning), report each through the framework's logger and, with ``fail_fast=True``, stop training
at the first step with findings.  Importing this package imports neither framework."""
