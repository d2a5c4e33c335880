"""The outline (lazy phase one) gives the facts a full extraction gives, only later.

Phase one analyses the bodies of the top-level definitions that can matter and outlines
the rest (recheck/lint/outline.py); an outlined body is analysed when phase two reads it.
These tests hold that to the facts of analysing every body at once, over the fixtures
(real code shapes) and the linter's own package, and to the findings of the whole engine.
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest

from recheck.lint import engine
from recheck.lint.engine import lint_paths
from recheck.lint.extract import FileExtraction, extract
from recheck.lint.settings import LintOptions
from recheck.lint.outline import TextLines, used_as_value
from recheck.lint.scope import Scopes

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted([*(ROOT / "fixtures").rglob("*.py"), *(ROOT / "recheck" / "lint").rglob("*.py")])


def _comparable(facts) -> dict:
    """The facts, lists whose order follows the order of analysis as sorted reprs."""
    return {
        "imports": facts.imports, "classes": facts.classes, "functions": facts.functions,
        "call_sites": sorted(map(repr, facts.call_sites)), "file_hazards": sorted(map(repr, facts.file_hazards)),
        "entry_attributes": sorted(facts.entry_attributes),
    }


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_outlined_then_analysed_equals_analysed_at_once(path):
    text = path.read_text()
    module = path.stem
    full = extract(text, str(path), module)
    assert full.outlined == {}
    lazy = FileExtraction(text, str(path), module, lazy=True)
    lazy.analyse_needed(())
    while lazy.facts.outlined:  # what phase two would read, in any order: here last first
        lazy.analyse(sorted(lazy.facts.outlined, reverse=True))
    assert _comparable(lazy.facts) == _comparable(full)


def test_a_body_is_outlined_until_read_and_then_filled(write, tmp_path, monkeypatch):
    # helpers.py is read in phase one for its own checkpoint call; `helper` holds no
    # checkpoint text and nothing of its file reaches it: outlined, then analysed here
    # when the region finder follows model.py's region into it
    monkeypatch.chdir(tmp_path)
    write("model.py", """
        import torch
        from torch.utils.checkpoint import checkpoint
        from helpers import helper

        class Block(torch.nn.Module):
            def forward(self, x):
                return checkpoint(helper, x, use_reentrant=False)
    """)
    write("helpers.py", """
        import random
        from torch.utils.checkpoint import checkpoint

        def unrelated(f, x):
            return checkpoint(f, x, use_reentrant=False)

        def helper(x):
            return x * random.random()
    """)
    result = lint_paths([Path(".")], LintOptions(root=tmp_path, cache_dir=None, jobs=1))
    assert [(f.path, f.line, f.code) for f in result.findings] == [("helpers.py", 9, "RC105")]
    assert result.stats["outlined_analysed_later"] == 1


def test_engine_findings_equal_a_full_extraction(monkeypatch, tmp_path):
    fixtures = ROOT / "fixtures"
    monkeypatch.chdir(fixtures)
    options = LintOptions(root=fixtures, cache_dir=None, jobs=1)
    lazy = lint_paths([Path(".")], options)

    def full_phase_one(job):
        display, text, module, is_package, extra, _demand = job
        return display, extract(text, display, module, is_package, extra)

    monkeypatch.setattr(engine, "_phase_one", full_phase_one)
    full = lint_paths([Path(".")], options)
    assert lazy.findings and [f.to_dict() for f in lazy.findings] == [f.to_dict() for f in full.findings]
    assert lazy.stats["regions"] == full.stats["regions"]


def test_cached_outlines_give_the_same_findings_warm(tmp_path, monkeypatch):
    fixtures = ROOT / "fixtures"
    monkeypatch.chdir(fixtures)
    options = LintOptions(root=fixtures, cache_dir=tmp_path / "cache", jobs=1)
    cold = lint_paths([Path(".")], options)
    for entry in (tmp_path / "cache").rglob("result.json"):  # make phase two run again from the stored facts
        entry.unlink()
    warm = lint_paths([Path(".")], options)
    assert warm.stats["cached"] == cold.stats["parsed"]
    assert [f.to_dict() for f in warm.findings] == [f.to_dict() for f in cold.findings]


@pytest.mark.parametrize("snippet, word, expected", [
    ("y = checkpoint(f, x)", "checkpoint", True),
    ("run(checkpoint, x)", "checkpoint", True),
    ("fn = torch.utils.checkpoint\n", "checkpoint", True),
    ('"""a checkpoint that recomputes"""', "checkpoint", False),
    ("# use a checkpoint here\n", "checkpoint", False),
    ("x = a if b else checkpoint\n", "checkpoint", True),
    ("f = (\n    checkpoint\n)", "checkpoint", True),
])
def test_used_as_value(snippet, word, expected):
    at = snippet.index(word)
    assert used_as_value(snippet, at, at + len(word)) is expected


def test_text_lines_count_lines_as_the_parser_does():
    text = TextLines("a = 1\r\nb = 2\rc = 3\n")
    assert [text.line(text.text.index(name)) for name in "abc"] == [1, 2, 3]


def _reference(scope: ast.AST) -> list[ast.AST]:
    """Every node of ``scope`` but the bodies of the scopes inside it, in source order."""
    out: list[ast.AST] = []

    def visit(node: ast.AST, top: bool) -> None:
        out.append(node) if not top else None
        nested = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)) and not top
        for name, value in ast.iter_fields(node):
            if nested and name == "body":
                continue
            for child in (value if isinstance(value, list) else [value]):
                if isinstance(child, ast.AST) and not isinstance(child, (ast.expr_context,)):
                    visit(child, False)

    if isinstance(scope, ast.Lambda):
        visit(scope.body, False)
    else:
        for statement in scope.body:  # type: ignore[attr-defined]
            visit(statement, False)
    return out


@pytest.mark.parametrize("path", SOURCES[::4], ids=lambda p: str(p.relative_to(ROOT)))
def test_scopes_partition_every_node_once(path):
    tree = ast.parse(path.read_text())
    scopes = Scopes(tree)
    pending = [tree]
    while pending:
        scope = pending.pop()
        assert [id(n) for n in scopes.of(scope)] == [id(n) for n in _reference(scope)]
        pending += scopes.nested(scope)


def test_scopes_partition_skips_name_lists_and_none_holes():
    """``global``/``nonlocal`` names and a class pattern's attribute names are no nodes; a
    ``**`` dict key and a keyword-only parameter with no default are None in their lists."""
    tree = ast.parse(textwrap.dedent("""
        def f(p, /, q=1, *r, s, t=2, **u):
            global x, y
            def g():
                nonlocal p
                return {**u, "k": 1, **{}}
            match p:
                case C(1, k=2, j=[3, *rest]) if q: pass
                case {"a": 1, **rest2}: pass
                case None | True: pass
                case [a, b, *_] as z: pass
            return lambda w, *, v, z=3: w + v
    """))
    scopes = Scopes(tree)
    pending: list[ast.AST] = [tree]
    while pending:
        scope = pending.pop()
        assert [id(n) for n in scopes.of(scope)] == [id(n) for n in _reference(scope)]
        pending += scopes.nested(scope)


def test_scopes_keep_nodes_in_constants_positions_and_names_out():
    tree = ast.parse(textwrap.dedent("""
        import os as o
        def f(a: int = 1, *, b=lambda: 2):
            global G
            return o.path, f"{a!r}"
    """))
    kinds = {type(n).__name__ for n in Scopes(tree).of(tree)}
    assert {"Import", "alias", "FunctionDef", "arguments", "arg", "Lambda", "Constant", "Name"} <= kinds


def test_an_outlined_body_that_cannot_be_analysed_is_a_file_error(write, tmp_path, monkeypatch):
    # phase one reads helpers.py but outlines `helper`; if analysing it later raises (a
    # recursion too deep for the rules), the file is reported and the run completes
    monkeypatch.chdir(tmp_path)
    write("model.py", """
        import torch
        from torch.utils.checkpoint import checkpoint
        from helpers import helper

        def noisy(x):
            print("recomputed too")
            return x

        class Block(torch.nn.Module):
            def forward(self, x):
                x = checkpoint(noisy, x, use_reentrant=False)
                return checkpoint(helper, x, use_reentrant=False)
    """)
    write("helpers.py", """
        from torch.utils.checkpoint import checkpoint

        def unrelated(f, x):
            return checkpoint(f, x, use_reentrant=False)

        def helper(x):
            return x
    """)
    analyse_needed = FileExtraction.analyse_needed

    def deep(self, demand=(), regions=True, skip=()):
        if not regions and self.facts.path == "helpers.py":  # the later analysis of an outlined unit
            raise RecursionError("maximum recursion depth exceeded")
        return analyse_needed(self, demand, regions, skip)

    monkeypatch.setattr(FileExtraction, "analyse_needed", deep)
    result = lint_paths([Path(".")], LintOptions(root=tmp_path, cache_dir=None, jobs=1))
    assert [(e.path, e.reason) for e in result.errors] == [("helpers.py", "too deeply nested to parse (RecursionError)")]
    assert [(f.path, f.code) for f in result.findings] == [("model.py", "RC103")]
