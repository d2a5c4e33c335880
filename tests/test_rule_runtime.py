"""Each rule document's runnable example, through the dynamic checker.

A document whose *Example* defines ``region_example()`` (returning ``(fn, args)`` or
``(fn, args, kwargs)``, with optional ``CHECK_OPTIONS = {"region_example": {...}}`` as in the
zoo) must be found by ``recheck.check`` with one of the kinds its *Found at run time as* section
names; the region of its *Use instead* section must check clean.
"""

from __future__ import annotations

import types
from typing import Any

import pytest

import recheck
from source_modules import exec_source
from recheck.catalogue import Rule, all_rules



def _runnable(sources: list[str]) -> str | None:
    """The first source block that defines ``region_example``."""
    return next((s for s in sources if "def region_example(" in s), None)


RUNNABLE = [rule for rule in all_rules() if _runnable(rule.examples)]

#: Documents whose Example shows its hazard only with an accelerator; their "Known limits"
#: promise that on a CPU-only machine the move is a no-op and the check is clean.
NEEDS_ACCELERATOR = {"RC102"}


def _has_accelerator() -> bool:
    import torch

    accelerator = getattr(torch, "accelerator", None)
    return bool(accelerator is not None and accelerator.is_available())


def _exec(source: str, label: str) -> types.ModuleType:
    """Execute a document's block as a real module (inspect, dataclasses and pickle work)."""
    return exec_source(source, label, prefix="recheck_rule_example")


def _check_block(source: str, label: str) -> recheck.Report:
    module = _exec(source, label)
    built = module.region_example()
    fn, args = built[0], built[1]
    kwargs: dict[str, Any] = built[2] if len(built) > 2 else {}
    options = getattr(module, "CHECK_OPTIONS", {}).get("region_example", {})
    return recheck.check(fn, *args, kwargs=kwargs, **options)


def test_documents_with_runnable_examples_exist() -> None:
    assert len(RUNNABLE) >= 5, [r.code for r in RUNNABLE]


@pytest.mark.parametrize("rule", RUNNABLE, ids=[r.code for r in RUNNABLE])
def test_example_is_found_with_a_documented_kind(rule: Rule) -> None:
    assert rule.runtime_kinds, f"{rule.doc_ref} names no kind under 'Found at run time as'"
    report = _check_block(_runnable(rule.examples), f"{rule.doc_ref} Example")
    if rule.code in NEEDS_ACCELERATOR and not _has_accelerator():
        assert report.ok, f"{rule.doc_ref} promises a clean check without an accelerator\n{report}"
        return
    assert report.kinds & set(rule.runtime_kinds), (
        f"{rule.doc_ref} documents {rule.runtime_kinds}; the check found {sorted(report.kinds)}\n"
        f"{report}")


@pytest.mark.parametrize("rule", RUNNABLE, ids=[r.code for r in RUNNABLE])
def test_use_instead_is_clean(rule: Rule) -> None:
    source = _runnable(rule.clean_examples)
    assert source is not None, f"{rule.doc_ref}: 'Use instead' defines no region_example()"
    report = _check_block(source, f"{rule.doc_ref} Use instead")
    assert report.ok, f"{rule.doc_ref} Use instead:\n{report}"
