"""RC104: a checkpointed region writes state that outlives it and that the recomputation sees.

Flagged: counters and accumulations (``self.n += 1``, ``self.total = self.total + x``),
growing containers (``self.aux.append(loss)``, ``CACHE[k] = v``), in-place tensor methods on
module state (``self.tokens_per_expert.add_(counts)``), a first-use cache that changes the
branch the recomputation takes (``if self.prev is None: self.prev = x``), ``global`` and
``nonlocal`` rebinding, and mutation of a non-tensor argument (``cache.update(...)``,
``past_key_value.update(...)``).  A plain ``self.x = value`` that nothing in the function
tests and that is not computed from ``self.x`` is not: the recomputation assigns the same
value again (scratch state such as a dispatcher's ``self.routing_map``).
"""

from __future__ import annotations

import ast
import re
from typing import Iterator

from recheck.lint.facts import Hazard
from recheck.lint.imports import dotted
from recheck.lint.rules.base import RegionHit, RegionView, Rule
from recheck.lint.scope import MUTATING_METHODS, FunctionContext

CODE = "RC104"
PRESENT = {"incremented": "increments", "updated": "updates", "assigned": "assigns"}
#: In-place methods that change no data (``requires_grad_``) are not writes.
NOT_DATA_MUTATION = frozenset({"requires_grad_", "retain_grad_", "share_memory_", "record_stream_"})
#: Argument names and annotations that say "a cache object" (mutated through methods).
CACHE_WORDS = ("cache", "past_key_value", "layer_past", "memory_state")
#: Only the region's own arguments are its inputs (see RC107); a cache is one anywhere.
ROOT = "root"
#: Tag of a container mutation, ``mutate:<container>:<method>``: a region that pushes and
#: pops the same stack (``_messages.append(m)`` ... ``_messages.pop()``) leaves it as it was.
MUTATE = "mutate:"
GROWS = frozenset({"append", "extend", "insert", "add", "setdefault"})
SHRINKS = frozenset({"pop", "remove", "discard", "popitem"})


def balanced(tags: list[str]) -> set[str]:
    """Containers that the same region both grows and shrinks (a push/pop stack)."""
    grown = {t[len(MUTATE):].rsplit(":", 1)[0] for t in tags if t.startswith(MUTATE) and t.rsplit(":", 1)[1] in GROWS}
    shrunk = {t[len(MUTATE):].rsplit(":", 1)[0] for t in tags if t.startswith(MUTATE) and t.rsplit(":", 1)[1] in SHRINKS}
    return grown & shrunk


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
    if len(parts) > 1 and head in ctx.module.imports and (head in ctx.imported or not ctx.is_local(head)) \
            and not _CLASS_NAME.match(parts[-1]):
        return "module state"  # another module's global (``parallel_state._TRACKER``), not a class's function
    return None


#: a class (``torch.Tensor``): ``torch.Tensor.add(a, b)`` calls a function, it mutates no state
_CLASS_NAME = re.compile(r"_*[A-Z][a-z]")


def _state(node: ast.AST, ctx: FunctionContext) -> tuple[str, str, str] | None:
    """``(kind, shown, state)`` when ``node`` is outside state, or a local name last bound to
    outside state (``tracker = parallel_state._TRACKER``): the kind, the text that shows it,
    and the state's own source."""
    kind = _outside_state(node, ctx)
    if kind:
        return kind, f"`{ctx.source(node)}`", ctx.source(node)
    if not isinstance(node, ast.Name) or not ctx.is_local(node.id):
        return None
    value = ctx.values.get(node.id)
    kind = _outside_state(value, ctx) if isinstance(value, (ast.Attribute, ast.Name)) else None
    if kind and value is not None:
        return kind, f"`{ctx.source(value)}` (as local `{node.id}`)", ctx.source(value)
    return None


def _state_base(node: ast.AST) -> ast.AST:
    """``self.counts[i]`` -> ``self.counts``: the state an item or slice belongs to."""
    while isinstance(node, ast.Subscript):
        node = node.value
    return node


CONCATENATIONS = frozenset({"cat", "concat", "concatenate", "stack", "hstack", "vstack"})


def _is_attribute(node: ast.AST, attr: str, ctx: FunctionContext) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == attr and ctx.is_self(node.value)


def _accumulates(value: ast.AST, attr: str, ctx: FunctionContext) -> bool:
    """``self.x + v`` (any arithmetic with ``self.x`` an operand) or ``torch.cat([self.x, v])``:
    the new value grows from the old one.  A call that transforms it (``pad(self.x)``) does not
    count: run again from the same start, it gives the same value."""
    if isinstance(value, ast.BinOp):
        return any(_is_attribute(side, attr, ctx) or _accumulates(side, attr, ctx) for side in (value.left, value.right))
    if isinstance(value, ast.Call) and isinstance(value.func, (ast.Attribute, ast.Name)):
        name = value.func.attr if isinstance(value.func, ast.Attribute) else value.func.id
        if name in CONCATENATIONS and value.args and isinstance(value.args[0], (ast.List, ast.Tuple)):
            return any(_is_attribute(e, attr, ctx) for e in value.args[0].elts)
    return False


def _branch_or_accumulation(target: ast.Attribute, value: ast.AST | None, ctx: FunctionContext) -> bool:
    """A plain ``self.x = value`` matters when the function tests whether ``self.x`` is set
    (the recomputation finds it set and takes another branch) or the value grows from it."""
    if target.attr in ctx.tested:
        return True
    return value is not None and _accumulates(value, target.attr, ctx)


def _assignment(target: ast.AST, augmented: ast.operator | None, value: ast.AST | None,
                ctx: FunctionContext) -> Hazard | None:
    if id(target) in ctx.memo_targets:  # a cache filled once, under a guard that tests it
        return None
    verb = "incremented" if isinstance(augmented, ast.Add) else "updated" if augmented else "assigned"
    if isinstance(target, ast.Name):
        if target.id in ctx.declared_global and augmented is None and target.id in ctx.module.lazy_globals:
            return None  # a lazily created singleton or a setup flag: set once, the same again
        if target.id in ctx.declared_global:
            kind: str | None = "global"
        elif target.id in ctx.declared_nonlocal:
            kind = "closure variable"
        else:
            return None
        return Hazard(CODE, ctx.span(target), f"{kind} `{target.id}` is {verb}",
                      f"recomputation {PRESENT[verb]} it again")
    if isinstance(target, ast.Attribute) and augmented and _outside_state(target, ctx) == "module state":
        return Hazard(CODE, ctx.span(target), f"module state `{ctx.source(target)}` is {verb}",
                      f"recomputation {PRESENT[verb]} it again")
    if isinstance(target, ast.Attribute) and _outside_state(target, ctx) == "attribute":
        if augmented is None and not (isinstance(target.value, ast.Name) and _branch_or_accumulation(target, value, ctx)):
            return None
        if augmented is None and target.attr in ctx.tested:
            return Hazard(CODE, ctx.span(target), f"`{ctx.source(target)}` is assigned and tested in the region",
                          "recomputation finds it already set and can take another branch")
        return Hazard(CODE, ctx.span(target), f"`{ctx.source(target)}` is {verb}",
                      f"recomputation {PRESENT[verb]} it again")
    if isinstance(target, ast.Subscript):
        base = _state_base(target.value)  # another module's nested tables: ``_TRACKER[name]["values"][i]``
        state = _state(target.value, ctx) or (_state(base, ctx) if _outside_state(base, ctx) == "module state" else None)
        if state:
            return Hazard(CODE, ctx.span(target), f"{state[0]} {state[1]} is written by item assignment",
                          "recomputation writes it again")
    return None


def _is_cache_argument(name: str, ctx: FunctionContext) -> bool:
    arg = ctx.params.get(name)
    annotation = ast.unparse(arg.annotation) if arg is not None and arg.annotation is not None else ""
    return any(word in name.lower() for word in CACHE_WORDS) or "Cache" in annotation


def _in_place(name: str) -> bool:
    return name.endswith("_") and not name.endswith("__") and not name.startswith("_") and name not in NOT_DATA_MUTATION


def _call(node: ast.Call, ctx: FunctionContext) -> Iterator[Hazard]:
    func = node.func
    if not isinstance(func, ast.Attribute):
        return
    if func.attr in MUTATING_METHODS:
        state = _state(func.value, ctx)
        if state:
            yield Hazard(CODE, ctx.span(node), f"{state[0]} {state[1]} is mutated by `.{func.attr}()`",
                         "recomputation mutates it again", f"{MUTATE}{state[2]}:{func.attr}")
        elif isinstance(func.value, ast.Name) and ctx.is_live_param(func.value.id, node.lineno):
            name = func.value.id
            cache = _is_cache_argument(name, ctx)
            yield Hazard(CODE, ctx.span(node), f"argument `{name}` is mutated by `.{func.attr}()`",
                         "recomputation mutates the caller's object again", "" if cache else ROOT)
        return
    if _in_place(func.attr):
        base = _state_base(func.value)
        if _outside_state(base, ctx) == "attribute" and len(dotted(base) or ()) >= 2:
            yield Hazard(CODE, ctx.span(node), f"`{ctx.source(base)}` is modified in place by `.{func.attr}()`",
                         "recomputation modifies the module's state again")


class StateWrite(Rule):
    CODE = CODE
    NODES = (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Call)
    BRANCH_SENSITIVE = True

    def visit(self, node: ast.Call | ast.Assign | ast.AugAssign | ast.AnnAssign,  # type: ignore[override]
              ctx: FunctionContext) -> Iterator[Hazard]:
        if isinstance(node, ast.Call):
            yield from _call(node, ctx)
            return
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        augmented = node.op if isinstance(node, ast.AugAssign) else None
        for target in targets:
            for element in target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target]:
                hazard = _assignment(element, augmented, node.value, ctx)
                if hazard:
                    yield hazard


    def settle(self, hits: list[RegionHit], view: RegionView) -> list[RegionHit]:
        """A stack the region pushes and pops holds the same at recompute as at forward: its
        mutations, and the reads of it (RC101), are harmless."""
        stacks = balanced([hazard.tag for _, hazard in hits if hazard.code == CODE])
        if not stacks:
            return hits
        return [(path, hazard) for path, hazard in hits if not (
            (hazard.tag.startswith(MUTATE) and hazard.tag[len(MUTATE):].rsplit(":", 1)[0] in stacks)
            or (hazard.tag.startswith("read:") and hazard.tag[5:] in stacks))]

TABLE = "body"
# -- cases: region bodies, run by tests/lint/test_rule_tables.py inside a checkpointed ``Block.forward``
# (its harness defines the names they use); INVALID gives (line, column, part of the message) per finding
INVALID = [
    ("self.count += 1\nreturn self.lin(x)", [(1, 9, "`self.count` is incremented")]),
    ("self.tokens.add_(x.sum(0))\nreturn x", [(1, 9, "`self.tokens` is modified in place by `.add_()`")]),
    ("self.tokens[0].copy_(x[0, 0])\nreturn x", [(1, 9, "`self.tokens` is modified in place by `.copy_()`")]),
    ("self.aux.append(x.mean())\nreturn x", [(1, 9, "attribute `self.aux` is mutated by `.append()`")]),
    ("if self.prev is None:\n    self.prev = x\n    return x\nreturn x - self.prev",
     [(2, 13, "`self.prev` is assigned and tested in the region")]),
    ("cache.update({'k': x})\nreturn x", [(1, 9, "argument `cache` is mutated by `.update()`")]),
    ("self.scale = self.scale * 0.5\nreturn x * self.scale", [(1, 9, "`self.scale` is assigned")]),
    # another module's state (Megatron's MoE loss tracker), and local aliases of outside state
    ("from megatron.core import parallel_state\nparallel_state._TRACKER['aux']['values'][0] += x.sum().detach()\nreturn x",
     [(2, 9, "module state `parallel_state._TRACKER` is written by item assignment")]),
    ("from megatron.core import parallel_state as ps\nps._STEP += 1\nreturn x", [(2, 9, "module state `ps._STEP` is incremented")]),
    ("from megatron.core import parallel_state\ntracker = parallel_state._TRACKER\ntracker['aux'] = x.sum().detach()\nreturn x",
     [(3, 9, "module state `parallel_state._TRACKER` (as local `tracker`) is written by item assignment")]),
    ("aux = self.aux\naux.append(x.mean())\nreturn x", [(2, 9, "attribute `self.aux` (as local `aux`) is mutated by `.append()`")]),
]
VALID = [
    "self.last = x.detach()\nreturn x",  # scratch state nothing tests: set to the same value again
    "if self.prev is None:\n    self.prev = torch.zeros(4)\nreturn x + self.prev",  # a memo, not an input
    "cache = dict(cache or {})\ncache.update({'k': x})\nreturn x",  # a copy of the argument
    "self.tokens.requires_grad_(False)\nreturn x",
    "return torch.Tensor.add(x, x)",  # a class's function, not state
    "aux = list(self.aux)\naux.append(x.mean())\nreturn x",  # a copy
    "from megatron.core import parallel_state\nrank = parallel_state.get_tensor_model_parallel_rank()\nreturn x * (rank + 1)",
]
