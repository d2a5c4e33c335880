"""``recheck.measure`` and ``recheck cost``: what checkpointing saves and what it costs, measured.

The subpackage ``planner`` chooses what to checkpoint within a budget (``recheck cost --suggest``)
and ``pipeline`` models pipeline schedules (``--ranks``, ``--plan``).  Importing this package
does not import torch: the public names below are loaded on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["Comparison", "Plan", "Suggestion", "apply_plan", "measure", "suggest"]

#: public name -> the module that defines it (imported on first use: they import torch)
_LAZY = {
    "Comparison": "recheck.cost.results",
    "measure": "recheck.cost.measurement",
    "suggest": "recheck.cost.planner.suggest",
    "Suggestion": "recheck.cost.planner.suggestion",
    "apply_plan": "recheck.cost.planner.wrapping",
    "Plan": "recheck.cost.planner.plans",
}

if TYPE_CHECKING:  # pragma: no cover
    from recheck.cost.measurement import measure
    from recheck.cost.results import Comparison
    from recheck.cost.planner.plans import Plan
    from recheck.cost.planner.suggest import suggest
    from recheck.cost.planner.suggestion import Suggestion
    from recheck.cost.planner.wrapping import apply_plan


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'recheck.cost' has no attribute {name!r}")
