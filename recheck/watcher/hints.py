"""Hints pointing a finding at the rule document that explains its cause."""

from __future__ import annotations

import functools

from recheck.catalogue import RuleDocumentError, get_rule

__all__ = ["hint_for"]


@functools.lru_cache(maxsize=64)
def hint_for(code: str | None) -> str | None:
    """``"see rules/RC106-batchnorm-in-region.md (RC106 batchnorm-in-region)"``, or None.

    None when no code is given or the catalogue has no such rule (yet): a missing
    document must never turn a finding into a crash.  Cached: a finding that recurs at
    every invocation (BatchNorm in train mode) would otherwise read the document each time.
    """
    if code is None:
        return None
    try:
        rule = get_rule(code)
    except (KeyError, FileNotFoundError, RuleDocumentError):
        return None
    return f"see {rule.doc_ref} ({rule.code} {rule.name})"
