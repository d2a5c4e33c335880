"""``--fix``: add ``use_reentrant=False`` to the calls RC001 flags, with libcst.

libcst keeps every comment and space of the file; only the flagged calls change.  A call
with a ``**`` splat is never flagged (the keyword may travel in it), so never rewritten.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Iterable

from recheck.findings import Finding

__all__ = ["fix_use_reentrant"]


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


def fix_use_reentrant(findings: Iterable[Finding], sources: dict[str, str]) -> set[tuple[str, int, int]]:
    """Rewrite the files of the RC001 findings in place; return ``(path, line, column)`` fixed."""
    by_path: dict[str, set[tuple[int, int]]] = {}
    for finding in findings:
        if finding.code == "RC001" and finding.path and finding.line and finding.column:
            by_path.setdefault(finding.path, set()).add((finding.line, finding.column))
    fixed: set[tuple[str, int, int]] = set()
    for path, positions in by_path.items():
        new_source, count = _rewrite(sources[path], positions)
        if count:
            with open(Path(path), "w", encoding="utf-8", newline="") as handle:
                handle.write(new_source)
            fixed |= {(path, line, column) for line, column in positions}
    return fixed
