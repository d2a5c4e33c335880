"""Property tests: random region programs with planted hazards (see ``region_programs.py``).

Every planted hazard is found with its kind, nothing outside the planted hazards' kinds is
reported, and programs without hazards check clean; in both checkpoint variants, for modules and
closures alike.
"""

from __future__ import annotations

import inspect
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from region_programs import HAZARDS, Program, Statement, programs

SETTINGS = settings(max_examples=30, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])


def _kinds_text(report) -> str:
    return f"kinds {sorted(report.kinds)}\n{report}"


@SETTINGS
@given(program=programs(hazards=True), use_reentrant=st.booleans())
def test_planted_hazards_are_found_with_their_kinds(program, use_reentrant, check) -> None:
    fn, args, _ = program.build()
    report = check(fn, *args, use_reentrant=use_reentrant, **program.options)
    required = program.required_kinds(use_reentrant)
    assert required <= report.kinds, (
        f"missing {sorted(required - report.kinds)}; " + _kinds_text(report))
    assert report.kinds <= program.allowed_kinds(), (
        f"unrelated {sorted(report.kinds - program.allowed_kinds())}; " + _kinds_text(report))


@settings(SETTINGS, max_examples=20)
@given(program=programs(hazards=False), use_reentrant=st.booleans())
def test_programs_without_hazards_check_clean(program, use_reentrant, check) -> None:
    fn, args, _ = program.build()
    report = check(fn, *args, use_reentrant=use_reentrant)
    assert report.ok, _kinds_text(report)


@pytest.mark.parametrize("use_reentrant", [False, True])
@pytest.mark.parametrize("form", ["module", "closure"])
@pytest.mark.parametrize("hazard", sorted(HAZARDS))
def test_each_hazard_alone(hazard: str, form: str, use_reentrant: bool, check) -> None:
    """Each statement of the grammar, planted alone after a linear layer and before a tanh."""
    program = Program([Statement("linear"), Statement(hazard), Statement("activation")], form,
                      frozenset({hazard}))
    fn, args, _ = program.build()
    report = check(fn, *args, use_reentrant=use_reentrant, **program.options)
    assert HAZARDS[hazard][0] <= report.kinds <= program.allowed_kinds(), _kinds_text(report)


def test_program_source_is_inspectable() -> None:
    """The compiled code is visible to ``inspect`` (the checker names regions by file:line)."""
    program = Program([Statement("linear"), Statement("counter")], "closure", frozenset({"counter"}))
    fn, _, module = program.build()
    assert "state.calls += 1" in inspect.getsource(fn)
    assert sys.modules[module.__name__] is module


def test_the_properties_reject_a_checker_that_misses_or_invents() -> None:
    """The two properties have teeth: a checker that finds nothing fails the first, one that
    always reports a finding fails the second."""
    from recheck.findings import Finding, Report

    def finds_nothing(fn, *args, **options):
        return Report()

    def always_finds(fn, *args, **options):
        return Report([Finding("state", "invented")])

    planted = Program([Statement("linear"), Statement("counter")], "module", frozenset({"counter"}))
    safe = Program([Statement("linear"), Statement("dropout")], "closure")
    with pytest.raises(AssertionError, match="missing"):
        test_planted_hazards_are_found_with_their_kinds.hypothesis.inner_test(
            program=planted, use_reentrant=False, check=finds_nothing)
    with pytest.raises(AssertionError, match="unrelated"):
        test_planted_hazards_are_found_with_their_kinds.hypothesis.inner_test(
            program=planted, use_reentrant=True,
            check=lambda fn, *args, **options: Report([Finding("state", "counted twice"),
                                                       Finding("buffer", "invented")]))
    with pytest.raises(AssertionError):
        test_programs_without_hazards_check_clean.hypothesis.inner_test(
            program=safe, use_reentrant=False, check=always_finds)
