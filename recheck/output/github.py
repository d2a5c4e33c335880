"""GitHub Actions workflow commands: one ``::warning`` per finding, ``::error`` per unreadable file.

Static findings are placed at their span; dynamic ones at the checkpoint call of their
invocation (``path:line``), so the annotation lands on the line that checkpoints the region.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Sequence

from recheck.output.text import printable

if TYPE_CHECKING:  # pragma: no cover
    from recheck.findings import Finding

__all__ = ["escape", "place", "workflow_commands"]


def escape(text: str, property_value: bool = False) -> str:
    """Escape a message (or, with ``property_value``, a property) of a workflow command."""
    text = text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    return text.replace(":", "%3A").replace(",", "%2C") if property_value else text


def place(finding: Finding) -> tuple[str | None, int | None]:
    """Where a finding belongs: its own path and line, or its checkpoint call's."""
    if finding.path is not None:
        return finding.path, finding.line
    callsite = finding.invocation.callsite if finding.invocation is not None else None
    if callsite:
        path, _, line = callsite.rpartition(":")
        if path and line.isdigit():
            return path, int(line)
    return None, None


def _annotation(finding: Finding) -> str:
    path, line = place(finding)
    props = []
    if path is not None:
        props.append(f"file={escape(printable(path), True)}")
        if line is not None:
            props.append(f"line={line}")
    if finding.kind == "lint":
        props += [f"col={finding.column}", f"endLine={finding.end_line}", f"endColumn={finding.end_column}"]
        message = f"{finding.code} {finding.message}"
    else:
        message = f"{finding.kind}: {finding.message}" + (f" [{finding.code}]" if finding.code else "")
        if finding.region:
            message += f" (in {finding.region})"
    title = f"recheck ({finding.code})" if finding.code else f"recheck ({finding.kind})"
    props.append(f"title={escape(title, True)}")
    return f"::warning {','.join(props)}::{escape(message)}"


def workflow_commands(findings: Sequence[Finding], errors: Iterable[Any] = (), unresolved: Iterable[Any] = ()) -> str:
    """The workflow commands for ``findings``, for the inputs in ``errors`` (path, reason),
    and a ``::notice`` for each checkpoint call site in ``unresolved`` (path, line, column,
    reason): the linter did not see its region."""
    lines = [_annotation(f) for f in findings]
    for site in unresolved:
        title = escape("recheck: checkpoint call not resolved to a region", True)
        lines.append(f"::notice file={escape(printable(str(site.path)), True)},line={site.line},col={site.column},"
                     f"title={title}::{escape(str(site.reason))}")
    for error in errors:
        title = f"recheck: {getattr(error, 'kind', 'file')} not linted"
        lines.append(f"::error file={escape(printable(str(error.path)), True)},"
                     f"title={escape(title, True)}::{escape(str(error.reason))}")
    return "\n".join(lines)
