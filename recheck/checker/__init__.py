"""The dynamic checker: run a region plainly and under checkpoint, compare bit for bit.

Layers, bottom up: :mod:`.bits` (tensor comparison, digests), :mod:`.values`
(fingerprints, RNG streams), :mod:`.state` (capture/restore), :mod:`.reach` (what a region touches), :mod:`.effects` (logging,
output, warnings), :mod:`.saved` (bitwise determinism check), :mod:`.observe`,
:mod:`.run`, :mod:`.compare`, :mod:`.verdict`, :mod:`.message`, and on top
:mod:`.api` and :mod:`.targets`.
"""

from recheck.checker.api import assert_recompute_equal, assert_step_equal, check, check_step
from recheck.checker.run import RegionError

__all__ = ["RegionError", "assert_recompute_equal", "assert_step_equal", "check", "check_step"]
