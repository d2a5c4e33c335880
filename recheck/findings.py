"""The findings model shared by every face of recheck (checker, watch, linter, cost).

This module is the bottom layer: it imports nothing from torch or libcst and nothing
else from recheck, so any part of the package can depend on it.

A :class:`Finding` is one thing that differs (dynamic) or one hazard in source code
(static).  A :class:`Report` is an ordered collection of findings plus the notes a run
wants to pass on (for instance "compiled regions were not observed").
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Iterable, Iterator, Mapping, Sequence

from recheck.output.text import FIRST_LINE, SUBJECTS, format_finding, format_report, plural, subject_text
from recheck.output.text import _location, fold

__all__ = ["DECLARED", "DYNAMIC_KINDS", "Entry", "FIRST_LINE", "KINDS", "Kind", "LINT", "Finding", "Invocation",
           "RecomputeMismatch", "Report", "SUBJECTS", "Subject", "could_not", "error_line", "one_line", "one_line_pair",
           "parts_of", "report_entries"]

@dataclass(frozen=True)
class Kind:
    """One dynamic finding kind, declared once in :data:`DECLARED`, which every face reads.

    ``meaning`` is its one line; ``rules`` the codes that may name its cause, tried in order
    (:func:`recheck.catalogue.explain`); ``cause`` whether it is a cause or a consequence (a value that
    came out different).  Its place in :data:`DECLARED` is its severity, the most severe first.
    """

    name: str
    meaning: str
    rules: tuple[str, ...] = ()
    cause: bool = True


#: Every dynamic kind, the most severe first: the causes (a parameter changed, an input mutated,
#: no input requiring grad, an RNG, the context, a global, state written, a buffer, an effect run again), then the
#: differences they cause (saved tensors, the output, a gradient).  Adding a kind is one line
#: here, the code that observes it and its test.
DECLARED: tuple[Kind, ...] = (
    Kind("param_version", "a parameter or input was modified in place between forward and recompute", ("RC201",)),
    Kind("input_mutation", "the region mutates one of its own inputs", ("RC107",)),
    Kind("input_grad", "no tensor input of a reentrant checkpoint requires grad, while parameters the region uses do",
         ("RC112",)),
    Kind("rng", "a random-number generator's state differs", ("RC003", "RC002", "RC102", "RC105")),
    Kind("context", "grad mode, autocast (enabled, dtype) or the default dtype differs between forward and recompute",
         ("RC003", "RC101")),
    Kind("global", "a global the region reads had another value at recompute than at forward", ("RC101",)),
    Kind("state", "Python-side state (module attributes, containers, globals written) differs", ("RC104", "RC101")),
    Kind("buffer", "a module buffer (such as BatchNorm running statistics) differs", ("RC106", "RC104", "RC101")),
    Kind("side_effect", "logging, printing or warnings were emitted again during recompute", ("RC103",)),
    Kind("recompute", "values recomputed in backward differ from the original forward's", cause=False),
    Kind("output", "the checkpointed step's output differs from the uncheckpointed step's", cause=False),
    Kind("gradient", "a gradient differs from the uncheckpointed run's", cause=False),
)

#: The dynamic kinds, each with its one-line meaning (:data:`DECLARED`'s order).
DYNAMIC_KINDS: Mapping[str, str] = {k.name: k.meaning for k in DECLARED}

#: The kind of every static (linter) finding.
LINT = "lint"

#: All kinds a :class:`Finding` may carry.
KINDS: tuple[str, ...] = (*DYNAMIC_KINDS, LINT)


def one_line(text: str, limit: int = 80) -> str:
    """``text`` as a message shows a value: one line of at most ``limit`` characters.

    The one formatter of every value a finding's message, subject or a note embeds (a
    ``repr``, an exception's text): runs of whitespace, line breaks included, become one
    space (a transformers config prints itself as indented JSON over a hundred lines), and a
    longer text is cut with an ellipsis and its full length, ``Config {"a": 1, ... (4210 chars)``.
    """
    plain = text.isprintable() and "  " not in text and text[:1] != " " and text[-1:] != " "
    flat = text if plain else " ".join(text.split())
    if len(flat) <= limit:
        return flat
    tail = f"... ({len(flat)} chars)"
    return flat[: max(limit - len(tail), 0)] + tail


def one_line_pair(before: str, after: str, limit: int = 80) -> tuple[str, str]:
    """Two texts of one value (before and after a change) as :func:`one_line` shows them, each
    cut around their first difference: two configs that differ in their last key read
    ``...problem_type": null } (250 chars)`` and ``...problem_type": "single_label_classification" }
    (279 chars)``, not the same first 60 characters twice."""
    a, b = one_line(before, 1 << 62), one_line(after, 1 << 62)
    if len(a) <= limit and len(b) <= limit:
        return a, b
    first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    start = max(first - limit // 4, 0)
    if start == 0:
        return one_line(a, limit), one_line(b, limit)
    return _window(a, start, limit), _window(b, start, limit)


def _window(text: str, start: int, limit: int) -> str:
    """``...`` and at most ``limit`` characters of ``text`` from ``start``, with its full length."""
    tail = f" ({len(text)} chars)"
    room = max(limit - len(tail) - 6, 0)
    cut = text[start:start + room]
    return "..." + cut + ("..." if start + room < len(text) else "") + tail


def could_not(what: str, exc: BaseException) -> str:
    """The note that says recheck's own observation ``what`` failed, and why: ``could not
    compare the recompute of Block.forward (m.py:8): RuntimeError: reason`` (one bounded line).

    recheck never raises its own failure into the program it watches: the check that failed is
    skipped, the note says which, and the user's step goes on."""
    return f"could not {what}: {type(exc).__name__}: {one_line(str(exc), 200)}"


def error_line(exc: BaseException, limit: int = 160) -> str:
    """``exc`` as a finding or a note names it: its type and the first line of its message,
    bounded by :func:`one_line` (a traceback-like message never spans lines of a report)."""
    text = str(exc).strip().splitlines()
    return one_line(f"{type(exc).__name__}: {text[0] if text else ''}", limit)



@dataclass(frozen=True)
class Invocation:
    """Which call of a region a dynamic finding belongs to.

    ``index`` is 1-based and counts calls of the same region; ``of`` is the number of
    calls seen when known.  ``tags`` carries labels such as ``stage`` and
    ``microbatch`` (see ``recheck.tag``).  ``callsite`` is the ``file:line`` of the
    code that called checkpoint.
    """

    index: int = 1
    of: int | None = None
    tags: Mapping[str, Any] = field(default_factory=dict)
    callsite: str | None = None

    @classmethod
    def from_dict(cls, data: Any) -> Invocation:
        """An invocation from its record, checked like :meth:`Finding.from_dict`."""
        _known(data, "an invocation", ("index", "of", "tags", "callsite"))
        index, of = data.get("index", 1), data.get("of")
        tags, callsite = data.get("tags", {}), data.get("callsite")
        if not _is_int(index) or (of is not None and not _is_int(of)):
            raise ValueError(f"invocation index and of must be integers, got {index!r}, {of!r}")
        if not isinstance(tags, Mapping) or not all(isinstance(k, str) for k in tags):
            raise ValueError(f"invocation tags must be an object with string keys, got {tags!r}")
        if callsite is not None and not isinstance(callsite, str):
            raise ValueError(f"invocation callsite must be a string, got {callsite!r}")
        return cls(index=index, of=of, tags=dict(tags), callsite=callsite)

    def __str__(self) -> str:  # as a report's location line says it (the only call of a region too)
        return _location([self], None) or f"call {self.index} of {self.of}"


class Subject(str):
    """What a dynamic finding is about, as data: ``what`` kind of thing (one of :data:`SUBJECTS`), its
    ``owner`` (a module path, a class, a Python module, a device; ``""``: the region's own module),
    its ``name``, the ``path`` of an element in a call's inputs or outputs, and ``more`` further names.

    Rules are attributed (:func:`recheck.catalogue.explain`) and entries grouped (:func:`report_entries`)
    from these parts, never from wording.  A subject is also its text (``buffer `bn.running_mean```,
    :func:`recheck.output.text.subject_text`), so it keys recorded state and is a JSON string as it
    always was.  Immutable.
    """

    what: str
    name: str
    owner: str
    path: str
    more: tuple[str, ...]

    def __new__(cls, what: str, name: str = "", *, owner: str = "", path: str = "",
                more: tuple[str, ...] = ()) -> Subject:
        self = super().__new__(cls, subject_text(what, name, owner, path, more))
        parts = self.__dict__  # (not __setattr__)
        parts["what"], parts["name"], parts["owner"], parts["path"] = what, name, owner, path
        parts["more"] = more if type(more) is tuple else tuple(more)
        return self

    def __setattr__(self, key: str, value: Any) -> None:
        raise AttributeError(f"a Subject is immutable; cannot set {key!r}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (_subject, (self.parts(),))

    def __deepcopy__(self, memo: Any) -> Subject:
        return self

    def parts(self) -> dict[str, Any]:
        """The subject's parts, as its JSON record (``subject_data``) holds them."""
        return {"what": self.what, "name": self.name, "owner": self.owner, "path": self.path, "more": list(self.more)}

    @classmethod
    def from_parts(cls, data: Any) -> Subject:
        """A subject from its :meth:`parts`, every part checked (``ValueError`` naming it)."""
        _known(data, "a subject_data", ("what", "name", "owner", "path", "more"))
        text = {k: data.get(k, "") for k in ("what", "name", "owner", "path")}
        more = data.get("more", [])
        if not all(isinstance(v, str) for v in text.values()) or not isinstance(more, list) \
                or not all(isinstance(m, str) for m in more):
            raise ValueError(f"a subject_data's parts must be strings (more: a list of strings), got {dict(data)!r}")
        if text["what"] not in SUBJECTS:
            raise ValueError(f"unknown subject kind {text['what']!r}; expected one of {', '.join(SUBJECTS)}")
        return cls(text["what"], text["name"], owner=text["owner"], path=text["path"], more=tuple(more))


def _subject(parts: dict[str, Any]) -> Subject:
    return Subject.from_parts(parts)


def parts_of(subject: str | None) -> Subject:
    """``subject`` as data: itself when it is a :class:`Subject`; a plain text (a report written
    by hand, or by a recheck that did not record parts) is a ``text`` subject with no parts."""
    return subject if isinstance(subject, Subject) else Subject("text", subject or "")


@dataclass(frozen=True)
class Finding:
    """One difference found at run time, or one hazard found in source code.

    A dynamic finding has a ``region`` (the checkpointed callable, with its ``file:line``), an
    ``invocation`` and a ``subject``; a static one ``kind="lint"``, a rule ``code`` and its 1-based
    ``path``/``line``/``column``.  ``latent`` marks a difference only a full replay executed;
    ``cause`` is the kind of the finding a symptom was pointed at as its likely cause
    (:func:`recheck.runtime.explaining.with_likely_causes`), which a report groups it under.
    """

    kind: str
    message: str
    code: str | None = None
    path: str | None = None
    line: int | None = None
    column: int | None = None
    end_line: int | None = None
    end_column: int | None = None
    region: str | None = None
    invocation: Invocation | None = None
    subject: str | None = None
    detail: str = ""
    hint: str | None = None
    latent: bool = False
    cause: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(
                f"unknown finding kind {self.kind!r}; expected one of {', '.join(KINDS)}"
            )
        if self.kind == LINT and not self.code:
            raise ValueError("a lint finding needs a rule code")
        if "\n" in self.message:
            raise ValueError("Finding.message is one line; put the rest in detail")
        if self.cause is not None and self.cause not in DYNAMIC_KINDS:
            raise ValueError(f"unknown cause kind {self.cause!r}; expected one of {', '.join(DYNAMIC_KINDS)}")

    @property
    def location(self) -> str | None:
        """``path:line:col`` for static findings, else None."""
        if self.path is None:
            return None
        parts = [self.path]
        if self.line is not None:
            parts.append(str(self.line))
            if self.column is not None:
                parts.append(str(self.column))
        return ":".join(parts)

    def to_dict(self) -> dict[str, Any]:
        """The finding's record: every field (``subject`` as its text), and for a typed subject
        ``subject_data``, its parts (:meth:`Subject.parts`; a lint record keeps ruff's fields)."""
        data = asdict(self)
        if self.invocation is not None:
            data["invocation"] = {**asdict(self.invocation), "tags": dict(self.invocation.tags)}
        subject = self.subject
        if isinstance(subject, Subject):
            data["subject"], data["subject_data"] = str.__str__(subject), subject.parts()
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Finding:
        """A finding from its :meth:`to_dict` record, every field checked.

        Reports are read from files recheck did not write in this run (``--recheck-report``
        files, merged rank reports), so nothing is trusted: an unknown key, a field of the
        wrong type or an unknown kind is a ``ValueError`` naming it.
        """
        _known(data, "a finding", [*(f.name for f in fields(cls)), "subject_data"])
        values = dict(data)
        for name, (kind, description) in _FIELD_TYPES.items():
            value = values.get(name)
            if value is not None and (not isinstance(value, kind) or isinstance(value, bool) is not (kind is bool)):
                raise ValueError(f"finding field {name!r} must be {description}, got {value!r}")
        for name in ("kind", "message"):
            if not isinstance(values.get(name), str):
                raise ValueError(f"a finding needs a string {name!r}")
        inv = values.get("invocation")
        if inv is not None:
            values["invocation"] = Invocation.from_dict(inv)
        parts = values.pop("subject_data", None)
        if parts is not None:
            values["subject"] = Subject.from_parts(parts)
        return cls(**values)

    def format(self, number: int | None = None) -> str:
        """Human-readable text: one headline, then the indented detail and hint."""
        return format_finding(self, number)

@dataclass(frozen=True)
class Entry:
    """One entry of a report: the findings that read as one hazard (:func:`report_entries`).

    ``form`` is how they were joined (``"finding"``, ``"values"``, ``"modules"``, ``"consequences"``,
    the steps of :func:`report_entries`); ``message`` is the entry's headline, ``findings`` every
    finding it stands for in the order found; ``values``, ``modules`` (each ``region: path``) and
    ``family`` (the attributes one recompute changed) what a joined entry lists.
    """

    form: str
    message: str
    findings: tuple[Finding, ...]
    regions: tuple[str, ...] = ()
    modules: tuple[str, ...] = ()
    family: tuple[str, ...] = ()
    values: tuple[str, ...] = ()

    @property
    def first(self) -> Finding:
        return self.findings[0]

    @property
    def count(self) -> int:
        return len(self.findings)

    @property
    def invocations(self) -> list[Invocation]:
        """The invocations of the entry's findings, each (region-local index) once, in order."""
        seen: dict[tuple, Invocation] = {}
        for finding in self.findings:
            inv = finding.invocation
            if inv is not None:
                seen.setdefault((inv.index, inv.of, inv.callsite, tuple(sorted(map(str, inv.tags.items())))), inv)
        return list(seen.values())


def report_entries(findings: Iterable[Finding]) -> list[Entry]:
    """The entries of a report, the most severe first: the one grouping of findings every face renders.

    1. ``consequences`` (last): a ``check_step``'s end-of-step differences from the twin (no
       invocation) that follow from a cause the watched run reported (pointed at it: ``cause``, a
       stream with no rule of its own, or the kind and rule of a watched finding).
    2. ``modules``: one hazard (kind, rule, subject kind) in several modules, or on several attributes
       that one recompute changed in one module (a BatchNorm's buffers), told by the subjects' parts.
    3. ``values``: one subject of one region whose message differs only by a value per call.
    4. ``finding``: one finding, or the same finding over several invocations.

    Entries of one severity (:data:`DECLARED`'s order, a latent one after an executed one) keep the
    order found.  Static (``lint``) findings are not entries.
    """
    dynamic = [f for f in findings if f.kind != LINT]
    watched = {(f.kind, f.code) for f in dynamic if f.invocation is not None}
    consequences = [f for f in dynamic if watched and _is_consequence(f, watched)]
    taken = {id(f) for f in consequences}
    rest = [f for f in dynamic if id(f) not in taken]
    entries = _module_entries(rest, taken)
    rest = [f for f in rest if id(f) not in taken]
    entries += _value_entries(rest, taken)
    rest = [f for f in rest if id(f) not in taken]
    entries += [Entry("finding", same[0].message, tuple(same), _regions(same)) for same in fold(rest)]
    order = {id(f): n for n, f in enumerate(dynamic)}
    entries.sort(key=lambda e: (*_severity(e.first), order[id(e.first)]))
    if consequences:
        entries.append(Entry("consequences", _consequence_message(consequences), tuple(consequences),
                             _regions(consequences)))
    return entries


#: Each dynamic kind's place in :data:`DECLARED`: the most severe first.
SEVERITY: Mapping[str, int] = {k.name: n for n, k in enumerate(DECLARED)}


def _severity(finding: Finding) -> tuple[int, bool]:
    return (SEVERITY.get(finding.kind, len(SEVERITY)), finding.latent)


def _regions(findings: Iterable[Finding]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(f.region for f in findings if f.region))


def _is_consequence(finding: Finding, watched: set[tuple[str, str | None]]) -> bool:
    """An end-of-step difference from the twin explained by a watched cause: pointed at it
    (``cause``), without a rule of its own (the RNG stream the recompute drew from), or
    of the kind and rule of a hazard the watched run reported (a BatchNorm buffer whose
    statistics the recompute updated again, ``watched``: those findings' kind and rule)."""
    if finding.invocation is not None:
        return False
    return finding.cause is not None or (finding.code is not None and (finding.kind, finding.code) in watched) \
        or (finding.code is None and finding.hint is None)


#: How a consequence entry counts its findings, by what their subject is.
_CONSEQUENCE_NOUNS = {"parameter": "parameter", "gradient": "gradient", "optimizer state": "optimizer tensor",
                      "buffer": "buffer", "device RNG": "RNG stream", "host RNG": "RNG stream",
                      "RNG instance": "RNG stream"}


def _consequence_message(findings: Sequence[Finding]) -> str:
    """``12 parameters, 12 gradients, 24 optimizer tensors and 1 other value differ from the
    uncheckpointed step as a consequence``."""
    counts = Counter(_CONSEQUENCE_NOUNS.get(parts_of(f.subject).what, "other value") for f in findings)
    parts = [plural(counts[noun], noun) for noun in sorted(counts, key=lambda noun: noun == "other value")]
    listed = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
    verb = "differs" if len(findings) == 1 else "differ"
    return f"{listed} {verb} from the uncheckpointed step as a consequence"


#: Subjects that name an attribute of a module (``buffer `bn.running_mean```), relative to the
#: region's module; a ``global `pkg.NAME``` is a name in a Python module, not a layer.
_MODULE_SUBJECTS = ("buffer", "attribute", "parameter")


def _module_entries(findings: Sequence[Finding], taken: set[int]) -> list[Entry]:
    """``modules`` entries (step 2 of :func:`report_entries`): findings of a call about one attribute
    of a module (``buffer `layers.0.1.running_mean```: module ``layers.0.1``), told by their subject's
    parts.  One hazard is one kind, rule, subject kind, hint and cause; its family, the attributes one
    recompute (region, call, module) changed.  The findings they take go in ``taken``."""
    named = []
    for f in findings:
        subject, inv = parts_of(f.subject), f.invocation
        module = subject.owner or ("self" if subject.what == "attribute" else "")
        if subject.what in _MODULE_SUBJECTS and module and not subject.more and inv is not None:
            named.append((f, module, subject.name, (f.kind, f.code, subject.what, f.region, module, inv.index,
                                                    inv.callsite)))
    families: dict[tuple, dict[str, None]] = {}  # the attributes one recompute changed, in order
    for _, _, attribute, recompute in named:
        families.setdefault(recompute, {})[attribute] = None
    groups: dict[tuple, list[tuple[Finding, str]]] = {}
    for f, module, _, recompute in named:
        key = (*recompute[:3], f.hint, f.latent, f.cause, tuple(families[recompute]))
        groups.setdefault(key, []).append((f, module))
    entries = []
    for key, pairs in groups.items():
        family = key[-1]
        group = tuple(f for f, _ in pairs)
        modules = tuple(dict.fromkeys(f"{f.region}: {module}" for f, module in pairs))
        if len(modules) < 2 and len(family) < 2:
            continue
        regions = _regions(group)
        where = f" in {plural(len(modules), 'module')}" + (f" of {plural(len(regions), 'region')}" if regions else "")
        entries.append(Entry("modules", _headline(pairs, family) + where, group, regions, modules, family))
        taken.update(id(f) for f in group)
    return entries


def _headline(pairs: Sequence[tuple[Finding, str]], family: tuple[str, ...]) -> str:
    """What the messages of one hazard's findings say, the family standing for each one's attribute
    (quoted ``module.name``); where they say more apart (a value each), what they say alike."""
    names = ", ".join(f"`{a}`" for a in family)
    said = list(dict.fromkeys(f.message.replace(f"`{m}.{parts_of(f.subject).name}`", names, 1) for f, m in pairs))
    common = os.path.commonprefix(said)
    return said[0] if len(said) == 1 or ": " not in common else common[: common.rfind(": ")]


def _value_entries(findings: Sequence[Finding], taken: set[int]) -> list[Entry]:
    """``values`` entries (step 3 of :func:`report_entries`): one subject of one region whose
    message differs per call only by a value at its end (``... recompute: 1 -> 2``)."""
    groups: dict[tuple, list[Finding]] = {}
    for finding in findings:
        if finding.invocation is not None and finding.subject:
            inv = finding.invocation
            key = (finding.kind, finding.code, finding.subject, finding.region, finding.hint, finding.latent,
                   inv.callsite, inv.of)
            groups.setdefault(key, []).append(finding)
    entries = []
    for group in groups.values():
        messages = list(dict.fromkeys(f.message for f in group))
        if len(messages) < 2:
            continue
        common = os.path.commonprefix(messages)  # up to its last ": " (the value follows)
        prefix = common[: common.rfind(": ") + 2] if ": " in common else ""
        values = tuple(f.message[len(prefix):] for f in group)
        if not prefix or not all(values):
            continue
        entries.append(Entry("values", prefix + ", ".join(values), tuple(group), _regions(group), values=values))
        taken.update(id(f) for f in group)
    return entries


class Report:
    """An ordered list of findings with the notes of the run that produced them."""

    def __init__(
        self,
        findings: Iterable[Finding] = (),
        *,
        title: str | None = None,
        notes: Iterable[str] = (),
        stats: Mapping[str, Any] | None = None,
    ) -> None:
        self.findings: list[Finding] = list(findings)
        self.title = title
        self.notes: list[str] = list(notes)
        self.stats: dict[str, Any] = dict(stats or {})

    @property
    def ok(self) -> bool:
        """True when there is no finding."""
        return not self.findings

    def __len__(self) -> int:
        return len(self.findings)

    def __iter__(self) -> Iterator[Finding]:
        return iter(self.findings)

    def entries(self) -> list[Entry]:
        """The report's entries, causes first, repeated hazards and consequences grouped
        (:func:`report_entries`); the findings themselves stay as they are."""
        return report_entries(self.findings)

    def by_kind(self, kind: str) -> list[Finding]:
        return [f for f in self.findings if f.kind == kind]

    @property
    def kinds(self) -> set[str]:
        return {f.kind for f in self.findings}

    def extend(self, other: Report | Iterable[Finding]) -> None:
        if isinstance(other, Report):
            self.findings.extend(other.findings)
            self.notes.extend(n for n in other.notes if n not in self.notes)
        else:
            self.findings.extend(other)

    @classmethod
    def merge(cls, reports: Iterable[Report]) -> Report:
        """One report from several ranks' reports (pure: the inputs are not changed).

        Reports are taken in rank order (``stats["rank"]``; those without a rank keep their
        place after the ranked ones).  Findings are concatenated in that order, notes are
        de-duplicated, titles are joined one per line.  Numeric statistics are summed;
        ``stats["ranks"]`` keeps every input's own statistics (a list, so it survives JSON),
        and ``world_size`` is taken from the inputs.
        """
        ordered = sorted(reports, key=_rank_order)
        merged = cls(title="\n".join(r.title for r in ordered if r.title) or None)
        stats: dict[str, Any] = {}
        for report in ordered:
            merged.extend(report)
            for key, value in report.stats.items():
                if key in _PER_RANK_STATS or key == "ranks":
                    continue
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    stats[key] = stats.get(key, 0) + value
        world_sizes = {r.stats["world_size"] for r in ordered if "world_size" in r.stats}
        if len(world_sizes) == 1:
            stats["world_size"] = world_sizes.pop()
        stats["ranks"] = [dict(r.stats) for r in ordered]
        merged.stats = stats
        return merged

    def format(self, verbose: bool = False, colour: bool = False) -> str:
        """The report as text (:func:`recheck.output.text.format_report`, the one renderer of
        every face): at most ten entries, causes first, unless ``verbose``; ``colour`` for a
        terminal."""
        return format_report(self, verbose=verbose, colour=colour, more=_MORE)

    def __str__(self) -> str:
        return self.format()

    def __repr__(self) -> str:
        return f"<Report {len(self.findings)} finding(s), ok={self.ok}>"

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "title": self.title,
            "findings": [f.to_dict() for f in self.findings],
            "notes": list(self.notes),
            "stats": dict(self.stats),
        }

    def to_json(self, **dumps_kwargs: Any) -> str:
        dumps_kwargs.setdefault("indent", 2)
        return json.dumps(self.to_dict(), default=repr, **dumps_kwargs)

    @classmethod
    def from_dict(cls, data: Any) -> Report:
        """A report from its :meth:`to_dict` document, every field checked (``ValueError``)."""
        if not isinstance(data, Mapping):
            raise ValueError(f"a report must be a JSON object, got {type(data).__name__}")
        findings, notes, stats, title = data.get("findings", []), data.get("notes", []), data.get("stats"), data.get("title")
        stats = {} if stats is None else stats
        if not isinstance(findings, list):
            raise ValueError("a report's findings must be a list")
        if not isinstance(notes, list) or not all(isinstance(n, str) for n in notes):
            raise ValueError("a report's notes must be a list of strings")
        if not isinstance(stats, Mapping) or not all(isinstance(k, str) for k in stats):
            raise ValueError("a report's stats must be an object with string keys")
        if title is not None and not isinstance(title, str):
            raise ValueError("a report's title must be a string")
        return cls((Finding.from_dict(f) for f in findings), title=title, notes=notes, stats=dict(stats))

    @classmethod
    def from_json(cls, text: str) -> Report:
        """:meth:`from_dict` of a JSON text (plain data only: no object is ever revived)."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"not a JSON report: {exc}") from None
        return cls.from_dict(data)


#: Where ``str(report)`` says the entries it leaves out are.
_MORE = "report.format(verbose=True) / report.to_json()"

#: statistics that describe one rank, never summed by :meth:`Report.merge`
_PER_RANK_STATS = ("rank", "world_size")


def _rank_order(report: Report) -> tuple[int, int]:
    rank = report.stats.get("rank")
    return (0, rank) if isinstance(rank, int) and not isinstance(rank, bool) else (1, 0)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _known(data: Any, what: str, known: Iterable[str]) -> None:
    """Refuse a record that is not an object, or has a field outside ``known`` (``ValueError`` naming it)."""
    if not isinstance(data, Mapping):
        raise ValueError(f"{what} must be an object, got {type(data).__name__}")
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ValueError(f"{what} has unknown field(s): {', '.join(map(str, unknown))}")


#: What each optional field of a finding record must hold (None is always allowed; a bool is no integer).
_FIELD_TYPES: dict[str, tuple[type, str]] = {
    **{name: (str, "a string") for name in ("code", "path", "region", "subject", "detail", "hint", "cause")},
    **{name: (int, "an integer") for name in ("line", "column", "end_line", "end_column")},
    "latent": (bool, "true or false"),
}


class RecomputeMismatch(AssertionError):
    """Raised by the assertion helpers when a recomputation differs.

    ``report`` holds the full :class:`Report`; ``str(exc)`` is its text.
    """

    def __init__(self, report: Report) -> None:
        super().__init__(str(report))
        self.report = report
