"""Solve a :class:`~recheck.cost.planner.memory_model.Problem`: the fastest plan within a budget.

Two exact solvers of the same 0-1 program (one variant per candidate, every window's memory at
most the budget, a storage several candidates hold counted once):

* ``scipy.optimize.milp`` (HiGHS) when scipy is installed (``pip install 'recheck[plan]'``);
* otherwise a depth-first branch and bound, exact as well: every memory coefficient is
  non-negative, so a partial plan whose windows already exceed the budget (counting, for each
  candidate still open, its smallest contribution) is cut, and so is one that cannot be faster
  than the best plan found.  It stops after :data:`NODE_LIMIT` nodes and says to install scipy.

:func:`smallest_peak` answers "what is the least memory any plan needs" (for the message
when nothing fits the budget).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from recheck.cost.planner.memory_model import Problem

__all__ = ["NODE_LIMIT", "Infeasible", "Solution", "SolverLimit", "have_scipy", "method_of", "smallest_peak", "solve"]

#: Nodes the branch and bound visits before it gives up (a few seconds of Python).
NODE_LIMIT = 2_000_000
#: Added per checkpointed candidate (relative to the dearest variant) so that, of plans equally
#: fast, the one checkpointing less wins.
_TIE = 1e-7
_KNIFE_EDGE: list[int] = []


class Infeasible(ValueError):
    """No plan fits the budget; ``smallest`` is the least peak any plan reaches (bytes)."""

    def __init__(self, budget: int, smallest: int) -> None:
        super().__init__(f"no plan fits {budget} bytes; the smallest peak of any plan is {smallest} bytes")
        self.budget, self.smallest = budget, smallest


class SolverLimit(RuntimeError):
    """The branch and bound ran out of nodes (install scipy for ``milp``)."""


@dataclass(frozen=True)
class Solution:
    """One variant index per candidate, with its time (seconds added), peak and how it was found."""

    choice: tuple[int, ...]
    seconds: float
    peak: int
    method: str


def have_scipy() -> bool:
    try:
        import scipy.optimize  # noqa: F401
    except ImportError:
        return False
    return True


def method_of(method: str | None) -> str:
    """The solver ``method`` names (None: milp when scipy is installed); MissingDependency for milp without scipy."""
    if method == "milp" and not have_scipy():
        from recheck.dependencies import MissingDependency

        raise MissingDependency("the milp solver needs scipy (scipy.optimize.milp), which is not installed: "
                                "pip install 'recheck[plan]', or use the exact branch and bound "
                                "(solver=\"branch-and-bound\")", name="scipy")
    return method or ("milp" if have_scipy() else "branch-and-bound")


def solve(problem: Problem, budget: int, *, method: str | None = None) -> Solution:
    """The fastest plan with every window within ``budget``; :class:`Infeasible` when none is.

    ``method`` is ``"milp"``, ``"branch-and-bound"`` or None (milp when scipy is there).
    """
    method = method_of(method)
    if method == "milp":
        choice = _milp(problem, budget, peak=False)
        if choice is _KNIFE_EDGE:  # HiGHS' tolerance let a row exceed the budget by a hair
            choice, method = _branch_and_bound(problem, budget, peak=False), "branch-and-bound"
    elif method == "branch-and-bound":
        choice = _branch_and_bound(problem, budget, peak=False)
    else:
        raise ValueError(f"unknown solver {method!r}")
    if choice is None:
        raise Infeasible(budget, smallest_peak(problem, method=method))
    return Solution(tuple(choice), problem.time(choice), max(problem.memory(choice), default=0), method)


def smallest_peak(problem: Problem, *, method: str | None = None) -> int:
    """The least peak any plan reaches."""
    method = method_of(method)
    choice = _milp(problem, 0, peak=True) if method == "milp" else _branch_and_bound(problem, math.inf, peak=True)
    assert choice is not None
    return max(problem.memory(choice), default=0)


# -- scipy.optimize.milp ---------------------------------------------------------------------------


def _milp(problem: Problem, budget: float, *, peak: bool) -> list[int] | None:
    """The optimum by HiGHS; None when infeasible, :data:`_KNIFE_EDGE` when its answer breaks a row
    by less than HiGHS' tolerance (the caller then asks the exact branch and bound)."""
    import numpy as np
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import lil_array

    offsets, n = [], 0
    for variants in problem.variants:
        offsets.append(n)
        n += len(variants)
    x_count, z_count = n, len(problem.groups)
    total = x_count + z_count + (1 if peak else 0)
    rows: list[tuple[dict[int, float], float, float]] = []
    coefficients: dict[int, float]
    for c, variants in enumerate(problem.variants):
        rows.append(({offsets[c] + v: 1.0 for v in range(len(variants))}, 1.0, 1.0))
    for (a, va), (b, vb) in problem.tied:
        rows.append(({offsets[a] + va: 1.0, offsets[b] + vb: -1.0}, 0.0, 0.0))
    for g, group in enumerate(problem.groups):
        for d in sorted({c for c, _ in group}):
            covers: dict[int, float] = {x_count + g: 1.0}
            for c, v in group:
                if c == d:
                    covers[offsets[c] + v] = -1.0
            rows.append((covers, 0.0, math.inf))
    scale = float(budget) if not peak and budget > 0 else float(max(
        (row.constant + sum(row.terms.values()) + sum(row.groups.values()) for row in problem.rows), default=1) or 1)
    for row in problem.rows:
        coefficients = {}
        for (c, v), k in row.terms.items():
            coefficients[offsets[c] + v] = coefficients.get(offsets[c] + v, 0.0) + k / scale
        for g, k in row.groups.items():
            coefficients[x_count + g] = coefficients.get(x_count + g, 0.0) + k / scale
        if peak:
            coefficients[total - 1] = -1.0
            rows.append((coefficients, -math.inf, -row.constant / scale))
        else:
            rows.append((coefficients, -math.inf, (budget - row.constant) / scale))
    matrix = lil_array((len(rows), total))
    lower, upper = np.empty(len(rows)), np.empty(len(rows))
    for i, (entries, lo, hi) in enumerate(rows):
        for j, value in entries.items():
            matrix[i, j] = value
        lower[i], upper[i] = lo, hi
    # both sides scaled to about 1 (seconds by the dearest variant, bytes by the budget or the
    # largest row), so that HiGHS' absolute tolerances mean the same on any step
    objective = np.zeros(total)
    if peak:
        objective[total - 1] = 1.0
    else:
        dearest = max((s for seconds in problem.seconds for s in seconds), default=0.0) or 1.0
        for c, seconds in enumerate(problem.seconds):
            for v, s in enumerate(seconds):
                objective[offsets[c] + v] = s / dearest + (_TIE if problem.variants[c][v] != "none" else 0.0)
    integrality = np.zeros(total)
    integrality[:x_count] = 1
    high = np.ones(total)
    if peak:
        high[total - 1] = np.inf
    result = milp(objective, constraints=LinearConstraint(matrix.tocsr(), lower, upper),
                  integrality=integrality, bounds=Bounds(np.zeros(total), high), options={"mip_rel_gap": 0.0})
    if result.x is None:
        return None
    choice = []
    for c, variants in enumerate(problem.variants):
        values = result.x[offsets[c]:offsets[c] + len(variants)]
        choice.append(int(np.argmax(values)))
    if not peak and (not problem.consistent(choice) or max(problem.memory(choice), default=0) > budget):
        return _KNIFE_EDGE
    return choice


# -- branch and bound --------------------------------------------------------------------------


def _branch_and_bound(problem: Problem, budget: float, *, peak: bool) -> list[int] | None:
    n = len(problem.variants)
    rows = problem.rows
    effects: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for r, row in enumerate(rows):
        for pair, k in row.terms.items():
            effects.setdefault(pair, []).append((r, k))
    group_rows = [[(r, row.groups[g]) for r, row in enumerate(rows) if g in row.groups] for g in range(len(problem.groups))]
    groups_of: dict[tuple[int, int], list[int]] = {}
    for g, group in enumerate(problem.groups):
        for pair in group:
            groups_of.setdefault(pair, []).append(g)
    ties: dict[int, list[tuple[int, int, int]]] = {}
    for (a, va), (b, vb) in problem.tied:  # checked when the later of the two is chosen
        ties.setdefault(max(a, b), []).append((a, va, vb) if a < b else (b, vb, va))
    # the least each row can still gain from the candidates from k on
    rest = [[0] * (n + 1) for _ in rows]
    for r, row in enumerate(rows):
        for c in range(n - 1, -1, -1):
            least = min(row.terms.get((c, v), 0) for v in range(len(problem.variants[c])))
            rest[r][c] = rest[r][c + 1] + least
    dearest = max((s for seconds in problem.seconds for s in seconds), default=0.0) or 1.0

    def cost(c: int, v: int) -> float:
        return problem.seconds[c][v] / dearest + (_TIE if problem.variants[c][v] != "none" else 0.0)

    fastest = [min(cost(c, v) for v in range(len(problem.variants[c]))) for c in range(n)]
    rest_time = [0.0] * (n + 1)
    for c in range(n - 1, -1, -1):
        rest_time[c] = rest_time[c + 1] + fastest[c]
    memory = [row.constant for row in rows]
    on = [0] * len(problem.groups)
    choice = [0] * n
    best: list[float | list[int] | None] = [math.inf, None]
    nodes = [0]

    def visit(c: int, spent: float) -> None:
        nodes[0] += 1
        if nodes[0] > NODE_LIMIT:
            raise SolverLimit(f"the exact search stopped after {NODE_LIMIT:,} nodes; install scipy "
                              "(pip install 'recheck[plan]') to solve this plan with scipy.optimize.milp")
        bound = max((memory[r] + rest[r][c] for r in range(len(rows))), default=0)
        if bound > budget:
            return
        if peak:
            if bound >= best[0]:  # type: ignore[operator]
                return
        elif spent + rest_time[c] >= best[0]:  # type: ignore[operator]
            return
        if c == n:
            best[0], best[1] = (bound if peak else spent), list(choice)
            return
        options = sorted(range(len(problem.variants[c])), key=lambda v: cost(c, v))
        for v in options:
            if any((choice[a] == va) != (v == vc) for a, va, vc in ties.get(c, ())):
                continue
            choice[c] = v
            pair = (c, v)
            for r, k in effects.get(pair, ()):
                memory[r] += k
            lit = []
            for g in groups_of.get(pair, ()):
                on[g] += 1
                if on[g] == 1:
                    lit.append(g)
                    for r, k in group_rows[g]:
                        memory[r] += k
            visit(c + 1, spent + cost(c, v))
            for g in groups_of.get(pair, ()):
                on[g] -= 1
            for g in lit:
                for r, k in group_rows[g]:
                    memory[r] -= k
            for r, k in effects.get(pair, ()):
                memory[r] -= k
        choice[c] = 0

    visit(0, 0.0)
    return best[1]  # type: ignore[return-value]
