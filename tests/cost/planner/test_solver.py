"""Both solvers find the optimum brute force finds, on random small problems; and say when nothing fits."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from recheck.cost.planner import solver as solver_module
from recheck.cost.planner.memory_model import Problem, Row
from recheck.cost.planner.solver import Infeasible, SolverLimit, smallest_peak, solve
from recheck.dependencies import MissingDependency

pytest.importorskip("scipy", reason="the milp half of these tests needs scipy (in the test extra)")


@st.composite
def problems(draw):
    n = draw(st.integers(1, 5))
    variants = [("none",) + tuple(f"v{i}" for i in range(draw(st.integers(1, 3)))) for _ in range(n)]
    seconds = [[0.0] + [draw(st.integers(1, 40)) / 1000 for _ in v[1:]] for v in variants]
    pairs = [(c, v) for c in range(n) for v in range(len(variants[c]))]
    groups = []
    if n > 1:
        for _ in range(draw(st.integers(0, 2))):
            chosen = draw(st.lists(st.sampled_from(pairs), min_size=2, max_size=4, unique=True))
            if len({c for c, _ in chosen}) > 1:
                groups.append(tuple(sorted(chosen)))
    rows = []
    for r in range(draw(st.integers(1, 4))):
        row = Row(("window", r, r), draw(st.integers(0, 100)))
        for pair in draw(st.lists(st.sampled_from(pairs), max_size=6, unique=True)):
            row.terms[pair] = draw(st.integers(0, 60))
        for g in range(len(groups)):
            if draw(st.booleans()):
                row.groups[g] = draw(st.integers(0, 60))
        rows.append(row)
    tied = []
    if n > 1 and draw(st.booleans()):
        a, b = sorted(draw(st.lists(st.integers(0, n - 1), min_size=2, max_size=2, unique=True)))
        tied.append(((a, draw(st.integers(0, len(variants[a]) - 1))), (b, draw(st.integers(0, len(variants[b]) - 1)))))
    return Problem(variants, seconds, rows, groups, tied)


def brute_force(problem: Problem, budget: float):
    feasible = []
    for choice in itertools.product(*(range(len(v)) for v in problem.variants)):
        choice = list(choice)
        if problem.consistent(choice) and max(problem.memory(choice)) <= budget:
            feasible.append((problem.time(choice), choice))
    return min(feasible, default=None)


def least_peak(problem: Problem) -> int:
    return min(max(problem.memory(list(c))) for c in itertools.product(*(range(len(v)) for v in problem.variants))
               if problem.consistent(list(c)))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=problems(), budget=st.integers(0, 400))
def test_milp_and_branch_and_bound_find_the_brute_force_optimum(problem, budget):
    best = brute_force(problem, budget)
    for method in ("milp", "branch-and-bound"):
        if best is None:
            with pytest.raises(Infeasible) as caught:
                solve(problem, budget, method=method)
            assert caught.value.smallest == least_peak(problem) > budget
            continue
        solution = solve(problem, budget, method=method)
        assert problem.consistent(list(solution.choice))
        assert solution.peak == max(problem.memory(list(solution.choice))) <= budget
        assert math.isclose(solution.seconds, best[0], rel_tol=1e-9, abs_tol=1e-12), method


@settings(max_examples=60, deadline=None)
@given(problem=problems())
def test_the_smallest_peak_is_the_least_any_plan_reaches(problem):
    assert smallest_peak(problem, method="milp") == smallest_peak(problem, method="branch-and-bound") \
        == least_peak(problem)


def test_of_plans_equally_fast_the_one_checkpointing_less_wins():
    problem = Problem([("none", "full"), ("none", "full")], [[0.0, 0.0], [0.0, 0.0]],
                      [Row(("w", 0, 0), 0, {(0, 0): 5, (1, 0): 5})], [], [])
    for method in ("milp", "branch-and-bound"):
        assert solve(problem, 100, method=method).choice == (0, 0)
        assert sorted(solve(problem, 7, method=method).choice) == [0, 1]


def test_the_exact_search_says_to_install_scipy_when_it_runs_out_of_nodes(monkeypatch):
    monkeypatch.setattr(solver_module, "NODE_LIMIT", 10)
    variants = [("none", "full", "selective")] * 8
    problem = Problem(variants, [[0.0, 0.003, 0.002]] * 8,
                      [Row(("w", 0, 0), 0, {(c, v): 10 - 3 * v for c in range(8) for v in range(3)})], [], [])
    with pytest.raises(SolverLimit, match=r"install scipy \(pip install 'recheck\[plan\]'\)"):
        solve(problem, 60, method="branch-and-bound")


def test_milp_without_scipy_says_how_to_get_it(monkeypatch):
    monkeypatch.setattr(solver_module, "have_scipy", lambda: False)
    problem = Problem([("none", "full")], [[0.0, 1.0]], [Row(("w", 0, 0), 0)], [], [])
    with pytest.raises(MissingDependency, match=r"pip install 'recheck\[plan\]'"):
        solve(problem, 1, method="milp")
    assert solve(problem, 1).method == "branch-and-bound"  # the default falls back, exactly


def test_an_unknown_solver_is_refused():
    with pytest.raises(ValueError, match="unknown solver 'greedy'"):
        solve(Problem([("none",)], [[0.0]], [], [], []), 1, method="greedy")
