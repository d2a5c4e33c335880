"""The rules, one module each.

Body rules (RC101-RC108) expose ``CODE``, ``NODES`` and ``check(node, ctx)``, which
yields :class:`~recheck.lint.facts.Hazard` for one AST node of a function body; the
hazards count only if the function turns out to be checkpointed.  Call-site rules
(RC001, RC002) expose ``check_site``; RC106 also judges submodule calls in phase two;
RC003 judges ``autograd.Function`` classes wherever they are (``check_class``).
"""

from __future__ import annotations

from types import ModuleType

from recheck.catalogue import FIXABLE

from recheck.lint.rules import (
    rc001_use_reentrant,
    rc002_preserve_rng,
    rc101_global_read,
    rc102_device_move,
    rc103_side_effect,
    rc104_state_write,
    rc105_host_rng,
    rc106_batchnorm,
    rc107_input_mutation,
    rc003_handwritten_checkpoint,
    rc108_nondeterministic_call,
)

__all__ = ["ALL_CODES", "BODY_RULES", "FIXABLE"]

BODY_RULES: tuple[ModuleType, ...] = (
    rc101_global_read,
    rc102_device_move,
    rc103_side_effect,
    rc104_state_write,
    rc105_host_rng,
    rc106_batchnorm,
    rc107_input_mutation,
    rc108_nondeterministic_call,
)
ALL_CODES: tuple[str, ...] = tuple(sorted((rc001_use_reentrant.CODE, rc002_preserve_rng.CODE,
                                           rc003_handwritten_checkpoint.CODE, *(r.CODE for r in BODY_RULES))))
