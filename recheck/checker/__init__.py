"""The dynamic checker: a region or a whole step against its uncheckpointed twin.

:func:`check` makes a step of one region (the checkpointed call, then backward with a seeded
upstream gradient) and checks it as :func:`check_step` checks a step (:mod:`.twin`): the step as
written under ``watch()``, whose invocation records compare each recompute with its own forward,
and the step with every checkpoint bypassed, whose end state is compared with it.  It stands on
:mod:`recheck.runtime` (snapshot and restore, reach, effects) and :mod:`recheck.watcher`;
:mod:`.compare` and :mod:`.message` word the twins' differences, :mod:`.api` is the public face.
"""

from recheck.checker.api import assert_recompute_equal, assert_step_equal, check, check_step
from recheck.checker.twin import RegionError

__all__ = ["RegionError", "assert_recompute_equal", "assert_step_equal", "check", "check_step"]
