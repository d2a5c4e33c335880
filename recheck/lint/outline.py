"""A file's top-level definitions as units of lazy analysis, and what each may hold.

Phase one analyses the body of a top-level ``def`` or ``class`` (a *unit*) only when it can
matter: when it may hold a checkpoint call or a hand-written checkpoint, or when a region is
likely to reach it (:mod:`recheck.lint.extract`); the others are outlined, and analysed
later if phase two reads them.  Three things about a file must still be known exactly
before any unit is analysed, and this module finds them without walking every expression:

- the imports and ``global`` declarations of every scope, and the names that statements of
  nested scopes write through (``X[k] = v``, ``X.a = v``, ``del X[k]``): one walk over the
  *statements* of each unit (:func:`statement_scan`), which are a small part of its nodes;
- the units where a call may write through a module variable (``X.append(v)``): a text
  scan for ``.append``-like method names, then a look at the name before the dot
  (:func:`call_write_units`); only those units are walked in full;
- the units that may hold a checkpoint entry point: a text scan for the words that can
  spell one (:func:`units_with_words`).

Each scan over-approximates (text in strings and comments counts too), so what it rules
out cannot be there: the facts are the same as when every body is walked.
"""

from __future__ import annotations

import ast
import bisect
import re
import unicodedata
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Sequence

from recheck.lint.scope import MUTATING_METHODS, Scopes, written_through

__all__ = ["StatementScan", "TextLines", "Unit", "call_write_units", "statement_scan", "unit_lines", "units_with_words",
           "used_as_value"]

DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
#: A top-level definition: a unit of lazy analysis.
Unit = ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef
_BLOCKS = ("body", "orelse", "handlers", "finalbody", "cases")
_TARGETS = (ast.Subscript, ast.Attribute)


def unit_lines(node: Unit) -> tuple[int, int]:
    """First and last line of a definition, its decorators included."""
    first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", ()))])
    return first, node.end_lineno or node.lineno


class TextLines:
    """A file's text for literal searches, with each match's line as the parser counts them
    (``\\r\\n`` and a lone ``\\r`` end a line); identifiers are compared NFKC-normalized, as
    the parser does."""

    def __init__(self, text: str) -> None:
        if "\r" in text:
            text = text.replace("\r\n", "\n").replace("\r", "\n")
        if not text.isascii():
            text = unicodedata.normalize("NFKC", text)
        self.text = text
        self._starts: list[int] | None = None

    def line(self, offset: int) -> int:
        if self._starts is None:
            starts, position = [0], 0
            for piece in self.text.split("\n"):
                position += len(piece) + 1
                starts.append(position)
            self._starts = starts
        return bisect.bisect_right(self._starts, offset)

    def occurrences(self, needle: str) -> Iterator[int]:
        """Every offset where ``needle`` starts, overlapping ones included."""
        text, start = self.text, 0
        while True:
            found = text.find(needle, start)
            if found < 0:
                return
            start = found + 1
            yield found

    def words(self, word: str) -> Iterator[int]:
        """Offsets of ``word`` where it is a whole identifier (not part of a longer one)."""
        text, size = self.text, len(word)
        for found in self.occurrences(word):
            if found and _identifier_char(text[found - 1]):
                continue
            end = found + size
            if end < len(text) and _identifier_char(text[end]):
                continue
            yield found

    def word_at(self, offset: int) -> str:
        """The whole identifier around ``offset``."""
        text, first, last = self.text, offset, offset
        while first > 0 and _identifier_char(text[first - 1]):
            first -= 1
        while last < len(text) and _identifier_char(text[last]):
            last += 1
        return text[first:last]


def _identifier_char(char: str) -> bool:
    return char == "_" or char.isalnum()


class _Units:
    """Line ranges of the units, to find the units that hold given lines."""

    def __init__(self, units: Sequence[Unit]) -> None:
        self.units = units
        self.ranges = [unit_lines(u) for u in units]

    def holding(self, lines: Iterable[int]) -> set[int]:
        """Indices of the units whose range holds one of ``lines``."""
        wanted = sorted(set(lines))
        found = set()
        for index, (first, last) in enumerate(self.ranges):
            at = bisect.bisect_left(wanted, first)
            if at < len(wanted) and wanted[at] <= last:
                found.add(index)
        return found


def units_with_words(text: TextLines, units: Sequence[Unit], words: Iterable[str],
                     fragments: Iterable[tuple[str, frozenset[str]]] = (), used: bool = False) -> set[int]:
    """Indices of the units whose text holds one of ``words`` as an identifier, or an
    identifier that contains a fragment and is one of its words (``("heckpoint",
    {"checkpoint", ...})``: one scan finds every spelling that holds the fragment; an empty
    set of words takes any occurrence of the fragment).  With ``used``, only identifiers
    that may be used as code count (see :func:`used_as_value`)."""
    source, found_lines = text.text, list[int]()
    for word in words:
        found_lines += (text.line(at) for at in text.words(word) if not used or used_as_value(source, at, at + len(word)))
    for fragment, spellings in fragments:
        for found in text.occurrences(fragment):
            if not spellings:
                found_lines.append(text.line(found))
                continue
            first = found
            while first > 0 and _identifier_char(source[first - 1]):
                first -= 1
            word = text.word_at(found)
            if word in spellings and (not used or used_as_value(source, first, first + len(word))):
                found_lines.append(text.line(found))
    return _Units(units).holding(found_lines) if found_lines else set()


_OPENERS = frozenset("=(,.[{:")


def used_as_value(source: str, start: int, end: int) -> bool:
    """Whether the identifier at ``source[start:end]`` may be code that calls or hands on
    what it names: called (``name(``, after spaces, line breaks, comments or closing
    parentheses), or written where a value goes (after ``=``, ``(``, ``,``, ``.``, ``[``,
    ``{``, ``:`` or ``else``).  False only for what reads like prose (``a checkpoint that``),
    in a docstring, a message or a comment; when the text before it cannot be read back (a
    line break after a comment that may hide an opener), it counts."""
    at, size = end, len(source)
    while at < size:
        char = source[at]
        if char in " \t\f\r\n\\)":
            at += 1
        elif char == "#":
            line_end = source.find("\n", at)
            at = size if line_end < 0 else line_end
        else:
            break
    if at < size and source[at] == "(":
        return True
    at = start - 1
    while at >= 0 and source[at] in " \t\f\\":
        at -= 1
    if at < 0:
        return False
    if source[at] == "\n":  # first on its line: judge by how the line before ends
        line_start = source.rfind("\n", 0, at) + 1
        before = source[line_start:at].rstrip()
        return "#" in before or not before or before[-1] in _OPENERS or before.endswith("else")
    return source[at] in _OPENERS or (source[at - 3:at + 1] == "else" and (at < 4 or not _identifier_char(source[at - 4])))


#: a mutating method's name after a dot (the longest name first: ``popitem`` before ``pop``)
_MUTATING = re.compile(r"\.[ \t\f]*(" + "|".join(sorted(MUTATING_METHODS, key=len, reverse=True)) + ")")


def call_write_units(text: TextLines, units: Sequence[Unit], candidates: set[str]) -> set[int]:
    """Indices of the units where a call may write through a module variable: a mutating
    method (``.append``, ``.update``, ...) after a name among ``candidates``, or after
    something the scan cannot read back (a closing parenthesis, a line break)."""
    if not candidates:
        return set()
    source, lines = text.text, []
    for match in _MUTATING.finditer(source):  # a method's name after a dot, in C, in one pass
        found, end = match.span(1)
        if end < len(source) and _identifier_char(source[end]):
            continue
        at = match.start() - 1
        while at >= 0 and source[at] in " \t\f":
            at -= 1
        if at < 0:
            continue
        char = source[at]
        if char in ")\n\\":  # `(x).append`, a call's result, or a continued line: look closer
            lines.append(text.line(found))
        elif _identifier_char(char) and text.word_at(at) in candidates:
            lines.append(text.line(found))
    return _Units(units).holding(lines) if lines else set()


@dataclass
class StatementScan:
    """What the statements of one unit's scopes hold."""

    #: the import statements of each scope, scopes in the order the parser's walk opens them
    imports: list[list[ast.AST]] = field(default_factory=list)
    declared_global: set[str] = field(default_factory=set)
    #: names a statement writes through: ``X[k] = v``, ``X.a = v``, ``X.a += v``, ``del X[k]``
    written: set[str] = field(default_factory=set)


def statement_scan(unit: ast.AST, scan: StatementScan) -> None:
    """Add the imports, ``global`` names and written-through names of ``unit`` (a def or a
    class) and of every scope inside it to ``scan``.  Only statements are visited: an
    import, a ``global`` or an assignment cannot sit inside an expression."""
    group: list[ast.AST] = []
    scan.imports.append(group)
    stack = list(reversed(unit.body))  # type: ignore[attr-defined]
    while stack:
        node = stack.pop()
        kind = type(node)
        if kind is ast.Import or kind is ast.ImportFrom:
            group.append(node)
        elif kind is ast.Global:
            scan.declared_global.update(node.names)  # type: ignore[attr-defined]
        elif kind is ast.Assign or kind is ast.Delete:
            _written(node.targets, scan.written)  # type: ignore[attr-defined]
        elif kind is ast.AugAssign or kind is ast.AnnAssign:
            _written([node.target], scan.written)  # type: ignore[attr-defined]
        elif kind in DEFINITIONS:
            statement_scan(node, scan)  # its scope opens here, after this one
        else:
            for name in _BLOCKS:
                block = getattr(node, name, None)
                if block:
                    stack.extend(reversed(block))


def _written(targets: list[ast.AST], names: set[str]) -> None:
    for target in targets:
        if isinstance(target, _TARGETS) and type(target.value) is ast.Name:  # type: ignore[attr-defined]
            names.add(target.value.id)  # type: ignore[attr-defined]


def call_writes(scopes: Scopes, scope: ast.AST) -> Iterator[str]:
    """Every name written through in ``scope`` and the scopes inside it (all nodes walked)."""
    yield from written_through(scopes.of(scope))
    for inner in scopes.within(scope):
        yield from written_through(scopes.of(inner))
