"""``--fix``: add ``use_reentrant=False`` to the calls RC001 flags, with libcst.

libcst keeps every comment and space of the file; only the flagged calls change.  A call
with a ``**`` splat is never flagged (the keyword may travel in it), so never rewritten.
A file is written all or nothing (:func:`recheck.safe_files.write_atomically`): a full disk,
a missing permission or a kill leaves the original whole, and the file is named in a line
saying it was not fixed; the other files are still fixed.  Only regular files that resolve
inside the paths the user gave are written: a symbolic link in the tree whose target lies
outside it is left alone (one inside is fixed at its target, once, and stays a link).
"""

from __future__ import annotations

import os
import stat
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from recheck.findings import Finding
from recheck.safe_files import write_atomically

__all__ = ["FixOutcome", "fix_use_reentrant"]


@dataclass
class FixOutcome:
    """``fixed``: the ``(path, line, column)`` of every finding fixed; ``skipped``: one line per
    file left unfixed, ``path: not fixed: reason`` (its findings stay reported)."""

    fixed: set[tuple[str, int, int]] = field(default_factory=set)
    skipped: list[str] = field(default_factory=list)


class _NotFixed(Exception):
    """Why a file is left as it is (the message completes ``path: not fixed: ...``)."""


def _rewrite(source: str, positions: set[tuple[int, int]]) -> tuple[str, int]:
    with warnings.catch_warnings():  # libcst.metadata imports a deprecated mypy_extensions API
        warnings.simplefilter("ignore", DeprecationWarning)
        import libcst as cst
        from libcst.metadata import MetadataWrapper, PositionProvider

    class AddUseReentrant(cst.CSTTransformer):
        METADATA_DEPENDENCIES = (PositionProvider,)

        def __init__(self) -> None:
            super().__init__()
            self.fixed = 0

        def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.Call:
            start = self.get_metadata(PositionProvider, original).start
            if (start.line, start.column + 1) not in positions or not updated.args:
                return updated
            if any(a.keyword is not None and a.keyword.value == "use_reentrant" for a in updated.args):
                return updated
            self.fixed += 1
            args = list(updated.args)
            last = args[-1]
            if isinstance(last.comma, cst.Comma):  # trailing comma: keep the layout, one per line
                separator = args[-2].comma if len(args) > 1 and isinstance(args[-2].comma, cst.Comma) else cst.Comma(
                    whitespace_after=cst.SimpleWhitespace(" "))
                args[-1] = last.with_changes(comma=separator)
                new_comma: cst.Comma | cst.MaybeSentinel = last.comma
            else:
                args[-1] = last.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
                new_comma = cst.MaybeSentinel.DEFAULT
            args.append(cst.Arg(
                keyword=cst.Name("use_reentrant"), value=cst.Name("False"),
                equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")),
                comma=new_comma,
            ))
            return updated.with_changes(args=args)

    wrapper = MetadataWrapper(cst.parse_module(source))
    transformer = AddUseReentrant()
    module = wrapper.visit(transformer)
    return module.code, transformer.fixed


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
        positions = set().union(*(by_path[d] for d in displays))
        new_source, count = _rewrite(linted, positions)
        if count:
            try:
                write_atomically(target, new_source.encode("utf-8"))
            except OSError as exc:
                outcome.skipped.append(f"{display}: not fixed: cannot write it: {_reason(exc)}; the file is unchanged")
                continue
            outcome.fixed |= {(d, line, column) for d in displays for line, column in positions}
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
