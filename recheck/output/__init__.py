"""Rendering findings: one renderer per output format (:mod:`.text`, :mod:`.json`, :mod:`.sarif`,
:mod:`.github`), over any list of findings.

Static findings are placed at their ``path:line:col``, dynamic ones at the checkpoint call of
their invocation (``invocation.callsite``), so a CI annotation lands on the line that checkpoints
the region.  Nothing here imports torch."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Sequence

if TYPE_CHECKING:  # pragma: no cover
    from recheck.findings import Finding

__all__ = ["FORMATS", "FileErrorLike", "render"]

#: The formats every face accepts for a list of findings.
FORMATS = ("text", "json", "sarif", "github")


class FileErrorLike:
    """What the renderers need of an input that could not be read: ``path`` and ``reason``."""

    path: str
    reason: str


def render(fmt: str, findings: Sequence[Finding], errors: Iterable[Any] = (), *,
           root: Path | None = None, version: str = "0", unresolved: Sequence[Any] = ()) -> str:
    """``findings`` (and the ``errors`` of inputs that could not be read) in format ``fmt``.

    ``unresolved``: checkpoint call sites resolved to no region (``path``, ``line``, ``column``,
    ``reason``), a ``note`` notification in SARIF, a ``::notice`` in GitHub; text and JSON leave
    them (and the errors) to the face.
    """
    errors = list(errors)
    if fmt == "json":
        from recheck.output.json import dumps, finding_list

        return dumps(finding_list(findings))
    if fmt == "sarif":
        from recheck.output.json import dumps
        from recheck.output.sarif import sarif_log

        return dumps(sarif_log(findings, errors, root or Path.cwd(), version, unresolved))
    if fmt == "github":
        from recheck.output.github import workflow_commands

        return workflow_commands(findings, errors, unresolved)
    if fmt == "text":
        from recheck.output.text import format_findings

        return format_findings(findings)
    raise ValueError(f"unknown output format {fmt!r}; expected one of {', '.join(FORMATS)}")
