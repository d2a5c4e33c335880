"""``--objective throughput``: the plan and microbatch size with the most samples per second.

The step takes a ``batch_size`` argument with a default *b*: every mode is measured at *b* and
*2b* and every term of the model is fitted as a straight line in the batch size (as
``recheck cost --budget`` fits each phase's peak).  For every batch size some plan fits, the
solver finds the fastest plan; the most samples per second wins.  That plan, and each anchor at
the largest batch size the model gives it, is then run at that size: what is said to fit was
measured at the size it is said to fit at.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

import torch

from recheck.cost.budget import default_batch_size
from recheck.cost.planner.memory_model import Problem, Row
from recheck.cost.planner.plans import SELECTIVE_OPS
from recheck.cost.planner.solver import Infeasible, smallest_peak, solve
from recheck.cost.planner.plan_runs import ANCHORS, PendingRun, anchor_variants, finish_runs, trace_plan
from recheck.cost.planner.suggestion import NothingFits, Progress, Suggestion, Tell, census, nothing_fits, outcome
from recheck.cost.units import format_bytes
from recheck.runtime.naming import step_name
from recheck.runtime.steps import discover_state

__all__ = ["interpolate", "suggest_throughput"]

#: Batch sizes tried at most (beyond it, a geometric grid up to the largest that fits).
_GRID = 48


def _line(a: float, b: float, x0: int, x1: int, x: int) -> float:
    return a + (b - a) * (x - x0) / (x1 - x0)


def interpolate(p0: Problem, p1: Problem, b0: int, b1: int, b: int) -> Problem:
    """The problem at batch size ``b``, every coefficient on the line through ``b0`` and ``b1``.

    Rows are matched by window, groups by the candidates holding them; a term missing at one
    size counts 0 there.  Coefficients are kept at 0 or more (a line fitted at two sizes can
    cross zero below them).
    """
    groups = list(dict.fromkeys([*p0.groups, *p1.groups]))
    index = {g: i for i, g in enumerate(groups)}
    rows1 = {row.window: row for row in p1.rows}
    rows = []
    for row0 in p0.rows:
        row1 = rows1.get(row0.window, Row(row0.window, row0.constant))
        row = Row(row0.window, max(0, round(_line(row0.constant, row1.constant, b0, b1, b))))
        for pair in {*row0.terms, *row1.terms}:
            row.terms[pair] = max(0, round(_line(row0.terms.get(pair, 0), row1.terms.get(pair, 0), b0, b1, b)))
        g0 = {p0.groups[g]: k for g, k in row0.groups.items()}
        g1 = {p1.groups[g]: k for g, k in row1.groups.items()}
        for group in {*g0, *g1}:
            row.groups[index[group]] = max(0, round(_line(g0.get(group, 0), g1.get(group, 0), b0, b1, b)))
        rows.append(row)
    seconds = [[max(0.0, _line(s0, s1, b0, b1, b)) for s0, s1 in zip(c0, c1)]
               for c0, c1 in zip(p0.seconds, p1.seconds)]
    return Problem(p0.variants, seconds, rows, groups, p0.tied)


def _sizes(largest: int) -> list[int]:
    if largest <= _GRID:
        return list(range(1, largest + 1))
    ratio = largest ** (1.0 / (_GRID - 1))
    return sorted({max(1, min(largest, round(ratio ** i))) for i in range(_GRID)} | {largest})


def _largest(fits: Callable[[int], bool], start: int) -> int:
    """The largest batch size for which ``fits`` holds (0 when even 1 does not)."""
    if not fits(1):
        return 0
    low, high = 1, max(2, start)
    while fits(high):
        low, high = high, high * 2
        if high > 1 << 24:
            return low
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low


def suggest_throughput(step: Callable[..., Any], budget: int, *, repeats: int, anchors: bool,
                       modules: Iterable[torch.nn.Module], optimizers: Iterable[torch.optim.Optimizer],
                       solver: str | None, clock: str, progress: Progress | None) -> Suggestion:
    """:func:`recheck.suggest` with ``objective="throughput"`` (see the module docstring)."""
    base = default_batch_size(step)
    if base is None:
        raise ValueError("objective \"throughput\" needs a step with a batch_size argument that has a default "
                         "(def step(batch_size=8): ...), so other microbatch sizes can be measured")
    label = step_name(step)
    state = discover_state(step, modules, optimizers)
    restore = state.snapshot()
    tell = Tell(progress, 2 * 6 + 2 * (1 + (len(ANCHORS) if anchors else 0)))
    try:
        sizes = (base, 2 * base)
        models = []
        for size in sizes:  # the census tells its runs at this size
            models.append(census(functools.partial(step, batch_size=size), state, restore, repeats,
                                 lambda what: tell(f"{what} (batch {size})"), clock))
        (candidates, runs, model0), (_, _, model1) = models
        p0, p1 = model0.problem(), model1.problem()
        base0, base1 = model0.base_seconds, model1.base_seconds

        def problem_at(b: int) -> Problem:
            return interpolate(p0, p1, sizes[0], sizes[1], b)

        def seconds_at(b: int, extra: float) -> float:
            return max(1e-12, _line(base0, base1, sizes[0], sizes[1], b)) + extra

        def traced(name: str, variants: dict[int, str], b: int) -> PendingRun:
            """The plan ``variants`` traced at batch size ``b``, with the model's prediction there."""
            item = trace_plan(functools.partial(step, batch_size=b), state, restore, candidates, None, name, variants,
                              SELECTIVE_OPS)
            at, choice = problem_at(b), [c.variants.index(variants.get(c.index, "none")) for c in candidates.items]
            item.run.predicted_peak = max(at.memory(choice))
            item.run.predicted_seconds = seconds_at(b, at.time(choice))
            item.run.batch_size = b
            return item

        largest = _largest(lambda b: smallest_peak(problem_at(b), method=solver) <= budget, sizes[1])
        if largest == 0:
            raise NothingFits(nothing_fits(budget, smallest_peak(problem_at(1), method=solver)) +
                              " (at batch size 1)")
        best: tuple[float, int, Any] | None = None
        for b in _sizes(largest):
            try:
                solution = solve(problem_at(b), budget, method=solver)
            except Infeasible:
                continue
            rate = b / seconds_at(b, solution.seconds)
            if best is None or rate > best[0]:
                best = (rate, b, solution)
        assert best is not None
        rate, batch, solution = best
        variants = {c.index: c.variants[v] for c, v in zip(candidates.items, solution.choice)}
        notes = candidates.notes + model0.notes
        attempts = []
        for attempt in range(3):
            tell(f"tracing the suggested plan at batch size {batch}")
            item = traced("suggested", variants, batch)
            attempts.append({"batch_size": batch, "predicted_peak": item.run.predicted_peak,
                             "measured_peak": item.run.measured_peak})
            if item.run.fits(budget) or attempt == 2 or batch == 1:
                break
            batch = max(1, int(batch * budget / item.run.measured_peak))
            try:
                solution = solve(problem_at(batch), budget, method=solver)
                variants = {c.index: c.variants[v] for c, v in zip(candidates.items, solution.choice)}
            except Infeasible:
                pass
        pending = [item]
        for name in ANCHORS if anchors else ():
            chosen = anchor_variants(candidates, name)
            choice = [c.variants.index(chosen.get(c.index, "none")) for c in candidates.items]
            fits = _largest(lambda b: max(problem_at(b).memory(choice)) <= budget, sizes[1])
            if fits == 0:
                notes.append(f"the anchor {name!r} fits no batch size within the budget")
                continue
            tell(f"tracing the anchor plan: {name} at batch size {fits}")
            pending.append(traced(name, chosen, fits))
        for item in pending:
            sized = functools.partial(step, batch_size=item.run.batch_size)
            finish_runs(sized, state, restore, candidates, [item], repeats, label, SELECTIVE_OPS, tell, clock)
    finally:
        restore()
    suggested = pending[0].run
    assert suggested.batch_size is not None and suggested.predicted_seconds
    throughput = {"batch_size": suggested.batch_size,
                  "samples_per_second": suggested.batch_size / suggested.predicted_seconds,
                  "measured_samples_per_second": suggested.samples_per_second, "largest_batch_size": largest,
                  "measured_at": list(sizes), "budget": format_bytes(budget),
                  "note": f"every term fitted as a straight line in the batch size from batch sizes {sizes[0]} and "
                          f"{sizes[1]}; the plans were then run at the batch size shown"}
    return outcome(label, budget, "throughput", pending, candidates, runs, solver, repeats, attempts, notes, clock,
                   throughput)
