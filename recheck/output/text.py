"""The text form of findings and reports.

Static findings are one line each, ruff's ``path:line:col: CODE message``.  Dynamic findings
read like ``torch.testing.assert_close``: a numbered headline, where it happened (region,
invocation, the checkpoint call), the indented detail and the hint.  A report that holds the
same difference for several invocations of a region (a BatchNorm in a block called six
times) shows it once, with the invocations it happened in (``calls 1–6 of 6``) and the first
one's detail in full.

This module imports nothing from recheck at run time (the findings are read by attribute),
so :class:`recheck.findings.Report` can render itself through it.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

if TYPE_CHECKING:  # pragma: no cover
    from recheck.findings import Finding, Invocation, Report

__all__ = ["FIRST_LINE", "format_finding", "format_findings", "format_report", "group",
           "lint_statistics", "lint_summary", "printable", "span"]

#: The first line of a report with dynamic findings.
FIRST_LINE = "recheck: recomputation differs from the original forward"
_INDENT = "      "


_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escaped(character: str) -> str:
    if character in _ESCAPES:
        return _ESCAPES[character]
    code = ord(character)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str) -> str:
    """``text`` (a path from the linted tree) with every control character escaped as
    Python writes it (``\\n``, ``\\x1b``, ``\\u2028``): a file name can never start another
    output line, move the cursor or colour the terminal.  Every text-like renderer (text,
    GitHub workflow commands, a file's error line) shows paths through this."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c == " " else _escaped(c) for c in text)


def span(numbers: Iterable[int]) -> str:
    """``1–3, 5, 7–9`` for 1, 2, 3, 5, 7, 8, 9 (sorted, duplicates dropped)."""
    values = sorted(set(numbers))
    parts: list[str] = []
    start = previous = None
    for value in [*values, None]:
        if value is not None and previous is not None and value == previous + 1:
            previous = value
            continue
        if start is not None:
            parts.append(str(start) if start == previous else f"{start}–{previous}")
        start = previous = value
    return ", ".join(parts)


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _location(invocations: Sequence[Invocation], region: str | None) -> str | None:
    """``in Block.forward (m.py:8), calls 1–6 of 6 (stage=0), checkpointed at train.py:30``."""
    first = invocations[0] if invocations else None
    parts = [f"in {region}"] if region else []
    if first is not None:
        indices = [i.index for i in invocations]
        of = first.of
        if len(invocations) > 1:
            calls = f"calls {span(indices)}" + (f" of {of}" if of else "")
        elif of == 1 and not first.tags and not first.callsite:
            calls = ""  # a single call of a single-call region (recheck.check): nothing to say
        else:
            calls = f"call {first.index}" + (f" of {of}" if of else "")
        tags = _tags([i.tags for i in invocations])
        if calls or tags:
            parts.append(" ".join(p for p in (calls, tags) if p))
        if first.callsite:
            parts.append(f"checkpointed at {first.callsite}")
    return ", ".join(parts) if parts else None


def _tags(all_tags: Sequence[Mapping[str, Any]]) -> str:
    """``(rank=0, microbatch=0–3)``: each label once, with every value the invocations had."""
    keys: list[str] = []
    for tags in all_tags:
        keys.extend(k for k in tags if k not in keys)
    if not keys:
        return ""
    shown = []
    for key in keys:
        values = [t[key] for t in all_tags if key in t]
        distinct = list(dict.fromkeys(values))
        if len(distinct) > 1 and all(isinstance(v, int) and not isinstance(v, bool) for v in distinct):
            shown.append(f"{key}={span(distinct)}")
        else:
            shown.append(f"{key}=" + ", ".join(map(str, distinct)))
    return "(" + ", ".join(shown) + ")"


def format_finding(finding: Finding, number: int | None = None,
                   invocations: Sequence[Invocation] | None = None) -> str:
    """One finding: a headline, then the indented location, detail and hint.

    ``invocations`` lists every invocation a grouped finding happened in (its own when None).
    """
    if finding.kind == "lint":
        return f"{printable(finding.location or '')}: {finding.code} {finding.message}"
    prefix = f"[{number}] " if number is not None else ""
    tag = " (latent)" if finding.latent else ""
    lines = [f"{prefix}{finding.kind}{tag}: {finding.message}"]
    indent = _INDENT if number is not None else "    "
    if invocations is None:
        invocations = [finding.invocation] if finding.invocation is not None else []
    where = _location(invocations, finding.region)
    if where and (number is None or len(invocations) > 1 or invocations and _says_more(invocations[0])):
        lines.append(indent + where)
    for text in finding.detail.splitlines():
        lines.append(indent + text if text else "")
    if finding.hint:
        lines.append(f"{indent}hint: {finding.hint}")
    return "\n".join(lines)


def _says_more(invocation: Invocation) -> bool:
    """An invocation worth a location line: not the only call of a ``check()``'s region."""
    return invocation.of != 1 or bool(invocation.tags) or bool(invocation.callsite)


def _group_key(finding: Finding) -> tuple:
    invocation = finding.invocation
    return (finding.kind, finding.subject, finding.message, finding.code, finding.region,
            finding.latent, finding.hint,
            invocation.callsite if invocation else None, invocation.of if invocation else None)


def group(findings: Iterable[Finding]) -> list[tuple[Finding, list[Invocation]]]:
    """Dynamic findings that differ only by invocation, as (first finding, its invocations).

    The order is that of each group's first finding; the first one's detail is the one shown
    (the bytes of another invocation's difference usually differ too).  Findings whose
    headline differs (another value, another subject) are not folded.
    """
    groups: dict[tuple, tuple[Finding, list[Invocation]]] = {}
    for finding in findings:
        key = _group_key(finding)
        if key not in groups:
            groups[key] = (finding, [])
        if finding.invocation is not None:
            groups[key][1].append(finding.invocation)
    return list(groups.values())


def format_report(report: Report) -> str:
    """The whole report: first line, title, numbered dynamic findings, static lines, notes."""
    dynamic = [f for f in report.findings if f.kind != "lint"]
    static = [f for f in report.findings if f.kind == "lint"]
    lines: list[str] = []
    if dynamic:
        lines.append(f"{FIRST_LINE} ({_plural(len(dynamic), 'difference')})")
    elif not static:
        lines.append("recheck: no difference found")
    if report.title:
        lines.append("")
        lines.extend("  " + t for t in report.title.splitlines())
    for number, (finding, invocations) in enumerate(group(dynamic), 1):
        lines.append("")
        text = format_finding(finding, number, invocations or None)
        lines.extend("  " + t if t else "" for t in text.splitlines())
    for finding in static:
        lines.append(format_finding(finding))
    if report.notes:
        lines.append("")
        lines.extend(f"note: {n}" for n in report.notes)
    return "\n".join(lines)


def format_findings(findings: Sequence[Finding]) -> str:
    """A list of findings as text: static ones a line each, dynamic ones as a report body."""
    static = [format_finding(f) for f in findings if f.kind == "lint"]
    dynamic = [f for f in findings if f.kind != "lint"]
    blocks = [format_finding(f, n, inv or None) for n, (f, inv) in enumerate(group(dynamic), 1)]
    return "\n".join([*static, *blocks])


def unresolved_summary(count: int) -> str:
    """What a run that could not see some regions says about them ("" when it saw them all)."""
    if not count:
        return ""
    sites = "checkpoint call site was" if count == 1 else "checkpoint call sites were"
    return f"{count} {sites} not resolved to a region; `--statistics` lists them"


def lint_summary(findings: Sequence[Finding], errors: Sequence[Any], fixed: int = 0,
                 fixable: frozenset[str] = frozenset(), unresolved: int = 0) -> str:
    """The closing lines of text output (ruff's wording), then the count of checkpoint call
    sites resolved to no region: their hazards were not looked for, whatever the rest says."""
    parts = []
    if fixed:
        parts.append(f"Fixed {_plural(fixed, 'finding')}.")
    if findings:
        count = sum(1 for f in findings if f.code in fixable)
        line = f"Found {_plural(len(findings), 'finding')}"
        line += f" ({count} fixable with `--fix`)." if count else "."
        parts.append(line)
    elif not errors:
        parts.append("All checks passed!")
    kinds = Counter(getattr(error, "kind", "file") for error in errors)
    for kind in sorted(kinds, key=lambda k: (k != "file", k)):  # files, then folders
        parts.append(f"{_plural(kinds[kind], kind)} could not be linted.")
    if unresolved:
        parts.append(unresolved_summary(unresolved))
    return "\n".join(parts)


def lint_statistics(findings: Sequence[Finding], names: Mapping[str, str],
                    fixable: frozenset[str] = frozenset()) -> str:
    """``count  CODE  [*]  rule-name`` per rule, most frequent first (ruff's ``--statistics``)."""
    counts = Counter(f.code for f in findings)
    rows = sorted(counts.items(), key=lambda item: (-item[1], str(item[0])))
    return "\n".join(
        f"{count:>5}\t{code}\t{'[*]' if code in fixable else '   '}\t{names.get(str(code), '')}"
        for code, count in rows)
