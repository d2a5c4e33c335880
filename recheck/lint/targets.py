"""Checkpoint entry points, and what the expression handed to one (or called) refers to.

This is where the many ways to spell a region become :class:`~recheck.lint.facts.Ref`
values: ``layer.__call__``, ``self._inner``, ``partial(f, ...)``, ``lambda t: f(t)``,
``create_custom_forward(layer)``, ``self.blocks``, a nested ``def``.  Phase two
(``regions.py``) follows the references across files.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Iterable, Mapping

from recheck.entry_points import TABLE
from recheck.entry_points import EntryPoint as Record
from recheck.lint.facts import DYNAMIC_ATTRIBUTE, Ref
from recheck.lint.imports import dotted
from recheck.lint.scope import FunctionContext

__all__ = ["CONTAINERS", "ENTRY_POINTS", "EntryPoint", "callee_refs", "class_entries", "entry_point", "entry_points",
           "lambda_name", "self_path", "submodule_path", "target_refs"]


@dataclass(frozen=True)
class EntryPoint:
    """A function that checkpoints a callable (or wraps a module so that its forward is), as the
    linter sees it: one qualified name of a :class:`recheck.entry_points.EntryPoint` record.

    ``reentrant_default``: a call that leaves the choice out runs a reentrant implementation;
    ``reentrant_keyword``: the keyword that chooses (RC001 asks for ``use_reentrant`` where the
    default is reentrant; None when the implementation is fixed); ``rng_keyword``: the keyword
    that can turn RNG restoring off (RC002; None when the implementation always restores it);
    ``library``: whose it is, for messages.
    """

    name: str
    library: str = "torch"
    reentrant_default: bool = False
    reentrant_keyword: str | None = "use_reentrant"
    rng_keyword: str | None = "preserve_rng_state"
    position: int = 0  # the call argument that is the region
    policy: bool = False  # apply_activation_checkpointing: the region is picked by check_fn/auto_wrap_policy


def entry_points(table: Iterable[Record]) -> dict[str, EntryPoint]:
    """The linter's entry points by qualified name, one per name of every record of ``table``."""
    return {name: EntryPoint(name, record.library, record.reentrant, record.reentrant_keyword, record.rng_keyword,
                             record.position, record.policy)
            for record in table for name in record.names}


def class_entries(table: Iterable[Record]) -> dict[str, str]:
    """Class name -> the qualified entry point of its ``checkpoint`` method (Megatron's
    ``CheckpointWithoutOutput``), for calls on an instance."""
    return {cls: record.names[0] for record in table for cls in record.classes if record.names}


#: Known entry points by qualified name, with each one's reentrant and RNG semantics.
ENTRY_POINTS: dict[str, EntryPoint] = entry_points(TABLE)
#: Attribute names that are a checkpoint function wherever they are looked up.
ENTRY_ATTRIBUTES = frozenset(a for record in TABLE for a in record.attributes)
#: Classes whose ``checkpoint`` method checkpoints its first argument (Megatron).
CLASS_ENTRIES = class_entries(TABLE)
CHECKPOINTING_CLASSES = frozenset(CLASS_ENTRIES)
#: Keywords that name the region when it is not the first positional argument.
REGION_KEYWORDS = ("function", "functions", "run_function", "module", "forward_func", "fn")
CONTAINERS = frozenset({"ModuleList", "Sequential", "ModuleDict"})
PARTIALS = frozenset({"functools.partial", "partial"})
#: Base classes (last component) whose subclasses' ``forward`` is checkpointed implicitly.
CHECKPOINTING_BASES = frozenset(b for record in TABLE for b in record.bases)
ITERATION_METHODS = frozenset({"values", "children", "modules", "named_children", "named_modules", "items"})


def lambda_name(node: ast.Lambda, parent: str) -> str:
    """The qualname given to a lambda: ``Model.forward.<lambda:12:30>``."""
    owner = "" if parent == "<module>" else parent + "."
    return f"{owner}<lambda:{node.lineno}:{node.col_offset}>"


def entry_point(node: ast.Call, context: FunctionContext,
                extra: Mapping[str, tuple[int, str]]) -> tuple[str, int, str] | None:
    """The entry point a call goes to, with the position and keyword of its region
    argument, or None.

    Known entry points and ``extra`` (qualified names, ``module.Class.method``,
    ``module.outer.inner`` for a nested function, or ``self.<attr>`` for an attribute of
    any class) match by value: through import aliases, function-local imports, a local
    name bound to one, ``self.<attr>`` holding one, and Megatron's ``CheckpointWithoutOutput``.
    """
    func = node.func
    if isinstance(func, ast.Attribute):
        if func.attr in ENTRY_ATTRIBUTES:
            return (f"self.{func.attr}" if context.is_self(func.value) else func.attr), 0, ""
        if context.is_self(func.value):
            if func.attr in context.entry_attributes:
                return f"self.{func.attr}", 0, ""
            owner = context.qualname.rsplit(".", 1)[0] if "." in context.qualname else ""
            for name in (f"self.{func.attr}", f"{context.module.module}.{owner}.{func.attr}"):
                if name in extra:
                    return (name, *extra[name])
        if func.attr == "checkpoint" and (cls := _checkpointer(func.value, context)) is not None:
            return CLASS_ENTRIES[cls], ENTRY_POINTS[CLASS_ENTRIES[cls]].position, ""
    if isinstance(func, ast.Name) and extra:
        for ref in context.refs_of(func.id, func.lineno) or ():
            name = f"{context.module.module}.{ref.name}"
            if ref.kind == "local" and name in extra:  # a nested wrapper: def checkpoint_handler(fn)
                return (name, *extra[name])
    qualified = context.qualify(func)
    if qualified is None:
        return None
    if "." not in qualified:  # from a star import (``from .helpers import *``)?
        starred = (f"{source}.{qualified}" for alias, source in context.module.imports.items() if alias[:1] == "*")
        qualified = next((name for name in starred if name in ENTRY_POINTS or name in extra), qualified)
    known = ENTRY_POINTS.get(qualified)
    if known is not None:
        return qualified, known.position, ""
    if qualified in extra:
        return (qualified, *extra[qualified])
    raw = ".".join(dotted(func) or ())
    return (raw, *extra[raw]) if raw in extra else None


def _checkpointer(node: ast.AST, context: FunctionContext) -> str | None:
    """The class of :data:`CLASS_ENTRIES` that ``node`` is an instance of: a local bound to
    ``CheckpointWithoutOutput(...)``, or ``self.x`` holding one (the first such class)."""
    if isinstance(node, ast.Attribute) and context.is_self(node.value):
        return next(iter(CLASS_ENTRIES), None) if node.attr in context.entry_attributes else None
    names: list[str] = []
    if isinstance(node, ast.Call):
        names = [context.qualify(node.func) or ""]
    elif isinstance(node, ast.Name):
        names = [r.name for r in context.refs_of(node.id, node.lineno) or []]
    return next((n.rsplit(".", 1)[-1] for n in names if n.rsplit(".", 1)[-1] in CLASS_ENTRIES), None)


def self_path(node: ast.AST, self_name: str | None) -> str | None:
    """``self.a[i].b`` as ``"a.b"`` (subscripts dropped); None unless it starts at ``self``."""
    parts: list[str] = []
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        if isinstance(node, ast.Attribute):
            parts.append(node.attr)
        node = node.value
    if not parts or self_name is None or not (isinstance(node, ast.Name) and node.id == self_name):
        return None
    return ".".join(reversed(parts))


def submodule_path(node: ast.AST) -> ast.AST:
    """``m.get_submodule("a.b")`` and ``getattr(m, "a")`` as the expression ``m.a.b`` or ``m.a``
    they name (with the call's place), ``getattr(m, name)`` with a computed name as ``m.*``
    (:data:`~recheck.lint.facts.DYNAMIC_ATTRIBUTE`: the modules added under computed names);
    any other node as it is."""
    if not isinstance(node, ast.Call):
        return node
    if isinstance(node.func, ast.Name) and node.func.id == "getattr" and len(node.args) == 2 and not node.keywords:
        path: ast.expr = node.args[0]
        name = node.args[1]
        parts = [name.value] if isinstance(name, ast.Constant) and isinstance(name.value, str) else [DYNAMIC_ATTRIBUTE]
    elif isinstance(node.func, ast.Attribute) and node.func.attr == "get_submodule":
        arguments = [*node.args, *(k.value for k in node.keywords if k.arg == "target")]
        if len(arguments) != 1 or not (isinstance(arguments[0], ast.Constant) and isinstance(arguments[0].value, str)):
            return node
        path, parts = node.func.value, arguments[0].value.split(".")
    else:
        return node
    if not all(part.isidentifier() or part == DYNAMIC_ATTRIBUTE for part in parts):
        return node
    for part in parts:
        path = ast.copy_location(ast.Attribute(value=path, attr=part, ctx=ast.Load()), node)
        path.end_lineno, path.end_col_offset = node.end_lineno, node.end_col_offset
    return path


def callee_refs(func: ast.AST, context: FunctionContext) -> list[Ref]:
    """What calling ``func`` may run: a function, a method, or a submodule's ``forward``."""
    func = submodule_path(func)
    span = context.span(func)
    if isinstance(func, ast.Attribute) and func.attr in ("forward", "__call__"):
        inner = callee_refs(func.value, context)
        if inner:
            return inner
    if isinstance(func, ast.Name):
        held = context.refs_of(func.id, func.lineno)
        if held is not None:
            return held
        if func.id in context.param_positions and func.id != context.self_name \
                and context.rebound_at.get(func.id) is None:
            return [Ref("param", func.id, span, str(context.param_positions[func.id][1]))]
        if context.is_local(func.id) or func.id in context.closure_names:
            return []
        if func.id in context.module.imports or func.id in context.module.defined:
            return [Ref("name", context.module.qualify_parts([func.id]), span)]
        return []
    if isinstance(func, ast.Subscript):
        if isinstance(func.value, ast.Name):  # blocks[i], a local list or a loop variable's container
            held = context.refs_of(func.value.id, func.lineno)
            return list(held) if held else []
        path = self_path(func, context.self_name)
        if path:
            return [Ref("path", path, span)]
        return callee_refs(func.value, context) if isinstance(func.value, ast.Attribute) else []
    if not isinstance(func, ast.Attribute):
        return []
    value = func.value
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "super":
        return [Ref("super", func.attr, span)]
    path = self_path(func, context.self_name)
    if path is not None:
        return [Ref("self", path, span)] if "." not in path else [Ref("path", path, span)]
    if isinstance(value, ast.Name) and func.attr != DYNAMIC_ATTRIBUTE:  # blk.forward_with_tap, blk a loop variable
        held = [r for r in context.refs_of(value.id, func.lineno) or () if r.kind in _MODULE_REFS]
        if held:  # decoder = self.decoder; decoder.layers: a path the same way
            return [Ref("name" if r.kind == "instance" else "param_path" if r.kind == "param_path" else "path",
                        f"{r.name}.{func.attr}", span) for r in held]
    parts = dotted(func)
    if not parts:
        return []
    if parts[0] in context.param_positions and parts[0] != context.self_name:
        return [Ref("param_path", ".".join(parts), span)]  # model.layers: through its annotation
    qualified = context.qualify(func)
    if func.attr == "apply" and len(parts) > 1 and (parts[0] in context.module.imports or parts[0] in context.module.defined):
        # ``Function.apply(...)`` runs the class's ``forward`` (an ``autograd.Function``; see regions.py)
        return [Ref("name", context.qualify(func.value) or qualified or "", span, "apply")]
    if qualified and parts[0] in context.module.imports:
        return [Ref("name", qualified, span)]
    return []


#: What a local name may hold that has methods of its own: submodules of ``self``, an instance.
_MODULE_REFS = ("self", "path", "elements", "instance", "param_path")


def target_refs(node: ast.AST, context: FunctionContext) -> list[Ref]:
    """What a checkpoint entry point runs when handed the expression ``node``."""
    if isinstance(node, ast.Lambda):
        return [Ref("local", lambda_name(node, context.qualname), context.span(node))]
    if isinstance(node, (ast.List, ast.Tuple)):
        return [r for e in node.elts for r in target_refs(e, context)]
    if isinstance(node, ast.Starred):
        return target_refs(node.value, context)
    if isinstance(node, ast.Call) and submodule_path(node) is not node:
        return callee_refs(node, context)
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
