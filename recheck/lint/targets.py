"""Checkpoint entry points, and what the expression handed to one (or called) refers to.

This is where the many ways to spell a region become :class:`~recheck.lint.facts.Ref`
values: ``layer.__call__``, ``self._inner``, ``partial(f, ...)``, ``lambda t: f(t)``,
``create_custom_forward(layer)``, ``self.blocks``, a nested ``def``.  Phase two
(``regions.py``) follows the references across files.
"""

from __future__ import annotations

import ast

from recheck.lint.facts import Ref
from recheck.lint.imports import dotted
from recheck.lint.scope import FunctionContext

__all__ = ["CONTAINERS", "ENTRY_POINTS", "callee_refs", "entry_point", "lambda_name", "target_refs"]

#: Qualified names of the functions that checkpoint their first argument.
ENTRY_POINTS = frozenset({
    "torch.utils.checkpoint.checkpoint",
    "torch.utils.checkpoint.checkpoint_sequential",
    "timm.models._manipulate.checkpoint",
    "timm.models._manipulate.checkpoint_seq",
    "timm.models.helpers.checkpoint_seq",
    "timm.models.checkpoint_seq",
    "timm.models.checkpoint",
    "torch.distributed.algorithms._checkpoint.checkpoint_wrapper.checkpoint_wrapper",
    "torch.distributed._composable.checkpoint",
    "torch.distributed._composable.checkpoint_activation.checkpoint",
    "deepspeed.checkpointing.checkpoint",
    "deepspeed.runtime.activation_checkpointing.checkpointing.checkpoint",
    "fairscale.nn.checkpoint_wrapper",
    "fairscale.nn.checkpoint.checkpoint_activations.checkpoint_wrapper",
})
#: Attribute names that are a checkpoint function wherever they are looked up.
ENTRY_ATTRIBUTES = frozenset({"_gradient_checkpointing_func"})
CONTAINERS = frozenset({"ModuleList", "Sequential", "ModuleDict"})
PARTIALS = frozenset({"functools.partial", "partial"})
#: Base classes (last component) whose subclasses' ``forward`` is checkpointed implicitly.
CHECKPOINTING_BASES = frozenset({"GradientCheckpointingLayer"})


def lambda_name(node: ast.Lambda, parent: str) -> str:
    """The qualname given to a lambda: ``Model.forward.<lambda:12:30>``."""
    owner = "" if parent == "<module>" else parent + "."
    return f"{owner}<lambda:{node.lineno}:{node.col_offset}>"


def entry_point(node: ast.Call, context: FunctionContext, extra: frozenset[str]) -> str | None:
    """The entry point a call goes to (a qualified name), or None if it does not checkpoint."""
    func = node.func
    if isinstance(func, ast.Attribute) and func.attr in ENTRY_ATTRIBUTES:
        return f"self.{func.attr}" if context.is_self(func.value) else func.attr
    qualified = context.qualify(func)
    if qualified is None:
        return None
    if qualified in ENTRY_POINTS or qualified in extra:
        return qualified
    raw = ".".join(dotted(func) or ())
    return raw if raw in extra else None


def callee_refs(func: ast.AST, context: FunctionContext) -> list[Ref]:
    """What calling ``func`` may run: a function, a method, or a submodule's ``forward``."""
    span = context.span(func)
    if isinstance(func, ast.Attribute) and func.attr in ("forward", "__call__"):
        inner = callee_refs(func.value, context)
        if inner:
            return inner
    if isinstance(func, ast.Name):
        if func.id in context.local_refs:
            return list(context.local_refs[func.id])
        if context.is_local(func.id) or func.id in context.closure_names:
            return []
        if func.id in context.module.imports or func.id in context.module.defined:
            return [Ref("name", context.module.qualify_parts([func.id]), span)]
        return []
    if isinstance(func, ast.Subscript):
        parts = dotted(func.value)
        if parts and len(parts) == 2 and parts[0] == context.self_name:
            return [Ref("elements", parts[1], span)]
        return []
    if not isinstance(func, ast.Attribute):
        return []
    value = func.value
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "super":
        return [Ref("super", func.attr, span)]
    parts = dotted(func)
    if not parts:
        return []
    if parts[0] == context.self_name:
        if len(parts) == 2:
            return [Ref("self", parts[1], span)]
        return [Ref("member", parts[1], span, parts[2])] if len(parts) == 3 else []
    qualified = context.qualify(func)
    if qualified and parts[0] in context.module.imports:
        return [Ref("name", qualified, span)]
    return []


def target_refs(node: ast.AST, context: FunctionContext) -> list[Ref]:
    """What a checkpoint entry point runs when handed the expression ``node``."""
    if isinstance(node, ast.Lambda):
        return [Ref("local", lambda_name(node, context.qualname), context.span(node))]
    if isinstance(node, (ast.List, ast.Tuple)):
        return [r for e in node.elts for r in target_refs(e, context)]
    if isinstance(node, ast.Starred):
        return target_refs(node.value, context)
    if isinstance(node, ast.Call):
        qualified = context.qualify(node.func)
        if qualified in PARTIALS and node.args:
            return target_refs(node.args[0], context)
        refs = []
        for ref in callee_refs(node.func, context):
            # a factory (create_custom_forward(layer)) returns the region; a class builds it
            refs.append(Ref("returned", ref.name, ref.span, ref.kind) if ref.kind in ("name", "local") else ref)
        if (qualified or "").rsplit(".", 1)[-1] in CONTAINERS or any(r.kind == "returned" for r in refs):
            refs += [r for a in node.args for r in target_refs(a, context)]
        return refs
    return callee_refs(node, context)
