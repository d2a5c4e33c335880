"""``--fix``: add ``use_reentrant=False`` to the calls RC001 flags, with libcst.

libcst keeps every comment and space of the file; only the flagged calls change.  A call
with a ``**`` splat is never flagged (the keyword may travel in it), so never rewritten.
A file is written all or nothing (:func:`recheck.safe_files.write_atomically`): a full disk,
a missing permission or a kill leaves the original whole, and the file is named in a line
saying it was not fixed; the other files are still fixed.
"""

from __future__ import annotations

import os
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
    """Rewrite the files of the RC001 findings; ``within``: the paths the user gave."""
    by_path: dict[str, set[tuple[int, int]]] = {}
    for finding in findings:
        if finding.code == "RC001" and finding.path and finding.line and finding.column:
            by_path.setdefault(finding.path, set()).add((finding.line, finding.column))
    outcome = FixOutcome()
    for path, positions in by_path.items():
        new_source, count = _rewrite(sources[path], positions)
        if count:
            try:
                write_atomically(Path(path), new_source.encode("utf-8"))
            except OSError as exc:
                reason = exc.strerror or str(exc)
                outcome.skipped.append(f"{path}: not fixed: cannot write it: {reason}; the file is unchanged")
                continue
            outcome.fixed |= {(path, line, column) for line, column in positions}
    return outcome
