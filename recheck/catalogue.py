"""The rule catalogue: one Markdown document per rule in ``rules/``.

Every document is named ``<CODE>-<kebab-name>.md`` and laid out in the ruff style::

    # <kebab-name> (<CODE>)

    ## What it does
    ## Why it breaks recomputation
    ## Example            (a ```python block the linter flags)
    ## Use instead        (a ```python block the linter leaves clean)
    ## Found at run time as
    ## References

In a checkout the documents are read from ``rules/`` beside the package; an installed
wheel carries them as ``recheck/_rules/``.  Nothing here imports torch or libcst.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

__all__ = ["Rule", "RuleDocumentError", "all_rules", "get_rule", "rules_dir"]

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
