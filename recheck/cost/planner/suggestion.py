"""The outcome of a suggestion and the census every suggestion starts from.

:class:`Suggestion` is what :func:`recheck.suggest` returns (``str()`` is the report, ``to_dict()``
the JSON document); :func:`census` finds the candidates, traces and times every mode and builds
the model, for either objective (:mod:`~recheck.cost.planner.suggest`,
:mod:`~recheck.cost.planner.throughput`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from recheck.cost.planner.candidates import Candidates, find_candidates
from recheck.cost.planner.census import RunFigures, mode_config, time_configs, trace_config
from recheck.cost.planner.keeping import Change
from recheck.cost.planner.memory_model import Model
from recheck.cost.planner.plan_runs import ANCHORS, CandidateFigures, PlanRun, kept_bytes
from recheck.cost.planner.plans import Plan
from recheck.cost.planner.solver import have_scipy
from recheck.cost.units import format_bytes
from recheck.runtime.steps import StepState

__all__ = ["NothingFits", "Progress", "Suggestion", "census", "nothing_fits", "solver_name"]

#: ``progress(what, done, total)``: told before each run.
Progress = Callable[[str, int, int], None]


class NothingFits(ValueError):
    """No plan's predicted peak is within the budget."""


@dataclass
class Suggestion:
    """The suggested plan, measured and verified, beside the anchors (``str()`` is the report)."""

    step: str
    budget: int
    objective: str
    plan: Plan
    suggested: PlanRun
    anchors: list[PlanRun]
    candidates: list[CandidateFigures]
    solver: str
    repeats: int
    attempts: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    throughput: dict[str, Any] | None = None
    clock: str = "wall"
    #: the line that keeps the plan in the user's code (None when the step checkpoints already)
    change: Change | None = None

    def best_anchor(self) -> PlanRun | None:
        """The fastest anchor measured within the budget (with the throughput objective: the one
        with the most samples per second, each at its own batch size)."""
        fitting = [a for a in self.anchors if a.name in ANCHORS and a.fits(self.budget)]
        if self.objective == "throughput":
            return max(fitting, key=lambda a: a.samples_per_second, default=None)
        return min(fitting, key=lambda a: a.measured_seconds, default=None)

    def __str__(self) -> str:
        from recheck.cost.planner.plan_table import render_suggestion

        return render_suggestion(self)

    def to_dict(self) -> dict[str, Any]:
        from recheck.cost.planner.plan_table import suggestion_to_dict

        return suggestion_to_dict(self)


def census(step: Callable[[], Any], state: StepState, restore: Callable[[], None], repeats: int,
           tell: Callable[[str], None], clock: str = "wall") -> tuple[Candidates, dict[str, RunFigures], Model]:
    """Find the candidates, trace and time every mode, build the model."""
    tell("finding the candidates")
    candidates = find_candidates(step, state, restore)
    modes = ["none", "full", "selective"] + (["written"] if any(c.kind == "outer" for c in candidates.items) else [])
    runs = {}
    for mode in modes:
        tell(f"tracing every candidate: {mode}")
        runs[mode] = trace_config(step, state, restore, candidates, mode_config(mode, candidates))
    for c in candidates.units:  # a selective policy that saves no operator output is the full checkpoint
        c.selective = kept_bytes(runs["selective"], c) != kept_bytes(runs["full"], c)
    tell(f"timing the {len(modes)} modes, {repeats} run(s) each")
    time_configs(step, state, restore, candidates, list(runs.values()), repeats, clock=clock)
    return candidates, runs, Model(candidates, runs)


def solver_name(solver: str | None, notes: list[str]) -> str:
    """The solver used (a note says when the fallback ran because scipy is missing)."""
    method = solver or ("milp" if have_scipy() else "branch-and-bound")
    if method == "branch-and-bound" and solver is None:
        notes.append("solved exactly by branch and bound (scipy is not installed; pip install 'recheck[plan]' "
                     "for scipy.optimize.milp)")
    return method


def nothing_fits(budget: int, smallest: int) -> str:
    """The message of :class:`NothingFits`."""
    return (f"no plan fits the budget of {format_bytes(budget)}: the smallest predicted peak of any plan is "
            f"{format_bytes(smallest)}; raise the budget or make the step smaller (batch size, sequence length)")
