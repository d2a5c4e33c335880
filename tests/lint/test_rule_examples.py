"""Every rule document's *Example* is flagged with its code; its *Use instead* is clean."""

from __future__ import annotations

import pytest

from recheck.catalogue import all_rules
from recheck.lint.engine import lint_sources
from recheck.lint.rules import ALL_CODES

STATIC_RULES = [rule for rule in all_rules() if rule.static]


def test_every_static_rule_has_a_linter_rule():
    assert sorted(r.code for r in STATIC_RULES) == sorted(ALL_CODES)


@pytest.mark.parametrize("rule", STATIC_RULES, ids=lambda r: r.code)
def test_example_is_flagged(rule):
    assert rule.examples, f"{rule.doc_ref} has no Example block"
    for source in rule.examples:
        result = lint_sources({"example.py": source})
        assert not result.errors
        assert rule.code in {f.code for f in result.findings}, "\n".join(f.format() for f in result.findings)


@pytest.mark.parametrize("rule", STATIC_RULES, ids=lambda r: r.code)
def test_use_instead_is_clean(rule):
    assert rule.clean_examples, f"{rule.doc_ref} has no Use instead block"
    for source in rule.clean_examples:
        result = lint_sources({"clean.py": source})
        assert not result.errors
        assert result.findings == [], "\n".join(f.format() for f in result.findings)
