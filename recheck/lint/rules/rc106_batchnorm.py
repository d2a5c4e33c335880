"""RC106: BatchNorm in training mode inside a checkpointed region."""

from __future__ import annotations

import ast
from typing import Iterator

from recheck.lint.facts import Hazard, Ref
from recheck.lint.rules.base import Rule
from recheck.lint.scope import FunctionContext

CODE = "RC106"
FUNCTIONS = frozenset({"torch.nn.functional.batch_norm", "torch.batch_norm"})
#: Class names (last component) that are BatchNorm modules; subclasses are found through bases.
MODULE_CLASSES = frozenset({
    "BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "SyncBatchNorm",
    "LazyBatchNorm1d", "LazyBatchNorm2d", "LazyBatchNorm3d", "_BatchNorm",
})
THEN = "in training mode recomputation updates its running statistics a second time"
TRAINING_POSITION = 5  # F.batch_norm(input, running_mean, running_var, weight, bias, training, ...)


def _training(node: ast.Call, ctx: FunctionContext) -> bool:
    """``training=True`` with running statistics to update: ``F.batch_norm(w, None, None,
    training=True)`` (timm's weight standardization) keeps none, and recomputes the same."""
    stats = [*node.args[1:3], *(k.value for k in node.keywords if k.arg in ("running_mean", "running_var"))]
    if stats and all(isinstance(s, ast.Constant) and s.value is None for s in stats):
        return False
    value = node.args[TRAINING_POSITION] if len(node.args) > TRAINING_POSITION else None
    value = next((k.value for k in node.keywords if k.arg == "training"), value)
    if isinstance(value, ast.Constant):
        return value.value is True
    return isinstance(value, ast.Attribute) and value.attr == "training" and ctx.is_self(value.value)


class BatchNorm(Rule):
    CODE = CODE
    NODES = (ast.Call,)

    def visit(self, node: ast.Call, ctx: FunctionContext) -> Iterator[Hazard]:  # type: ignore[override]
        if ctx.qualify(node.func) in FUNCTIONS and _training(node, ctx):
            yield Hazard(CODE, ctx.span(node), f"`{ctx.source(node.func)}(..., training=True)` is called",
                         THEN)

    def outside_call(self, qualified: str, ref: Ref) -> Iterator[Hazard]:
        """Calling submodule ``self.<attr>``, a BatchNorm (subclasses are found through bases)."""
        name = qualified.rsplit(".", 1)[-1]
        if name in MODULE_CLASSES:
            yield Hazard(CODE, ref.span, f"BatchNorm submodule `self.{ref.name}` ({name}) is called", THEN)


TABLE = "body"
# -- cases: region bodies, run by tests/lint/test_rule_tables.py inside a checkpointed ``Block.forward``
# (its harness defines the names they use); INVALID gives (line, column, part of the message) per finding
INVALID = [
    ("return self.bn(x)", [(1, 16, "BatchNorm submodule `self.bn` (BatchNorm1d) is called")]),
    ("return F.batch_norm(x, self.mean, self.var, training=True)",
     [(1, 16, "`F.batch_norm(..., training=True)` is called")]),
]
VALID = [
    "return F.batch_norm(x, None, None, training=True)",  # no running statistics to update twice
    "return F.batch_norm(x, None, None, training=False)",
    "return self.lin(x)",
]
