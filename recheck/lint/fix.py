"""``--fix``: add ``use_reentrant=False`` to the calls RC001 flags.

A fix is an insertion into the file's own bytes and nothing else: the file is read again as
bytes, decoded with its own encoding (:func:`tokenize.detect_encoding`: a coding line, a
UTF-8 BOM), and ``, use_reentrant=False`` is spliced in after each flagged call's last
argument, so the BOM, a form feed, CRLF or CR line endings, and every byte of a latin-1 or
cp1252 file stay as they were.  The calls are found with the standard library's :mod:`ast`,
the same parser whose positions the findings carry.  A call whose argument list ends with a
trailing comma gets the keyword on a line of its own, in the file's indentation and line
ending.  A call with a ``**`` splat is never flagged (the keyword may travel in it), so never
rewritten.

What is written, and how (each refusal is a line naming the file and why; the rest goes on):

- only regular files that resolve inside the paths the user gave: a symbolic link in the tree
  whose target lies outside it is left alone (one inside is fixed at its target, once, and
  stays a link);
- only a file whose text is still the one linted, and only when the fixed text parses and
  its bytes decode back to it;
- all or nothing (:func:`recheck.safe_files.write_atomically`): a full disk, a missing
  permission or a kill leaves the original whole.
"""

from __future__ import annotations

import ast
import codecs
import io
import os
import re
import stat
import tokenize
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from recheck.findings import Finding
from recheck.safe_files import write_atomically

__all__ = ["FixOutcome", "fix_use_reentrant"]

KEYWORD = "use_reentrant=False"
_NEWLINE = re.compile(r"\r\n|\r|\n")  # what Python's tokenizer counts as a line break (not \f, \x85, \u2028)
Positions = set[tuple[int, int]]  # (line, column) of findings, 1-based, columns in characters


@dataclass
class FixOutcome:
    """``fixed``: the ``(path, line, column)`` of every finding fixed; ``skipped``: one line per
    file or call left unfixed, ``path: not fixed: reason`` (its findings stay reported)."""

    fixed: set[tuple[str, int, int]] = field(default_factory=set)
    skipped: list[str] = field(default_factory=list)


class _NotFixed(Exception):
    """Why a file is left as it is (the message completes ``path: not fixed: ...``)."""


def fix_use_reentrant(findings: Iterable[Finding], sources: dict[str, str],
                      within: Iterable[str | os.PathLike[str]] | None = None) -> FixOutcome:
    """Fix the files of the RC001 findings; ``sources``: the text each was linted from, by
    display path; ``within``: the paths the user gave (``None``: no bound, for callers that
    chose the files themselves)."""
    by_path: dict[str, set[tuple[int, int]]] = {}
    for finding in findings:
        if finding.code == "RC001" and finding.path and finding.line and finding.column:
            by_path.setdefault(finding.path, set()).add((finding.line, finding.column))
    roots = None if within is None else [Path(p).resolve() for p in within]
    outcome = FixOutcome()
    by_target: dict[Path, list[str]] = {}
    for display in by_path:
        try:
            by_target.setdefault(_writable_target(display, roots), []).append(display)
        except _NotFixed as exc:
            outcome.skipped.append(f"{display}: not fixed: {exc}")
        except (OSError, RuntimeError) as exc:  # RuntimeError: a symbolic link loop
            outcome.skipped.append(f"{display}: not fixed: cannot resolve the path: {_reason(exc)}")
    for target, displays in by_target.items():
        display = displays[0]  # links to one file: it is fixed once, and all their findings with it
        linted = sources.get(display)
        if linted is None or any(sources.get(d) != linted for d in displays):
            outcome.skipped.append(f"{display}: not fixed: it changed while it was linted")
            continue
        try:
            done, missed = _fix_file(target, linted, set().union(*(by_path[d] for d in displays)))
        except _NotFixed as exc:
            outcome.skipped.append(f"{display}: not fixed: {exc}")
            continue
        except OSError as exc:
            outcome.skipped.append(f"{display}: not fixed: cannot write it: {_reason(exc)}; the file is unchanged")
            continue
        except Exception as exc:  # noqa: BLE001 - one file's surprise never stops the others
            outcome.skipped.append(f"{display}: not fixed: {type(exc).__name__}: {exc}; the file is unchanged")
            continue
        outcome.skipped += [f"{display}:{line}:{column}: not fixed: the call's argument list cannot take the keyword "
                            "as written; add it by hand" for line, column in sorted(missed)]
        outcome.fixed |= {(d, line, column) for d in displays for line, column in done}
    return outcome


def _reason(exc: BaseException) -> str:
    return exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)


def _writable_target(display: str, roots: list[Path] | None) -> Path:
    """The regular file ``display`` resolves to, if a fix may write it."""
    target = Path(display).resolve(strict=True)
    if roots is not None and not any(target == root or root in target.parents for root in roots):
        raise _NotFixed(f"it resolves to {target}, outside the paths given; a fix writes only files inside them")
    if not stat.S_ISREG(os.stat(target).st_mode):
        raise _NotFixed("not a regular file")
    return target


def _fix_file(target: Path, linted: str, positions: Positions) -> tuple[Positions, Positions]:
    """Insert the keyword into ``target``'s bytes; return the positions fixed and those missed."""
    try:
        with open(target, "rb") as handle:
            data = handle.read(8 * len(linted) + 64)  # more than any encoding of the linted text takes
    except OSError as exc:
        raise _NotFixed(f"cannot read it again: {_reason(exc)}") from None
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        text = data.decode(encoding)  # "utf-8-sig" drops the BOM, as the linter's reader does
    except (SyntaxError, UnicodeDecodeError, LookupError) as exc:
        raise _NotFixed(f"its encoding cannot be read back ({exc})") from None
    if text != linted:
        raise _NotFixed("it changed since it was linted")
    insertions = _insertions(text, positions)
    if not insertions:
        return set(), positions
    codec = "utf-8" if encoding == "utf-8-sig" else encoding
    at, at_byte = 0, len(codecs.BOM_UTF8) if encoding == "utf-8-sig" else 0  # detect_encoding saw one
    new_data, new_text = [data[:at_byte]], []
    for offset, inserted, _ in insertions:  # every byte between the insertions is the file's own
        end_byte = at_byte + len(text[at:offset].encode(codec))
        new_data += [data[at_byte:end_byte], inserted.encode(codec)]
        new_text += [text[at:offset], inserted]
        at, at_byte = offset, end_byte
    new_data.append(data[at_byte:])
    new_text.append(text[at:])
    fixed = "".join(new_text)
    if b"".join(new_data).decode(encoding) != fixed:  # a stateful codec: the offsets above do not hold
        raise _NotFixed(f"its {encoding} bytes do not map one to one onto its text")
    try:
        ast.parse(fixed)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise _NotFixed("the fixed source would not parse") from None
    write_atomically(target, b"".join(new_data))
    done = {position for _, _, position in insertions}
    return done, positions - done


def _insertions(text: str, positions: set[tuple[int, int]]) -> list[tuple[int, str, tuple[int, int]]]:
    """``(character offset, text to insert, finding position)`` for each flagged call that can
    take the keyword, in file order."""
    starts = [0, *(m.end() for m in _NEWLINE.finditer(text))]

    def offset(line: int, byte_column: int) -> int:
        start = starts[line - 1]
        end = starts[line] if line < len(starts) else len(text)
        return start + len(text[start:end].encode("utf-8")[:byte_column].decode("utf-8", "replace"))

    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise _NotFixed("it does not parse") from None
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        begin = offset(node.lineno, node.col_offset)
        position = (node.lineno, begin - starts[node.lineno - 1] + 1)
        if position not in positions:
            continue
        arguments: list[ast.expr | ast.keyword] = [*node.args, *node.keywords]
        if not arguments or any(k.arg in (None, "use_reentrant") for k in node.keywords):
            continue
        last = max(arguments, key=lambda a: (a.end_lineno or 0, a.end_col_offset or 0))
        planned = _plan(text, offset(last.end_lineno or last.lineno, last.end_col_offset or 0),
                        offset(node.end_lineno or node.lineno, node.end_col_offset or 0),
                        offset(last.lineno, last.col_offset), starts)
        if planned is not None:
            found.append((*planned, position))
    return sorted(found)


def _blank_end(text: str, at: int, end: int) -> int:
    """Past spaces, line breaks, comments and backslash continuations from ``at``."""
    while at < end:
        if text[at] == "#":
            match = _NEWLINE.search(text, at, end)
            at = match.start() if match else end
        elif text[at] == "\\" or text[at].isspace():
            at += 1
        else:
            break
    return at


def _plan(text: str, after_last: int, call_end: int, last_start: int, starts: list[int]) -> tuple[int, str] | None:
    """Where the keyword goes and with what separator; ``None`` when the call's text is not
    ``...last argument [,] )`` (an unparenthesized generator expression, say)."""
    closing = call_end - 1
    at = after_last
    while True:  # past the closing parentheses of a parenthesized last argument
        blank = _blank_end(text, at, closing)
        if blank < closing and text[blank] == ")":
            at = blank + 1
            continue
        break
    rest = _blank_end(text, at, closing)
    trailing = rest < closing and text[rest] == ","
    if trailing:
        rest = _blank_end(text, rest + 1, closing)
    if rest != closing or text[closing] != ")":
        return None
    if trailing:  # one argument a line: the keyword gets its own line, indented as the last argument
        line = max(i for i, start in enumerate(starts) if start <= last_start)
        lead = text[starts[line]:last_start]
        indent = lead[:len(lead) - len(lead.lstrip())]
        if line > 0 and not lead.replace("(", "").strip():
            newline = "\r\n" if text.endswith("\r\n", 0, starts[line]) else text[starts[line] - 1]
            return at, f",{newline}{indent}{KEYWORD}"
    return at, f", {KEYWORD}"
