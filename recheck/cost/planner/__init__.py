"""Choose what to checkpoint within a memory budget, measured and verified: ``recheck cost --suggest``.

Modules, bottom to top: ``plans`` (the plan a user keeps and applies; no torch), ``wrapping``
(:func:`apply_plan`: a module's forward checkpointed, fully or selectively, and undone),
``overlay`` (the step's own checkpoint calls a plan drops, run directly under any
interception), ``candidates`` (the units and regions found by running the step), ``attribution``
and ``census`` (one traced run per mode: windows, holds, work; timed runs), ``memory_model``
(peak and time of any plan, as a 0-1 program), ``solver`` (milp or an exact branch and bound),
``plan_runs`` (a plan traced, timed and verified with ``check_step``; the anchors),
``keeping`` (the line that keeps a plan in the user's code), ``suggestion`` (the outcome, and the
census every suggestion starts from), ``throughput`` and ``suggest`` (:func:`suggest`),
``plan_table`` (text and JSON).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["Plan", "PlanError", "Suggestion", "apply_plan", "suggest"]

_LAZY = {
    "Plan": "recheck.cost.planner.plans",
    "PlanError": "recheck.cost.planner.plans",
    "Suggestion": "recheck.cost.planner.suggestion",
    "suggest": "recheck.cost.planner.suggest",
    "apply_plan": "recheck.cost.planner.wrapping",
}

if TYPE_CHECKING:  # pragma: no cover
    from recheck.cost.planner.plans import Plan, PlanError
    from recheck.cost.planner.suggest import suggest
    from recheck.cost.planner.suggestion import Suggestion
    from recheck.cost.planner.wrapping import apply_plan


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'recheck.cost.planner' has no attribute {name!r}")
