"""RC107: a checkpointed region mutates one of its own arguments in place."""

from __future__ import annotations

import ast
from typing import Iterator

from recheck.lint.facts import Hazard
from recheck.lint.rules.base import Rule
from recheck.lint.scope import FunctionContext

CODE = "RC107"
NOT_DATA_MUTATION = frozenset({"requires_grad_", "retain_grad_", "share_memory_", "record_stream_"})
SCALAR_TYPES = frozenset({"int", "float", "bool", "str", "complex", "bytes", "tuple", "Optional[int]", "Optional[float]"})
THEN = "the caller's tensor changes, so recomputation starts from a different input"
#: Only the region's own arguments are its inputs: a helper's arguments are mostly tensors
#: made inside the region, which it may update freely (a known miss: an input passed through).
ROOT = "root"


def _is_in_place_method(name: str) -> bool:
    return name.endswith("_") and not name.endswith("__") and not name.startswith("_") and name not in NOT_DATA_MUTATION


def _may_be_tensor(name: str, ctx: FunctionContext) -> bool:
    """False when the annotation or default says the argument is a plain Python scalar."""
    arg = ctx.params[name]
    if arg.annotation is not None and ast.unparse(arg.annotation) in SCALAR_TYPES:
        return False
    default = ctx.defaults.get(name)
    return not (isinstance(default, ast.Constant) and isinstance(default.value, (int, float, str, bool, complex)))


def _argument(node: ast.AST, line: int, ctx: FunctionContext) -> str | None:
    if isinstance(node, ast.Name) and ctx.is_live_param(node.id, line):
        return node.id
    return None


class InputMutation(Rule):
    CODE = CODE
    NODES = (ast.Call, ast.AugAssign, ast.Assign)

    def visit(self, node: ast.Call | ast.AugAssign | ast.Assign,  # type: ignore[override]
              ctx: FunctionContext) -> Iterator[Hazard]:
        line = node.lineno
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and _is_in_place_method(func.attr):
                name = _argument(func.value, line, ctx)
                if name:
                    yield Hazard(CODE, ctx.span(node), f"argument `{name}` is modified in place by `.{func.attr}()`", THEN, ROOT)
            for keyword in node.keywords:
                name = _argument(keyword.value, line, ctx) if keyword.arg == "out" else None
                if name:
                    yield Hazard(CODE, ctx.span(keyword), f"`out={name}` writes into argument `{name}`", THEN, ROOT)
        elif isinstance(node, ast.AugAssign):
            name = _argument(node.target, line, ctx)
            if name and _may_be_tensor(name, ctx):
                yield Hazard(CODE, ctx.span(node.target), f"argument `{name}` is modified in place by an augmented assignment", THEN, ROOT)
        else:
            for target in node.targets:
                name = _argument(target.value, line, ctx) if isinstance(target, ast.Subscript) else None
                if name:
                    yield Hazard(CODE, ctx.span(target), f"argument `{name}` is written by item assignment", THEN, ROOT)


TABLE = "body"
# -- cases: region bodies, run by tests/lint/test_rule_tables.py inside a checkpointed ``Block.forward``
# (its harness defines the names they use); INVALID gives (line, column, part of the message) per finding
INVALID = [
    ("x.add_(1)\nreturn x", [(1, 9, "argument `x` is modified in place by `.add_()`")]),
    ("x += 1\nreturn x", [(1, 9, "argument `x` is modified in place by an augmented assignment")]),
    ("x[0] = 0\nreturn x", [(1, 9, "argument `x` is written by item assignment")]),
]
VALID = [
    "y = x.clone()\ny.add_(1)\nreturn y",
    "x = x + 1\nreturn x",  # rebinds the name, the caller's tensor is untouched
    "y = x.detach().clone()\ny[0] = 0\nreturn y",
    "return self.lin(x).relu_()",  # in place on a new tensor
]
