"""RC102: a checkpointed region moves tensors between devices."""

from __future__ import annotations

import ast
from typing import Iterator

from recheck.lint.facts import Hazard
from recheck.lint.rules.base import Rule
from recheck.lint.scope import FunctionContext

CODE = "RC102"
DEVICE_PREFIXES = ("cuda", "cpu", "mps", "xla", "xpu", "npu", "hpu", "meta", "privateuseone")
THEN = "checkpoint preserves RNG state only on the devices of its tensor arguments"


def _device_string(node: ast.AST) -> str | None:
    """The device type a string literal such as ``"cuda:0"`` names, or None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        kind = node.value.split(":")[0]
        if kind in DEVICE_PREFIXES:
            return kind
    return None


def _is_device_value(node: ast.AST, ctx: FunctionContext) -> bool:
    """A device string, ``torch.device(...)``, or a device argument or global.

    ``t.device`` (and a local variable or argument, typically ``device = t.device`` or
    ``device=self.weight.device`` passed by the caller) is not a move to a new device: it
    aligns with a tensor the region already holds, whose device is an input's or was
    reached by another move (flagged there).  transformers does this hundreds of times
    for model parallelism.  Module-level device globals are moves.
    """
    kind = _device_string(node)
    if kind is not None:
        return kind != "cpu"  # the CPU's RNG state is always preserved
    if isinstance(node, ast.Call) and ctx.qualify(node.func) == "torch.device":
        return not (node.args and _device_string(node.args[0]) == "cpu")
    if isinstance(node, ast.Name) and "device" in node.id.lower():
        return not ctx.is_local(node.id) and node.id not in ctx.closure_names
    return False


class DeviceMove(Rule):
    CODE = CODE
    NODES = (ast.Call,)

    def visit(self, node: ast.Call, ctx: FunctionContext) -> Iterator[Hazard]:  # type: ignore[override]
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr == "cuda" and not node.args:  # .cpu(): its RNG is preserved
            qualified = ctx.qualify(func)
            if qualified is None or not qualified.startswith("torch."):
                yield Hazard(CODE, ctx.span(node), f"`{ctx.source(func)}()` moves a tensor to another device", THEN)
            return
        if isinstance(func, ast.Attribute) and func.attr == "to":
            moved = [a for a in node.args[:1] if _is_device_value(a, ctx)]
            moved += [k.value for k in node.keywords if k.arg == "device" and _is_device_value(k.value, ctx)]
            if moved:
                yield Hazard(CODE, ctx.span(node), f"`{ctx.source(node)}` moves a tensor to another device", THEN)
            return
        for keyword in node.keywords:
            if keyword.arg == "device" and (
                _device_string(keyword.value) not in (None, "cpu")
                or (isinstance(keyword.value, ast.Call) and ctx.qualify(keyword.value.func) == "torch.device")
            ):
                yield Hazard(CODE, ctx.span(keyword.value),
                             f"`{ctx.source(keyword.value)}` creates a tensor on an explicit device", THEN)


TABLE = "body"
# -- cases: region bodies, run by tests/lint/test_rule_tables.py inside a checkpointed ``Block.forward``
# (its harness defines the names they use); INVALID gives (line, column, part of the message) per finding
INVALID = [
    ("return x.cuda()", [(1, 16, "`x.cuda()` moves a tensor to another device")]),
    ("return x.to('cuda:1')", [(1, 16, "`x.to('cuda:1')` moves a tensor to another device")]),
    ("return torch.zeros(4, device='cuda')", [(1, 38, "`'cuda'` creates a tensor on an explicit device")]),
]
VALID = [
    "return x.cpu()",  # the CPU's RNG state is always preserved
    "return x.to(x.device)",
    "return x.to(self.lin.weight.device)",
    "return x.to(torch.float64)",
]
