"""SARIF 2.1.0: the rule catalogue as descriptors, findings as results, unreadable files as
tool execution notifications."""

from __future__ import annotations

import hashlib
import os
import urllib.parse
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Sequence

from recheck.catalogue import all_rules
from recheck.output.github import place

if TYPE_CHECKING:  # pragma: no cover
    from recheck.findings import Finding

__all__ = ["SARIF_SCHEMA", "sarif_log"]

SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"


def _relative_uri(path: str, root: Path) -> str:
    """``path`` relative to ``root`` as a percent-encoded URI reference, as named (never
    resolved: a file may be a link loop, or swapped for one meanwhile, and its location is
    still where it was named)."""
    try:
        relative = Path(os.path.relpath(os.path.abspath(path), os.path.realpath(root))).as_posix()
    except ValueError:  # another drive
        relative = Path(path).as_posix()
    return urllib.parse.quote(relative, safe="/")


def _physical(path: str, root: Path, **region: Any) -> dict[str, Any]:
    """A SARIF location of ``path`` with the ``region`` fields that are known."""
    physical: dict[str, Any] = {"artifactLocation": {"uri": _relative_uri(path, root), "uriBaseId": "%SRCROOT%"}}
    if region:
        physical["region"] = {k: v for k, v in region.items() if v is not None}
    return {"physicalLocation": physical}


def _location(finding: Finding, root: Path) -> list[dict[str, Any]]:
    path, line = place(finding)
    if path is None:
        return []
    region: dict[str, Any] = {} if line is None else {"startLine": line}
    if finding.kind == "lint":
        region.update(startColumn=finding.column, endLine=finding.end_line, endColumn=finding.end_column)
    return [_physical(path, root, **region)]


def sarif_log(findings: Sequence[Finding], errors: Iterable[Any], root: Path, version: str,
              unresolved: Iterable[Any] = ()) -> dict[str, Any]:
    """The SARIF log of one run; each checkpoint call site in ``unresolved`` (path, line,
    column, reason) is a ``note`` notification: the linter did not see its region."""
    rules = list(all_rules())
    index = {rule.code: i for i, rule in enumerate(rules)}
    descriptors = [{
        "id": rule.code,
        "name": rule.name,
        "shortDescription": {"text": rule.summary},
        "fullDescription": {"text": rule.sections.get("Why it breaks recomputation", rule.summary).strip()},
        "help": {"text": rule.text, "markdown": rule.text},
        "defaultConfiguration": {"level": "warning"},
        "properties": {"tags": ["pytorch", "checkpoint"], "precision": "high"},
    } for rule in rules]
    results = []
    for f in findings:
        where = _location(f, root)
        uri = where[0]["physicalLocation"]["artifactLocation"]["uri"] if where else ""
        fingerprint = hashlib.sha256(f"{f.code}:{f.kind}:{uri}:{f.region}:{f.subject}:{f.message}".encode()).hexdigest()[:32]
        text = f.message if f.kind == "lint" else f"{f.kind}: {f.message}"
        result: dict[str, Any] = {
            "ruleId": f.code or f"recheck.{f.kind}", "level": "warning", "message": {"text": text},
            "locations": where,
            "partialFingerprints": {"recheckFindingHash/v1": fingerprint},
        }
        if f.code in index:
            result["ruleIndex"] = index[f.code]
        results.append(result)
    notifications = [{"level": "error", "message": {"text": e.reason}, "locations": [_physical(e.path, root)]}
                     for e in errors]
    notifications += [{"level": "note",
                       "message": {"text": f"checkpoint call site not resolved to a region: {site.reason}"},
                       "locations": [_physical(site.path, root, startLine=site.line, startColumn=site.column)]}
                      for site in unresolved]
    return {
        "$schema": SARIF_SCHEMA, "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {"name": "recheck", "version": version, "rules": descriptors}},
            "originalUriBaseIds": {"%SRCROOT%": {"uri": root.resolve().as_uri() + "/"}},
            "invocations": [{"executionSuccessful": not errors, "toolExecutionNotifications": notifications}],
            "results": results,
        }],
    }
