"""``recheck.suggest(step, budget=...)``: the fastest checkpointing plan within a memory budget, verified.

The steps are those of docs/cost.md: candidates found by running the step, one traced run per
mode (the census), an exact solver, and the plan run exactly beside the folklore plans.  When
the plan's measured peak exceeds the budget, the solver's budget is lowered by the difference
and the plan run again (twice at most): a plan said to fit was measured to fit.  The step's
state is restored after every run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from recheck.cost.planner.census import CLOCKS
from recheck.cost.planner.plan_runs import ANCHORS, PendingRun, anchor_variants, finish_runs, trace_plan
from recheck.cost.planner.plans import SELECTIVE_OPS
from recheck.cost.planner.solver import Infeasible, solve
from recheck.cost.planner.suggestion import NothingFits, Progress, Suggestion, Tell, census, nothing_fits, outcome
from recheck.cost.planner.throughput import suggest_throughput
from recheck.cost.units import format_bytes, parse_bytes
from recheck.runtime.naming import step_name
from recheck.runtime.steps import StepState, discover_state

__all__ = ["suggest"]

_RETRIES = 2


def _budget(budget: int | str | None) -> int:
    if budget is None:
        raise ValueError("recheck.suggest() needs a memory budget (budget=\"24GiB\" or a number of bytes)")
    if isinstance(budget, str):
        return parse_bytes(budget)
    if isinstance(budget, bool) or not isinstance(budget, int) or budget <= 0:
        raise ValueError(f"budget must be a positive number of bytes or a size such as \"24GiB\", got {budget!r}")
    return budget


def suggest(step: Callable[..., Any], /, *, budget: int | str | None, objective: str = "time", repeats: int = 3,
            anchors: bool = True, modules: Iterable[torch.nn.Module] = (),
            optimizers: Iterable[torch.optim.Optimizer] = (), solver: str | None = None, clock: str = "wall",
            progress: Progress | None = None) -> Suggestion:
    """The fastest plan whose observed peak is within ``budget``, run and verified with ``check_step``.

    Args:
        step: a zero-argument training step (forward, backward, optionally the optimizer step),
            the contract of ``recheck cost FILE.py:STEP``; with ``objective="throughput"`` it
            must take a ``batch_size`` argument with a default.
        budget: bytes, or a size such as ``"24GiB"``.
        objective: ``"time"`` (least step time within the budget) or ``"throughput"`` (most
            samples per second over the batch sizes that fit).
        repeats: timed runs per measured configuration (the median is used).
        anchors: also run and verify the folklore plans and the step as written.
        modules, optimizers: state the step uses that cannot be found from it.
        solver: ``"milp"`` (scipy), ``"branch-and-bound"``, or None (milp when scipy is installed).
        clock: ``"wall"`` (wall time) or ``"cpu"`` (the process's CPU time: steadier on a shared
            CPU machine with the step on one thread; blind to time on a GPU).
        progress: called as ``progress(what, done, total)`` before each run.

    Raises:
        ValueError: a bad option; NothingFits: no plan's predicted peak is within the budget;
        NoRepeatedUnit: the step runs no repeated unit under checkpointing and no repeated block.
    """
    if not callable(step):
        raise TypeError(f"recheck.suggest() needs a callable step, got {type(step).__name__}")
    limit = _budget(budget)
    if objective not in ("time", "throughput"):
        raise ValueError(f"objective must be \"time\" or \"throughput\", got {objective!r}")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be a positive whole number, got {repeats!r}")
    if clock not in CLOCKS:
        raise ValueError(f"clock must be \"wall\" or \"cpu\", got {clock!r}")
    if objective == "throughput":
        return suggest_throughput(step, limit, repeats=repeats, anchors=anchors, modules=modules,
                                  optimizers=optimizers, solver=solver, clock=clock, progress=progress)
    state = discover_state(step, modules, optimizers)
    restore = state.snapshot()
    try:
        return _suggest(step, state, restore, limit, repeats, anchors, solver, clock, progress, step_name(step))
    finally:
        restore()


def _suggest(step: Callable[[], Any], state: StepState, restore: Callable[[], None], budget: int, repeats: int,
             anchors: bool, solver: str | None, clock: str, progress: Progress | None, label: str) -> Suggestion:
    plans = 1 + (len(ANCHORS) + 1 if anchors else 0)
    # finding, three modes, timing them; each plan traced and checked; timing the plans
    tell = Tell(progress, 6 + 2 * plans)
    candidates, runs, model = census(step, state, restore, repeats, tell, clock)
    tell.total += len(runs) - 3
    problem = model.problem()
    notes = candidates.notes + model.notes
    attempts: list[dict[str, Any]] = []
    aim = budget
    suggested: PendingRun | None = None
    for attempt in range(_RETRIES + 1):
        try:
            solution = solve(problem, aim, method=solver)
        except Infeasible as exc:
            if attempt == 0:
                raise NothingFits(nothing_fits(budget, exc.smallest)) from None
            notes.append(f"after lowering the budget to {format_bytes(aim)} nothing fits: the last plan "
                         "measured is shown, above the budget")
            break
        variants = {c.index: c.variants[v] for c, v in zip(candidates.items, solution.choice)}
        tell("tracing the suggested plan" + (f" (attempt {attempt + 1})" if attempt else ""))
        suggested = trace_plan(step, state, restore, candidates, model, "suggested", variants, SELECTIVE_OPS)
        run = suggested.run
        attempts.append({"solver_budget": aim, "predicted_peak": run.predicted_peak, "measured_peak": run.measured_peak})
        if run.fits(budget) or run.predicted_peak is None:
            break
        aim = budget - max(1, run.measured_peak - run.predicted_peak)
    assert suggested is not None
    pending = [suggested]
    if anchors:
        for name in ANCHORS:
            tell(f"tracing the anchor plan: {name}")
            pending.append(trace_plan(step, state, restore, candidates, model, name,
                                       anchor_variants(candidates, name), SELECTIVE_OPS))
        if any(c.written for c in candidates.items):  # a step that does not checkpoint is the first anchor
            tell("tracing the step as written")
            pending.append(trace_plan(step, state, restore, candidates, model, "as written", None, SELECTIVE_OPS))
    finish_runs(step, state, restore, candidates, pending, repeats, label, SELECTIVE_OPS, tell, clock)
    return outcome(label, budget, "time", pending, candidates, runs, solver, repeats, attempts, notes, clock)
