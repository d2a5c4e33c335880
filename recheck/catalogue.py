"""The rule catalogue: one Markdown document per rule in ``rules/``, and the rule registry.

:data:`REGISTRY` is the one place that knows, for each rule code, its one-line advice and whether
``recheck lint --fix`` fixes it; which finding kinds a rule explains is declared with each kind
(:data:`recheck.findings.DECLARED`), narrowed by the finding's subject (:func:`explain`).  A document,
``rules/<CODE>-<kebab-name>.md`` (``# <kebab-name> (<CODE>)``, then :data:`REQUIRED_SECTIONS` in
the ruff style), gives each code its name, summary and examples.  An installed wheel carries the
documents as ``recheck/_rules/``.  Nothing here imports torch or libcst."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Callable, Mapping

from recheck.findings import DECLARED, Subject, parts_of

__all__ = ["FIXABLE", "REGISTRY", "Entry", "Rule", "RuleDocumentError", "all_rules", "entry", "explain", "get_rule",
           "hint", "rules_dir"]

REQUIRED_SECTIONS = (
    "What it does",
    "Why it breaks recomputation",
    "Example",
    "Use instead",
    "Found at run time as",
    "References",
)

_FILE_RE = re.compile(r"^(RC\d{3})-([a-z0-9]+(?:-[a-z0-9]+)*)\.md$")
_TITLE_RE = re.compile(r"^# ([a-z0-9]+(?:-[a-z0-9]+)*) \((RC\d{3})\)\s*$")
_FENCE_RE = re.compile(r"```python\n(.*?)```", re.S)


class RuleDocumentError(ValueError):
    """A document in ``rules/`` does not follow the catalogue's layout."""


@dataclass(frozen=True)
class Rule:
    code: str
    name: str
    summary: str
    path: Path
    text: str
    sections: dict[str, str] = field(repr=False, compare=False)

    @property
    def examples(self) -> list[str]:
        """Python sources the linter must flag (the *Example* section)."""
        return _FENCE_RE.findall(self.sections["Example"])

    @property
    def clean_examples(self) -> list[str]:
        """Python sources the linter must leave clean (the *Use instead* section)."""
        return _FENCE_RE.findall(self.sections["Use instead"])

    @property
    def runtime_kinds(self) -> list[str]:
        """The dynamic finding kinds named (in backticks) under *Found at run time as*."""
        return re.findall(r"`([a-z_]+)`", self.sections["Found at run time as"])

    @property
    def doc_ref(self) -> str:
        """The document's path relative to the project: ``rules/RC106-batchnorm-in-region.md``."""
        return f"rules/{self.path.name}"

    @property
    def static(self) -> bool:
        """False for rules that only the dynamic checker can find (RC2xx)."""
        return not self.code.startswith("RC2")


def rules_dir() -> Path:
    """Where the rule documents are: inside the installed package, else the checkout's."""
    packaged = Path(__file__).resolve().parent / "_rules"
    if packaged.is_dir():
        return packaged
    checkout = Path(__file__).resolve().parent.parent / "rules"
    if checkout.is_dir():
        return checkout
    raise FileNotFoundError(
        f"recheck's rule documents are missing: looked in {packaged} and {checkout}"
    )


def parse_rule(path: Path) -> Rule:
    match = _FILE_RE.match(path.name)
    if not match:
        raise RuleDocumentError(f"{path.name}: expected a name like RC106-batchnorm-in-region.md")
    code, name = match.groups()
    text = path.read_text(encoding="utf-8")
    first = text.splitlines()[0] if text else ""
    title = _TITLE_RE.match(first)
    if not title or title.groups() != (name, code):
        raise RuleDocumentError(f"{path.name}: first line must be '# {name} ({code})'")
    sections: dict[str, str] = {}
    current = None
    for line in text.splitlines()[1:]:
        if line.startswith("## "):
            current = line[3:].strip()
            sections[current] = ""
        elif current is not None:
            sections[current] += line + "\n"
    missing = [s for s in REQUIRED_SECTIONS if s not in sections]
    if missing:
        raise RuleDocumentError(f"{path.name}: missing section(s): {', '.join(missing)}")
    summary = sections["What it does"].strip().split("\n\n")[0].replace("\n", " ")
    return Rule(code, name, summary, path, text, {k: v.strip() + "\n" for k, v in sections.items()})


@lru_cache(maxsize=None)
def _load(directory: Path) -> tuple[Rule, ...]:
    return tuple(parse_rule(p) for p in sorted(directory.glob("RC*.md")))


def all_rules() -> tuple[Rule, ...]:
    """Every rule, ordered by code."""
    return _load(rules_dir())


def get_rule(code_or_name: str) -> Rule:
    """Look a rule up by code (``RC106``, any case) or kebab-case name."""
    key = code_or_name.strip()
    for rule in all_rules():
        if key.upper() == rule.code or key.lower() == rule.name:
            return rule
    raise KeyError(code_or_name)


# -- the registry -------------------------------------------------------------------------------

#: Buffers BatchNorm's training forward updates.
_BATCHNORM_BUFFERS = ("running_mean", "running_var", "num_batches_tracked")
#: Subjects of the state a training step is meant to change (check_step's end state): a
#: difference there follows from a gradient, it is not a write the region makes.
TRAINING_STATE = ("parameter", "optimizer state")


def _default_stream(subject: Subject) -> bool:
    """A device's default generator (``cpu RNG``, ``cuda:0 RNG``): the streams checkpoint itself
    preserves with ``preserve_rng_state=True``."""
    return subject.what == "device RNG"


#: How a rule narrows the kinds it explains, from ``(kind, subject, context)``.
_NARROWING: Mapping[str, Callable[[str, Subject, Mapping[str, object]], bool]] = {
    "RC002": lambda kind, subject, context: _default_stream(subject) and context.get("preserve_rng_state") is False,
    # checkpoint preserves the default generators of the inputs' device type only: a stream of
    # another device that differs, with preserve_rng_state on, comes from a move in the region
    "RC102": lambda kind, subject, context: (_default_stream(subject) and subject.owner != "cpu"
                                             and context.get("preserve_rng_state") is not False),
    "RC105": lambda kind, subject, context: not _default_stream(subject),
    # another implementation than torch's (DeepSpeed, fairscale, a project's own Function): what
    # torch's checkpoint restores and this one did not; absent means torch's
    "RC003": lambda kind, subject, context: (context.get("implementation", "torch") != "torch"
                                             and (kind == "context" or _default_stream(subject))),
    "RC106": lambda kind, subject, context: (subject.what == "buffer" and subject.name in _BATCHNORM_BUFFERS
                                             and not context.get("between")),
    # torch's default dtype is a global every factory call reads; no checkpoint restores it; state
    # changed between the forward and its recompute, by the program outside the region, is state
    # the recompute reads anew (a write by the region itself is RC104's)
    "RC101": lambda kind, subject, context: (kind == "global" or (subject.what == "context"
                                                                  and subject.name == "default dtype")
                                             or bool(context.get("between"))),
    "RC104": lambda kind, subject, context: subject.what not in TRAINING_STATE and not context.get("between"),
}

@dataclass(frozen=True)
class Entry:
    """What the registry knows of one rule code: its one-line advice and whether ``--fix``
    fixes it.  The dynamic kinds a rule explains are declared with each kind
    (:data:`recheck.findings.DECLARED`, its ``rules``), where :func:`explain` reads them."""

    code: str
    advice: str
    fixable: bool = False

    @property
    def kinds(self) -> tuple[str, ...]:
        """The dynamic finding kinds whose *cause* this rule names."""
        return tuple(k.name for k in DECLARED if self.code in k.rules)

    def explains(self, kind: str, subject: Subject, context: Mapping[str, object]) -> bool:
        """Whether a finding of ``kind`` about ``subject`` is explained by this rule.

        ``context`` carries what the face knows of the checkpoint call:
        ``preserve_rng_state`` (bool, absent when unknown), ``implementation``
        (``"torch"`` for torch's own checkpoint, another name for a hand-written one) and
        ``between`` (True where state changed between the forward and its recompute, outside
        the region, rather than by the recompute).
        """
        narrow = _NARROWING.get(self.code)
        return narrow is None or narrow(kind, subject, context)


#: The rules the dynamic checker names (or ``--fix`` fixes), with their advice.  A rule only the
#: linter finds needs no entry: :func:`entry` makes one from its document, whose summary is the advice.
REGISTRY: tuple[Entry, ...] = (
    Entry("RC001", "pass use_reentrant=False explicitly; the reentrant default hides hazards", fixable=True),
    Entry("RC003", "a hand-written checkpoint reruns its function without restoring RNG or autocast state"),
    Entry("RC002", "the region draws random numbers but preserve_rng_state=False"),
    Entry("RC102", "the region moves tensors to a device whose RNG checkpoint does not preserve"),
    Entry("RC105", "the region draws from an RNG that checkpoint does not restore"),
    Entry("RC106", "BatchNorm in training mode updates its running statistics again on recompute"),
    Entry("RC101", "the region reads a global or module attribute that changes between forward and recompute"),
    Entry("RC103", "the region logs, prints or warns; it runs again on recompute"),
    Entry("RC104", "the region mutates state outside itself; the recompute mutates it again"),
    Entry("RC107", "the region mutates one of its inputs in place"),
    Entry("RC112", "no input of a reentrant checkpoint requires grad; make one require grad or pass use_reentrant=False"),
    Entry("RC201", "a parameter changed between forward and recompute"),
)

_BY_CODE: dict[str, Entry] = {e.code: e for e in REGISTRY}
#: the entries that may explain each finding kind, in the order its declaration gives
_BY_KIND: dict[str, tuple[Entry, ...]] = {k.name: tuple(_BY_CODE[c] for c in k.rules) for k in DECLARED}

#: Codes ``recheck lint --fix`` can fix.
FIXABLE: frozenset[str] = frozenset(e.code for e in REGISTRY if e.fixable)


def entry(code: str) -> Entry:
    """The registry entry of ``code``; for a rule with none, one whose advice is its document's
    summary (``KeyError`` for a code no document names)."""
    key = code.strip().upper()
    known = _BY_CODE.get(key)
    if known is not None:
        return known
    return Entry(key, get_rule(key).summary)


def explain(kind: str, subject: str | None = None, **context: object) -> str | None:
    """The code of the rule that explains a finding of ``kind`` about ``subject``, or None.

    The rule is read from the subject's parts (:class:`recheck.findings.Subject`), never from
    its text: a plain text subject has none, and only a rule that needs none explains it.

    >>> explain("rng", Subject("host RNG", "Python random"), preserve_rng_state=True)
    'RC105'
    >>> explain("rng", Subject("device RNG", owner="cpu"), preserve_rng_state=False)
    'RC002'
    >>> explain("buffer", Subject("buffer", "running_mean", owner="bn"))
    'RC106'
    """
    subject = parts_of(subject)
    for candidate in _BY_KIND.get(kind, ()):
        if candidate.explains(kind, subject, context):
            return candidate.code
    return None


def hint(code: str, cause: str | None = None) -> str:
    """The text of a finding's ``hint:`` line for rule ``code``.

    ``"<advice> (RC106); see `recheck explain RC106`"``; with ``cause`` (a finding that
    explains this one, such as the RNG stream behind a differing gradient) the cause is
    named instead of the rule's general advice.  An unknown code still gives a hint that
    names it: a missing entry must never turn a finding into a crash.
    """
    try:
        known: Entry | None = entry(code)
    except (KeyError, FileNotFoundError, RuleDocumentError):
        known = None
    text = cause or (known.advice if known else "")
    where = f"see `recheck explain {code}`"
    return f"{text} ({code}); {where}" if text else f"{code}; {where}"
