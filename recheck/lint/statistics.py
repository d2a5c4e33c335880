"""``recheck lint --statistics`` and ``--show-regions``: what the run read and resolved.

Text (ruff's ``count  CODE  [*]  name`` table, then the run's counters) or one JSON
object.  A user whose hazard is not flagged can see here whether its file was analysed,
and whether the checkpoint call that should reach it resolved to a region (and if not,
why not).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from recheck.findings import Finding
from recheck.lint.engine import LintResult
from recheck.lint.rules import FIXABLE

__all__ = ["show_regions", "statistics_json", "statistics_text"]


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
        "call_sites": stats.get("call_sites", 0),
        "resolved_sites": stats.get("resolved_sites", 0),
        "wrapper_sites": stats.get("wrapper_sites", 0),
        "functions_walked": stats.get("functions_walked", 0),
        "unresolved": [{"path": r.path, "line": r.line, "column": r.column, "entry": r.entry,
                        "region": r.region_source, "reason": r.reason}
                       for r in result.sites if r.kind == "site" and not r.regions],
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
    sites, resolved = stats.get("call_sites", 0), stats.get("resolved_sites", 0)
    lines.append(f"checkpoint call sites: {sites} found, {resolved} resolved to a region; "
                 f"{stats.get('wrapper_sites', 0)} more inside wrappers (their callers name the region); "
                 f"{stats.get('regions', 0)} regions, {stats.get('functions_walked', 0)} functions walked")
    unresolved = [r for r in result.sites if r.kind == "site" and not r.regions]
    if unresolved:
        lines.append("unresolved call sites:")
        lines += [f"  {r.path}:{r.line}:{r.column}: `{r.entry.rsplit('.', 1)[-1]}`: {r.reason}" for r in unresolved]
    return "\n".join(lines)


def _under(path: str, folder: str) -> bool:
    shown, wanted = Path(path).as_posix(), Path(folder).as_posix().rstrip("/")
    return wanted in ("", ".") or shown == wanted or shown.startswith(wanted + "/")


def show_regions(result: LintResult, where: str) -> str:
    """Every checkpoint call site under ``where`` and the regions it resolved to:
    ``path:line:col: entry(region) -> Region.forward (file:line), ...``, a wrapper's
    parameter, or ``unresolved: <reason>``."""
    lines = []
    for site in result.sites:
        if not _under(site.path, where):
            continue
        head = f"{site.path}:{site.line}:{site.column}: {site.entry.rsplit('.', 1)[-1]}({site.region_source})"
        if site.regions:
            lines.append(f"{head} -> {', '.join(site.regions)}")
        elif site.kind == "wrapper":
            lines.append(f"{head} -> a wrapper: {site.reason}")
        else:
            lines.append(f"{head} -> unresolved: {site.reason}")
    return "\n".join(lines) if lines else f"no checkpoint call sites under {where}"
