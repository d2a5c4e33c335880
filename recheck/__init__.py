"""recheck: prove that activation checkpointing recomputes exactly what the forward computed.

The findings model (:class:`Finding`, :class:`Report`, :class:`RecomputeMismatch`) is
importable without torch.  The torch-facing API (``check``, ``assert_recompute_equal``, ``check_function``,
``watch``, ``tag``, ``measure``, ``suggest``, ``apply_plan``, ``gather_report``) is loaded on first use, so ``import recheck`` stays cheap and the
linter and the CLI's catalogue commands never import torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from recheck.findings import (
    DYNAMIC_KINDS,
    KINDS,
    Finding,
    Invocation,
    RecomputeMismatch,
    Report,
)

__version__ = "0.1.0"

#: public name -> module that defines it (imported lazily: these modules import torch)
_LAZY = {
    "check": "recheck.checker",
    "assert_recompute_equal": "recheck.checker",
    "check_step": "recheck.checker",
    "assert_step_equal": "recheck.checker",
    "check_function": "recheck.checker.functions",
    "watch": "recheck.watcher",
    "tag": "recheck.watcher",
    "measure": "recheck.cost",
    "suggest": "recheck.cost",
    "apply_plan": "recheck.cost",
    "gather_report": "recheck.distributed.reports",
}

__all__ = [
    "DYNAMIC_KINDS",
    "KINDS",
    "Finding",
    "Invocation",
    "RecomputeMismatch",
    "Report",
    "__version__",
    *_LAZY,
]

if TYPE_CHECKING:  # pragma: no cover  (for type checkers: at run time __getattr__ imports them)
    from recheck.checker import assert_recompute_equal, assert_step_equal, check, check_step  # noqa: F401
    from recheck.checker.functions import check_function  # noqa: F401
    from recheck.cost import apply_plan, measure, suggest  # noqa: F401
    from recheck.distributed.reports import gather_report  # noqa: F401
    from recheck.watcher import tag, watch  # noqa: F401


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from recheck.dependencies import require_torch

        require_torch(f"recheck.{name}")
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'recheck' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
