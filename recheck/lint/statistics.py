"""``recheck lint --statistics``: counts per rule, and what the run read and resolved.

Text (ruff's ``count  CODE  [*]  name`` table, then the run's counters) or one JSON
object.  A user whose hazard is not flagged can see here whether its file was analysed,
and whether the checkpoint call that should reach it resolved to a region (and if not,
why not).
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from recheck.findings import Finding
from recheck.lint.engine import LintResult
from recheck.lint.rules import FIXABLE

__all__ = ["statistics_json", "statistics_text"]


def _rule_names() -> dict[str, str]:
    try:
        from recheck.catalogue import all_rules

        return {rule.code: rule.name for rule in all_rules()}
    except (FileNotFoundError, ValueError):
        return {}


def _rules(findings: list[Finding]) -> list[dict[str, Any]]:
    names = _rule_names()
    counts = Counter(f.code for f in findings)
    return [{"code": code, "name": names.get(code, ""), "count": count, "fixable": code in FIXABLE}
            for code, count in sorted(counts.items(), key=lambda item: (-item[1], item[0]))]


def statistics_json(result: LintResult, findings: list[Finding]) -> str:
    """The statistics as one JSON object (``rules`` most frequent first, then the counters)."""
    stats = result.stats
    document = {
        "rules": _rules(findings),
        "findings": len(findings),
        "files": stats.get("files", 0),
        "files_analysed": stats.get("indexed", 0),
        "files_parse_checked_only": stats.get("syntax_only", 0),
        "files_with_errors": len(result.errors),
        "files_from_cache": stats.get("cached", 0),
        "regions": stats.get("regions", 0),
    }
    return json.dumps(document, indent=2)


def statistics_text(result: LintResult, findings: list[Finding]) -> str:
    """ruff's per-rule table, then what was read."""
    lines = [f"{r['count']:>5}\t{r['code']}\t{'[*]' if r['fixable'] else '   '}\t{r['name']}" for r in _rules(findings)]
    stats = result.stats
    lines.append(
        f"files: {stats.get('files', 0)} linted; {stats.get('indexed', 0)} analysed, "
        f"{stats.get('syntax_only', 0)} only parse-checked (the pre-filter found no checkpoint text in them "
        f"and no region reaches them); {len(result.errors)} could not be linted"
    )
    lines.append(f"regions: {stats.get('regions', 0)}")
    return "\n".join(lines)
