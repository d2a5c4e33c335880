"""RC109: a custom ``autograd.Function`` whose ``backward`` reads ``ctx.saved_tensors`` more than once.

Non-reentrant checkpointing does not keep the tensors a region saves: it packs each one as a
handle, and the first unpack in backward recomputes the region and hands the recomputed
tensor over, once.  A second read of ``ctx.saved_tensors`` unpacks the same handles again and
torch raises ("Unpack is being triggered for a tensor that was already unpacked once").  A
read in a loop is a second read on the loop's second turn.  Two reads in the two branches of
one ``if`` are one read on every path: clean.

The hazard is recorded on the Function's ``forward`` (what ``Function.apply`` runs) and
counts only where a region reaches that ``forward`` and is not known to be checkpointed
reentrantly: outside checkpointing, or under the reentrant implementation (whose backward
runs the recomputed graph with ordinary saved tensors), the second read is harmless.
"""

from __future__ import annotations

import ast
from typing import Iterator

from recheck.lint.facts import Hazard
from recheck.lint.rules.base import RegionHit, RegionView, Rule
from recheck.lint.scope import FunctionContext

CODE = "RC109"
#: the tag a hazard carries when it counts only under non-reentrant checkpointing
NON_REENTRANT = "non-reentrant"
LOOPS = (ast.For, ast.AsyncFor, ast.While, ast.comprehension)
THEN = ("non-reentrant checkpointing hands each saved tensor over once, so the second unpack raises in backward; "
        "read `ctx.saved_tensors` once into local names")


def _is_function(bases: list[str]) -> bool:
    return any(base.endswith(("autograd.Function", "autograd.function.Function")) for base in bases)


def _reads(backward: ast.FunctionDef | ast.AsyncFunctionDef) -> list[tuple[ast.Attribute, tuple[tuple[int, str], ...], bool]]:
    """Each ``ctx.saved_tensors`` read: the node, its ``if`` branches ``(id(if), "body"|"orelse")``
    from the outside in, and whether a loop encloses it (nested functions are not descended)."""
    ctx_name = backward.args.args[0].arg
    found = []

    def visit(node: ast.AST, branches: tuple[tuple[int, str], ...], looped: bool) -> None:
        if isinstance(node, ast.Attribute) and node.attr == "saved_tensors" \
                and isinstance(node.value, ast.Name) and node.value.id == ctx_name:
            found.append((node, branches, looped))
            return
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            return
        if isinstance(node, (ast.If, ast.IfExp)):
            visit(node.test, branches, looped)
            for name in ("body", "orelse"):
                children = getattr(node, name)
                for child in children if isinstance(children, list) else [children]:
                    visit(child, (*branches, (id(node), name)), looped)
            return
        if isinstance(node, ast.ListComp | ast.SetComp | ast.GeneratorExp | ast.DictComp):
            for generator in node.generators:
                visit(generator.iter, branches, looped)  # the first iterable is read once
                for condition in generator.ifs:
                    visit(condition, branches, True)
            for part in ("elt", "key", "value"):
                if hasattr(node, part):
                    visit(getattr(node, part), branches, True)
            return
        if isinstance(node, (ast.For, ast.AsyncFor)):
            visit(node.iter, branches, looped)
            for child in [node.target, *node.body, *node.orelse]:
                visit(child, branches, True)
            return
        if isinstance(node, ast.While):
            for child in [node.test, *node.body, *node.orelse]:
                visit(child, branches, True)
            return
        for child in ast.iter_child_nodes(node):
            visit(child, branches, looped)

    for statement in backward.body:
        visit(statement, (), False)
    return found


def _exclusive(first: tuple[tuple[int, str], ...], second: tuple[tuple[int, str], ...]) -> bool:
    """Whether two reads sit in different branches of one ``if``: no path runs both."""
    return any(a[0] == b[0] and a[1] != b[1] for a, b in zip(first, second))


class SavedTensorsTwice(Rule):
    CODE = CODE

    def visit_class(self, node: ast.ClassDef, bases: list[str], ctx: FunctionContext) -> Iterator[tuple[str | None, Hazard]]:
        """``("forward", hazard)`` at the repeated read when the class is an ``autograd.Function``
        whose ``backward`` can read ``ctx.saved_tensors`` twice on one path."""
        if not _is_function(bases):
            return
        backward = next((n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                         and n.name == "backward"), None)
        if backward is None or not backward.args.args:
            return
        reads = _reads(backward)
        for index, (read, branches, looped) in enumerate(reads):
            if looped:
                what = f"`{node.name}.backward` reads `ctx.saved_tensors` in a loop"
            elif any(not _exclusive(earlier, branches) for _, earlier, _ in reads[:index]):
                what = f"`{node.name}.backward` reads `ctx.saved_tensors` a second time"
            else:
                continue
            yield "forward", Hazard(CODE, ctx.span(read), what, THEN, NON_REENTRANT)
            return  # one finding per Function: the first read that repeats

    def settle(self, hits: list[RegionHit], view: RegionView) -> list[RegionHit]:
        if not view.reentrant:
            return hits  # the reentrant implementation's backward reads ordinary saved tensors
        return [hit for hit in hits if not (hit[1].code == CODE and hit[1].tag == NON_REENTRANT)]


# -- cases: whole modules, run by tests/lint/test_rule_tables.py; INVALID gives (line, column,
# part of the message) per finding
_FUNCTION = '''\
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


class LoRAMatmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, a, b):
        ctx.save_for_backward(x, a, b)
        return x @ a @ b

    @staticmethod
    def backward(ctx, grad):
{backward}


class LoRALinear(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Parameter(torch.zeros(8, 2))
        self.b = nn.Parameter(torch.zeros(2, 8))

    def forward(self, x):
        return LoRAMatmul.apply(x, self.a, self.b)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.adapter = LoRALinear()

    def forward(self, x):
        return checkpoint(self.adapter, x, use_reentrant={reentrant})
'''
_TWICE = '''\
        x, a, b = ctx.saved_tensors
        grad_x = grad @ b.t() @ a.t()
        grad_a = x.t() @ (grad @ ctx.saved_tensors[2].t())
        return grad_x, grad_a, (x @ a).t() @ grad'''
_LOOP = '''\
        grads = []
        for i in range(3):
            grads.append(grad.sum() * ctx.saved_tensors[i])
        return tuple(grads)'''
_ONCE = '''\
        x, a, b = ctx.saved_tensors
        return grad @ b.t() @ a.t(), x.t() @ grad @ b.t(), (x @ a).t() @ grad'''
_BRANCHES = '''\
        if ctx.needs_input_grad[0]:
            x, a, b = ctx.saved_tensors
            return grad @ b.t() @ a.t(), None, None
        else:
            x, a, b = ctx.saved_tensors
            return None, x.t() @ grad @ b.t(), (x @ a).t() @ grad'''
INVALID = [
    (_FUNCTION.format(backward=_TWICE, reentrant=False),
     [(16, 34, "`LoRAMatmul.backward` reads `ctx.saved_tensors` a second time")]),
    (_FUNCTION.format(backward=_LOOP, reentrant=False),
     [(16, 39, "`LoRAMatmul.backward` reads `ctx.saved_tensors` in a loop")]),
]
VALID = [
    _FUNCTION.format(backward=_ONCE, reentrant=False),
    _FUNCTION.format(backward=_BRANCHES, reentrant=False),
    _FUNCTION.format(backward=_TWICE, reentrant=True),  # reentrant backward reads ordinary saved tensors
    _FUNCTION.format(backward=_TWICE, reentrant=False).replace(  # the Function runs outside the region
        "return checkpoint(self.adapter, x, use_reentrant=False)", "return self.adapter(x)"),
]
