"""Suppression comments: ``# noqa[: CODES]``, ``# recheck: ignore[CODES]``, ``# recheck: ignore-file``."""

from __future__ import annotations

import io
import re
import tokenize

__all__ = ["ALL", "file_ignored", "line_suppressions", "suppressed"]

ALL = "*"
_NOQA = re.compile(r"#\s*noqa(?::\s*(?P<codes>[A-Za-z]+[0-9]+(?:[\s,]+[A-Za-z]+[0-9]+)*))?", re.I)
_IGNORE = re.compile(r"#\s*recheck:\s*ignore(?!-)(?:\[(?P<codes>[^\]]*)\])?")
_IGNORE_FILE = re.compile(r"^[ \t]*#\s*recheck:\s*ignore-file\b", re.M)


def file_ignored(text: str) -> bool:
    """True when a comment line says ``# recheck: ignore-file``."""
    return "ignore-file" in text and _IGNORE_FILE.search(text) is not None


def _codes(raw: str | None) -> set[str]:
    if raw is None or not raw.strip():
        return {ALL}
    return {c.strip().upper() for c in re.split(r"[\s,]+", raw) if c.strip()}


def line_suppressions(text: str) -> dict[int, set[str]]:
    """For each line with a suppression comment, the codes it silences (``ALL`` for bare)."""
    result: dict[int, set[str]] = {}
    lowered = text.lower()
    if "noqa" not in lowered and "recheck:" not in lowered:
        return result
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return result
    for token in tokens:
        if token.type != tokenize.COMMENT:
            continue
        for regex in (_NOQA, _IGNORE):
            match = regex.search(token.string)
            if match:
                result.setdefault(token.start[0], set()).update(_codes(match.group("codes")))
    return result


def suppressed(code: str, lines: tuple[int, ...], table: dict[int, set[str]]) -> bool:
    """True when a comment on any of ``lines`` silences ``code``."""
    for line in lines:
        codes = table.get(line)
        if codes and (ALL in codes or code in codes):
            return True
    return False
