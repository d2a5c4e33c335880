"""The text form of findings and reports, the one text renderer of every face.

Static findings are ruff's ``path:line:col: CODE message``.  Dynamic ones read like
``torch.testing.assert_close``: a numbered headline, where it happened, the indented detail and the
hint.  :func:`format_report` renders the entries :func:`recheck.findings.report_entries` computes,
at most :data:`ENTRIES_SHOWN` unless ``verbose``, with their detail while the report fits
:data:`SCREEN_LINES`.  Nothing from recheck is imported at run time (findings are read by
attribute), so :class:`recheck.findings.Report` can render itself through it."""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

if TYPE_CHECKING:  # pragma: no cover
    from recheck.findings import Entry, Finding, Invocation, Report

__all__ = ["ENTRIES_SHOWN", "SCREEN_LINES", "FIRST_LINE", "ansi", "format_entry", "format_finding", "plural",
           "format_findings", "format_report", "group", "lint_statistics", "lint_summary", "printable", "span",
           "subject_text", "SUBJECTS"]

#: The first line of a report with dynamic findings.
FIRST_LINE = "recheck: recomputation differs from the original forward"
_INDENT = "      "

#: The kinds of thing a finding is about (:class:`recheck.findings.Subject`'s ``what``), each
#: with how its text reads; ``{owner}``, ``{name}``, ``{path}`` are its parts, ``{names}`` its
#: name and further names, each quoted.
SUBJECTS: Mapping[str, str] = {
    "attribute": "attribute `{owner}.{name}`",  # owner "": the region's own module, ``self``
    "class attribute": "class attribute `{owner}.{name}`",
    "buffer": "buffer `{owner}.{name}`",
    "parameter": "parameter {names}",
    "tensor": "tensor `{name}`",
    "global": "global `{owner}.{name}`",
    "closure variable": "closure variable `{name}` of {owner}",
    "device RNG": "{owner} RNG",  # a device's default generator: ``cpu RNG``, ``cuda:0 RNG``
    "host RNG": "{name}",  # ``Python random``, ``numpy global RNG``
    "RNG instance": "{owner} `{name}`",  # ``generator `self.gen```, ``random.Random `self.rng```
    "context": "{name}",  # ``grad mode``, ``default dtype``; ``autocast `cpu``` with its device
    "gradient": "grad of {names}",  # ``grad of args[0]`` for an input
    "optimizer state": "optimizer state `{owner}.{name}`",
    "input": "{path}",
    "output": "{path}",
    "saved tensors": "saved tensors",
    "channel": "{name}",  # stdout, stderr, logging, warning
    "recompute": "recompute",
    "text": "{name}",  # a subject read from a report that recorded no parts
}


def subject_text(what: str, name: str = "", owner: str = "", path: str = "", more: Sequence[str] = ()) -> str:
    """How a finding's subject reads (:data:`SUBJECTS`): ``buffer `bn.running_mean```,
    ``attribute `self.calls```, ``parameters `w`, `b```, ``cpu RNG``, ``grad of args[0]``."""
    form = SUBJECTS.get(what, "{name}")
    if what == "attribute":
        owner = owner or "self"
    elif what == "buffer" and not owner:
        form = "buffer `{name}`"
    elif what == "context" and owner:
        form = "{name} `{owner}`"
    elif what == "parameter" and more:
        form = "parameters {names}"
    if what not in ("parameter", "gradient"):  # (the only forms with ``{names}``)
        return form.format(owner=owner, name=name, path=path)
    first = f"{owner}.{name}" if what == "parameter" and owner else name
    names = "`" + "`, `".join((first, *more)) + "`" if name else path
    return form.format(owner=owner, name=name, path=path, names=names)


#: Entries a report shows unless ``verbose``; the rest are counted on one line.
ENTRIES_SHOWN = 10
#: A report whose entries, with their detail, take at most this many lines shows the detail
#: (where each difference starts, its size); a longer one shows the headline, the location
#: and the hint of each, so that it still fits a screen (the detail is in ``verbose`` and JSON).
SCREEN_LINES = 40
#: Layer classes the header counts findings of (the most found first), the rest counted.
_LAYERS_SHOWN = 5

#: The ANSI SGR codes of the colours text may be painted in (the one table: progress uses it).
_ANSI = {"red": "31", "green": "32", "yellow": "33", "bold": "1", "dim": "2"}


def ansi(text: str, colour: str, enabled: bool = True) -> str:
    """``text`` in ``colour`` (red, green, yellow, bold, dim) when ``enabled``; else as is."""
    if not text or not enabled:
        return text
    return f"\033[{_ANSI[colour]}m{text}\033[0m"


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


def plural(count: int, noun: str) -> str:
    """``3 findings``, ``1 finding``."""
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
        elif not _says_more(first):
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
                   invocations: Sequence[Invocation] | None = None, *, count: int = 1,
                   detail: bool = True, colour: bool = False) -> str:
    """One finding: a headline, then the indented location, detail and hint.

    ``invocations``: every invocation a grouped finding happened in (its own when None); ``count``:
    how many findings it stands for (``×6``); ``detail=False`` leaves the detail out.
    """
    if finding.kind == "lint":
        return f"{printable(finding.location or '')}: {finding.code} {finding.message}"
    prefix = f"[{number}] " if number is not None else ""
    tag = " (latent)" if finding.latent else ""
    times = f" ×{count}" if count > 1 else ""
    lines = [f"{ansi(f'{prefix}{finding.kind}{tag}:', 'yellow', colour)} {finding.message}{times}"]
    indent = _INDENT if number is not None else "    "
    if invocations is None:
        invocations = [finding.invocation] if finding.invocation is not None else []
    where = _location(invocations, finding.region)
    if where and (number is None or len(invocations) > 1 or invocations and _says_more(invocations[0])):
        lines.append(indent + where)
    if detail:
        for text in finding.detail.splitlines():
            lines.append(indent + text if text else "")
    if finding.hint:
        lines.append(f"{indent}hint: {finding.hint}")
    if finding.code and f"recheck explain {finding.code}" not in (finding.hint or ""):
        lines.append(f"{indent}see `recheck explain {finding.code}`")
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
    """Dynamic findings that differ only by invocation, as (first finding, its invocations), in
    the order of each group's first finding (whose detail is the one shown).
    """
    return [(same[0], [f.invocation for f in same if f.invocation is not None]) for same in fold(findings)]


def fold(findings: Iterable[Finding]) -> list[list[Finding]]:
    """The findings that differ only by invocation, together, in the order of each one's first."""
    folded: dict[tuple, list[Finding]] = {}
    for finding in findings:
        folded.setdefault(_group_key(finding), []).append(finding)
    return list(folded.values())


def _layer(finding: Finding) -> str:
    """The layer class of a finding's region: ``Block`` for ``Block.forward (m.py:8)``; a
    difference in the end state of a checked step (no invocation) is the step's."""
    if finding.invocation is None and str(finding.region).startswith("step "):
        return "end of step"
    return str(finding.region).split(" (", 1)[0].split(".", 1)[0]


def _by_layer(findings: Sequence[Finding]) -> str:
    """``Block 12 in 2 regions, Attention 3``: findings per layer class, most first, at most
    five classes ("" when they are all in one region: the title names it)."""
    regions = {f.region: f for f in findings if f.region}
    if len(regions) < 2:
        return ""
    found: Counter[str] = Counter(_layer(f) for f in findings if f.region)
    places: Counter[str] = Counter(_layer(f) for f in regions.values())
    ranked = sorted(found.items(), key=lambda item: (-item[1], item[0]))
    shown = [f"{layer} {count}" + (f" in {places[layer]} regions" if places[layer] > 1 else "")
             for layer, count in ranked[:_LAYERS_SHOWN]]
    if len(ranked) > _LAYERS_SHOWN:
        shown.append(f"{len(ranked) - _LAYERS_SHOWN} more classes")
    return ", ".join(shown)


#: Regions an entry over several regions names before counting the rest.
_REGIONS_SHOWN = 3


def format_entry(entry: Entry, number: int, *, detail: bool = True, listed: bool = False, colour: bool = False,
                 more: str = "--verbose / JSON") -> str:
    """One entry of a report (:func:`recheck.findings.report_entries`): its headline with its
    count, where, the first finding's detail and hint; ``listed`` (``--verbose``) adds every
    finding a grouped entry stands for, one line each (the JSON report holds them too)."""
    first = entry.first
    if entry.form == "consequences":
        lines = [f"{ansi(f'[{number}] consequences:', 'yellow', colour)} {entry.message}"]
        hints = list(dict.fromkeys(f.hint for f in entry.findings if f.hint))
        if len(hints) == 1:  # the cause they were pointed at (``likely cause: ...``)
            lines.append(f"{_INDENT}hint: {hints[0]}")
        if not listed:
            lines.append(f"{_INDENT}each one in {more}")
    else:
        shown = first if entry.form == "finding" else _with_message(first, entry.message)
        invocations = entry.invocations
        if len(entry.regions) > 1:  # the location is the regions' names and their calls
            unplaced = dataclasses.replace(shown, region=None, invocation=None)
            head, *rest = format_finding(unplaced, number, [], count=entry.count, detail=detail,
                                         colour=colour).splitlines()
            names = ", ".join(entry.regions[:_REGIONS_SHOWN])
            if len(entry.regions) > _REGIONS_SHOWN:
                names += f" and {len(entry.regions) - _REGIONS_SHOWN} more"
            indices = {i.index for i in invocations}
            calls = f", call{'s' if len(indices) > 1 else ''} {span(indices)}" if indices else ""
            lines = [head, f"{_INDENT}in {names}{calls}", *rest]
        else:
            text = format_finding(shown, number, invocations or None, count=entry.count, detail=detail,
                                  colour=colour)
            lines = text.splitlines()
    if listed and entry.form != "finding":
        for finding in entry.findings:
            where = f" ({finding.region}, call {finding.invocation.index})" if finding.invocation else ""
            lines.append(f"{_INDENT}- {finding.message}{where}")
    return "\n".join(lines)


def _with_message(finding: Finding, message: str) -> Finding:
    """``finding`` with the headline of the grouped entry it stands first in."""
    return dataclasses.replace(finding, message=message)


def format_report(report: Report, *, verbose: bool = False, colour: bool = False,
                  more: str = "--verbose / JSON") -> str:
    """The whole report, the one text form of every face: first line, title, findings per layer
    class, the entries most severe first, static lines, notes.

    Unless ``verbose``, at most :data:`ENTRIES_SHOWN` entries, then a line saying how many more are in
    ``more``; past :data:`SCREEN_LINES` lines the entries lose their detail.  ``colour``: ANSI codes
    (the caller decides whether the terminal shows them).
    """
    dynamic = [f for f in report.findings if f.kind != "lint"]
    static = [f for f in report.findings if f.kind == "lint"]
    lines: list[str] = []
    if dynamic:
        lines.append(ansi(f"{FIRST_LINE} ({plural(len(dynamic), 'difference')})", "red", colour))
    elif not static:
        lines.append(ansi("recheck: no difference found", "green", colour))
    if report.title:
        lines.append("")
        lines.extend("  " + t for t in report.title.splitlines())
    layers = _by_layer(dynamic)
    if layers:
        lines.append(f"  findings by layer  {layers}")
    listed = report.entries()
    shown = listed if verbose else listed[:ENTRIES_SHOWN]
    body = _entries_text(shown, detail=True, verbose=verbose, colour=colour, more=more)
    detail = verbose or len(body) <= SCREEN_LINES
    if not detail:
        body = _entries_text(shown, detail=False, verbose=verbose, colour=colour, more=more)
    lines.extend(body)
    if len(shown) < len(listed):
        hidden = listed[len(shown):]
        noun = "entry" if len(hidden) == 1 else "entries"
        cut = f"{len(hidden)} more {noun} ({plural(sum(e.count for e in hidden), 'finding')}) in {more}"
        lines.extend(["", "  " + ansi(cut, "bold", colour)])
    elif not detail:
        lines.extend(["", "  " + ansi(f"the detail of each difference is in {more}", "dim", colour)])
    for finding in static:
        lines.append(format_finding(finding))
    if report.notes:
        lines.append("")
        lines.extend(f"{ansi('note:', 'bold', colour)} {n}" for n in report.notes)
    return "\n".join(lines)


def _entries_text(entries: Sequence[Entry], *, detail: bool, verbose: bool, colour: bool,
                  more: str) -> list[str]:
    """The lines of numbered entries, each indented; a blank line before each when they carry
    their detail (headlines alone read as a list, one blank line before the first)."""
    lines: list[str] = []
    for number, entry in enumerate(entries, 1):
        if detail or number == 1:
            lines.append("")
        text = format_entry(entry, number, detail=detail, listed=verbose, colour=colour, more=more)
        lines.extend("  " + t if t else "" for t in text.splitlines())
    return lines


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
        parts.append(f"Fixed {plural(fixed, 'finding')}.")
    if findings:
        count = sum(1 for f in findings if f.code in fixable)
        line = f"Found {plural(len(findings), 'finding')}"
        line += f" ({count} fixable with `--fix`)." if count else "."
        parts.append(line)
    elif not errors:
        parts.append("All checks passed!")
    kinds = Counter(getattr(error, "kind", "file") for error in errors)
    for kind in sorted(kinds, key=lambda k: (k != "file", k)):  # files, then folders
        parts.append(f"{plural(kinds[kind], kind)} could not be linted.")
    if unresolved:
        parts.append(unresolved_summary(unresolved))
    return "\n".join(parts)


def lint_statistics(findings: Sequence[Finding], names: Mapping[str, str],
                    fixable: frozenset[str] = frozenset()) -> str:
    """``count  CODE  [*]  rule-name`` per rule, most frequent first (ruff's ``--statistics``)."""
    return "\n".join(f"{count:>5}\t{code}\t{'[*]' if code in fixable else '   '}\t{names.get(str(code), '')}"
                     for code, count in rule_counts(findings))


def rule_counts(findings: Sequence[Finding]) -> list[tuple[Any, int]]:
    """``(code, count)`` per rule, the most frequent first (then by code): ``--statistics`` in every format."""
    return sorted(Counter(f.code for f in findings).items(), key=lambda item: (-item[1], str(item[0])))
