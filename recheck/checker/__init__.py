"""The dynamic checker: run a region plainly and under checkpoint, compare bit for bit.

It stands on :mod:`recheck.runtime`: ``bits`` and ``digests`` (tensor comparison, digests),
``fingerprints`` and ``rng`` (values, RNG streams), ``snapshot`` (capture/restore), ``reach``
(what a region touches), ``effects`` (logging, output, warnings), ``saved_tensors`` (the
bitwise determinism check).  Its own modules, bottom up: :mod:`.inputs`, :mod:`.observe`,
:mod:`.run`, :mod:`.compare`, :mod:`.verdict`, :mod:`.message`, :mod:`.twin` (``check_step``'s
twin), and on top :mod:`.api`.
"""

from recheck.checker.api import assert_recompute_equal, assert_step_equal, check, check_step
from recheck.checker.run import RegionError

__all__ = ["RegionError", "assert_recompute_equal", "assert_step_equal", "check", "check_step"]
