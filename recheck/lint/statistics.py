"""``recheck lint --statistics`` and ``--show-regions``: what the run read and resolved.

The counters follow ruff's per-rule table (rendered by :mod:`recheck.output`) in text,
and sit beside its rows in the JSON object.  A user whose hazard is not flagged can see
here whether its file was analysed, and whether the checkpoint call that should reach it
resolved to a region (and if not, why not).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from recheck.lint.engine import LintResult
from recheck.lint.regions import SiteReport
from recheck.output.text import printable

__all__ = ["run_statistics", "run_statistics_text", "show_regions", "unresolved_sites"]


def unresolved_sites(result: LintResult) -> list[SiteReport]:
    """The checkpoint call sites resolved to no region (wrappers' own calls left out: their
    callers name the region), in order: every output format says them."""
    return [r for r in result.sites if r.kind == "site" and not r.regions]


def run_statistics(result: LintResult) -> dict[str, Any]:
    """What the run read and resolved, as data: file counts, call sites found, resolved and
    inside wrappers, regions, functions walked, and every unresolved site with its reason."""
    stats = result.stats
    return {
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
        "assumed": list(result.assumed),
        "unresolved": [{"path": r.path, "line": r.line, "column": r.column, "entry": r.entry,
                        "region": r.region_source, "reason": r.reason}
                       for r in unresolved_sites(result)],
    }


def run_statistics_text(result: LintResult) -> str:
    """:func:`run_statistics` as the lines that follow ruff's per-rule table."""
    data = run_statistics(result)
    lines = [
        f"files: {data['files']} linted; {data['files_analysed']} analysed, {data['files_parse_checked_only']} "
        f"only parse-checked (the pre-filter found no checkpoint text in them and no region reaches them); "
        f"{data['files_with_errors']} could not be linted",
        f"checkpoint call sites: {data['call_sites']} found, {data['resolved_sites']} resolved to a region; "
        f"{data['wrapper_sites']} more inside wrappers (their callers name the region); "
        f"{data['regions']} regions, {data['functions_walked']} functions walked",
    ]
    lines += [printable(f"note: {line}") for line in data["assumed"]]
    if data["unresolved"]:
        lines.append("unresolved call sites:")
        lines += [printable(f"  {u['path']}:{u['line']}:{u['column']}: `{u['entry'].rsplit('.', 1)[-1]}`: "
                            f"{u['reason']}") for u in data["unresolved"]]
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
    return "\n".join(map(printable, lines)) if lines else f"no checkpoint call sites under {printable(where)}"
