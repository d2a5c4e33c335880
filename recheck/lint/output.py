"""Writing findings: text (``path:line:col: CODE message``), json, SARIF 2.1.0, GitHub annotations."""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from pathlib import Path
from typing import Any, Iterable

from recheck.findings import Finding
from recheck.lint.files import FileError
from recheck.lint.rules import FIXABLE

__all__ = ["render", "statistics", "summary"]

SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"


def summary(findings: list[Finding], errors: list[FileError], fixed: int = 0) -> str:
    """The closing line of text output (ruff's wording)."""
    parts = []
    if fixed:
        parts.append(f"Fixed {fixed} finding{'s' if fixed != 1 else ''}.")
    if findings:
        fixable = sum(1 for f in findings if f.code in FIXABLE)
        line = f"Found {len(findings)} finding{'s' if len(findings) != 1 else ''}"
        line += f" ({fixable} fixable with `--fix`)." if fixable else "."
        parts.append(line)
    elif not errors:
        parts.append("All checks passed!")
    if errors:
        parts.append(f"{len(errors)} file{'s' if len(errors) != 1 else ''} could not be linted.")
    return "\n".join(parts)


def statistics(findings: list[Finding]) -> str:
    """``count  CODE  [*]  rule-name`` per rule, most frequent first (ruff's ``--statistics``)."""
    names = _rule_names()
    counts = Counter(f.code for f in findings)
    rows = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    return "\n".join(
        f"{count:>5}\t{code}\t{'[*]' if code in FIXABLE else '   '}\t{names.get(code, '')}" for code, count in rows
    )


def _rule_names() -> dict[str, str]:
    try:
        from recheck.catalogue import all_rules

        return {rule.code: rule.name for rule in all_rules()}
    except (FileNotFoundError, ValueError):
        return {}


def _json_record(finding: Finding) -> dict[str, Any]:
    return {
        "path": finding.path, "line": finding.line, "column": finding.column,
        "end_line": finding.end_line, "end_column": finding.end_column,
        "code": finding.code, "message": finding.message, "region": finding.region,
    }


def _escape_github(text: str, property_value: bool = False) -> str:
    text = text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    return text.replace(":", "%3A").replace(",", "%2C") if property_value else text


def _github(findings: Iterable[Finding]) -> str:
    lines = []
    for f in findings:
        props = (f"file={_escape_github(f.path or '', True)},line={f.line},col={f.column},"
                 f"endLine={f.end_line},endColumn={f.end_column},title={_escape_github(f'recheck ({f.code})', True)}")
        lines.append(f"::warning {props}::{_escape_github(f'{f.code} {f.message}')}")
    return "\n".join(lines)


def _sarif(findings: list[Finding], errors: list[FileError], root: Path, version: str) -> dict[str, Any]:
    from recheck.catalogue import all_rules

    rules = [r for r in all_rules() if r.static]
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
        uri = _relative_uri(f.path or "", root)
        fingerprint = hashlib.sha256(f"{f.code}:{uri}:{f.region}:{f.message}".encode()).hexdigest()[:32]
        result: dict[str, Any] = {
            "ruleId": f.code, "level": "warning", "message": {"text": f.message},
            "locations": [{"physicalLocation": {
                "artifactLocation": {"uri": uri, "uriBaseId": "%SRCROOT%"},
                "region": {"startLine": f.line, "startColumn": f.column,
                           "endLine": f.end_line, "endColumn": f.end_column}}}],
            "partialFingerprints": {"recheckFindingHash/v1": fingerprint},
        }
        if f.code in index:
            result["ruleIndex"] = index[f.code]
        results.append(result)
    notifications = [{"level": "error", "message": {"text": e.reason},
                      "locations": [{"physicalLocation": {"artifactLocation": {"uri": _relative_uri(e.path, root), "uriBaseId": "%SRCROOT%"}}}]}
                     for e in errors]
    return {
        "$schema": SARIF_SCHEMA, "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {"name": "recheck", "version": version, "rules": descriptors}},
            "originalUriBaseIds": {"%SRCROOT%": {"uri": root.resolve().as_uri() + "/"}},
            "invocations": [{"executionSuccessful": not errors, "toolExecutionNotifications": notifications}],
            "results": results,
        }],
    }


def _relative_uri(path: str, root: Path) -> str:
    try:
        return Path(os.path.relpath(Path(path).resolve(), root.resolve())).as_posix()
    except ValueError:
        return Path(path).as_posix()


def render(kind: str, findings: list[Finding], errors: list[FileError], *, root: Path, version: str = "0") -> str:
    """The findings as text, json, sarif or github annotations (text has no summary line; see :func:`summary`)."""
    if kind == "json":
        return json.dumps([_json_record(f) for f in findings], indent=2)
    if kind == "sarif":
        return json.dumps(_sarif(findings, errors, root, version), indent=2)
    if kind == "github":
        return _github(findings)
    return "\n".join(f"{f.path}:{f.line}:{f.column}: {f.code} {f.message}" for f in findings)
