"""RC104: a checkpointed region writes state that outlives it (attributes, globals, closures)."""

from __future__ import annotations

import ast
from typing import Iterator

from recheck.lint.facts import Hazard
from recheck.lint.imports import dotted
from recheck.lint.scope import MUTATING_METHODS, FunctionContext

CODE = "RC104"
PRESENT = {"incremented": "increments", "updated": "updates", "assigned": "assigns"}
NODES = (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Call)


def _outside_state(node: ast.AST, ctx: FunctionContext) -> str | None:
    """What kind of outside state the name chain ``node`` is, or None for local state."""
    parts = dotted(node)
    if not parts:
        return None
    head = parts[0]
    if ctx.self_name is not None and head == ctx.self_name and len(parts) > 1:
        return "attribute"
    if head in ctx.declared_nonlocal or (head in ctx.closure_names and not ctx.is_local(head)):
        return "closure variable"
    if ctx.is_global_variable(head):
        return "global"
    return None


def _assignment(target: ast.AST, augmented: ast.operator | None, ctx: FunctionContext) -> Hazard | None:
    if id(target) in ctx.memo_targets:  # a cache filled once, under a guard that tests it
        return None
    verb = "incremented" if isinstance(augmented, ast.Add) else "updated" if augmented else "assigned"
    if isinstance(target, ast.Name):
        if target.id in ctx.declared_global:
            kind = "global"
        elif target.id in ctx.declared_nonlocal:
            kind = "closure variable"
        else:
            return None
        return Hazard(CODE, ctx.span(target), f"{kind} `{target.id}` is {verb}",
                      f"recomputation {PRESENT[verb]} it again")
    if isinstance(target, ast.Attribute) and _outside_state(target, ctx) == "attribute":
        return Hazard(CODE, ctx.span(target), f"`{ctx.source(target)}` is {verb}",
                      f"recomputation {PRESENT[verb]} it again")
    if isinstance(target, ast.Subscript):
        kind = _outside_state(target.value, ctx)
        if kind:
            return Hazard(CODE, ctx.span(target), f"{kind} `{ctx.source(target.value)}` is written by item assignment",
                          "recomputation writes it again")
    return None


def check(node: ast.AST, ctx: FunctionContext) -> Iterator[Hazard]:
    if isinstance(node, ast.Call):
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in MUTATING_METHODS:
            kind = _outside_state(func.value, ctx)
            if kind:
                yield Hazard(CODE, ctx.span(node), f"{kind} `{ctx.source(func.value)}` is mutated by `.{func.attr}()`",
                             "recomputation mutates it again")
        return
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    augmented = node.op if isinstance(node, ast.AugAssign) else None
    for target in targets:
        for element in target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target]:
            hazard = _assignment(element, augmented, ctx)
            if hazard:
                yield hazard
