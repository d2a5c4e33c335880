"""Phase one: read one file's syntax tree into :class:`~recheck.lint.facts.FileFacts`.

The tree is the standard library's :mod:`ast` (about ten times faster to build than a
libcst tree, measured in ``benchmarks/lint_speed.py``); libcst is used only where the
source is rewritten (``--fix``).  Every function body is scanned once, by every body
rule, without knowing yet whether it is checkpointed.
"""

from __future__ import annotations

import ast
import warnings
from typing import Iterator

from recheck.lint.facts import CallSite, ClassFacts, FileFacts, FunctionFacts, Ref
from recheck.lint.imports import dotted, import_aliases
from recheck.lint.rules import BODY_RULES
from recheck.lint.rules.rc002_preserve_rng import random_draw
from recheck.lint.scope import FUNCTION_NODES, FunctionContext, ModuleContext, bound_names, memo_targets, partition_scopes, written_names
from recheck.lint.targets import CONTAINERS, PARTIALS, callee_refs, entry_point, lambda_name, target_refs

__all__ = ["extract", "parse"]

MEMOIZING = frozenset({"functools.lru_cache", "functools.cache", "lru_cache", "cache"})
_DISPATCH: dict[type, list] = {}
for _rule in BODY_RULES:
    for _node_type in _rule.NODES:
        _DISPATCH.setdefault(_node_type, []).append(_rule)


def parse(source: str, path: str) -> ast.Module:
    """``ast.parse`` without the warnings CPython's compiler prints about the code it
    reads (``SyntaxWarning: invalid escape sequence``): they are not the linter's."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ast.parse(source, filename=path)


def extract(source: str, path: str, module: str, is_package: bool = False,
            extra_entries: frozenset[str] = frozenset()) -> FileFacts:
    """Parse ``source`` and collect its facts.  Raises :class:`SyntaxError` if it does not parse."""
    tree = parse(source, path)
    scopes = partition_scopes(tree)
    imports = import_aliases((n for nodes in scopes.values() for n in nodes), module, is_package)
    facts = FileFacts(path=path, module=module, imports=imports)
    context = ModuleContext.build(tree, scopes, module, source.splitlines(), imports)
    top = _function_context(context, "<module>", [], {}, None, None)
    extractor = _Extractor(facts, context, extra_entries, scopes)
    nodes = scopes[id(tree)]
    for node in nodes:  # module-level instances: `BLOCK = Block()`, later `checkpoint(BLOCK, x)`
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            refs = _instance_refs(node.value, top)
            if refs:
                top.local_refs[node.targets[0].id] = refs
    extractor.block(nodes, "", top, None)
    for node in nodes:  # scripts checkpoint at module level too
        if isinstance(node, ast.Call):
            entry = entry_point(node, top, extra_entries)
            if entry is not None:
                facts.call_sites.append(_call_site(node, entry, top))
    return facts


def _function_context(module: ModuleContext, qualname: str, nodes: list[ast.AST],
                      args: dict[str, ast.arg], self_name: str | None,
                      parent: FunctionContext | None, defaults: dict | None = None) -> FunctionContext:
    declared_global = {n for s in nodes if isinstance(s, ast.Global) for n in s.names}
    declared_nonlocal = {n for s in nodes if isinstance(s, ast.Nonlocal) for n in s.names}
    local_names, rebound_at = set(), {}
    for name, line, plain in bound_names(nodes):
        local_names.add(name)
        if plain and name in args and name not in rebound_at:
            rebound_at[name] = line
    closure = set()
    if parent is not None and parent.qualname != "<module>":
        closure = parent.local_names | set(parent.params) | parent.closure_names
    context = FunctionContext(
        module, qualname, self_name, args, local_names - declared_global - declared_nonlocal,
        closure, declared_global, declared_nonlocal, rebound_at,
        dict(parent.local_refs) if parent is not None else {}, defaults or {}, written_names(nodes),
        memo_targets(nodes, self_name),
    )
    return context


class _Extractor:
    def __init__(self, facts: FileFacts, module: ModuleContext, extra_entries: frozenset[str],
                 scopes: dict[int, list[ast.AST]]) -> None:
        self.scopes = scopes
        self.facts = facts
        self.module = module
        self.extra_entries = extra_entries

    def block(self, nodes: list[ast.AST], prefix: str, context: FunctionContext, owner: str | None) -> None:
        """Visit the functions and classes among one scope's ``nodes``."""
        for node in nodes:
            if isinstance(node, ast.ClassDef):
                self.klass(node, prefix + node.name, context)
            elif isinstance(node, FUNCTION_NODES):
                name = lambda_name(node, context.qualname) if isinstance(node, ast.Lambda) else prefix + node.name
                self.function(node, name, context, owner)

    def klass(self, node: ast.ClassDef, qualname: str, context: FunctionContext) -> None:
        bases = [q for q in (context.qualify(b) for b in node.bases) if q]
        facts = ClassFacts(qualname, context.span(node), bases)
        self.facts.classes[qualname] = facts
        nodes = self.scopes[id(node)]
        for child in nodes:
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                facts.methods[child.name] = f"{qualname}.{child.name}"
        self.block(nodes, qualname + ".", context, qualname)

    def function(self, node: ast.AST, qualname: str, parent: FunctionContext, owner: str | None) -> None:
        arguments = node.args
        positional = [*arguments.posonlyargs, *arguments.args]
        args = {a.arg: a for a in [*positional, *arguments.kwonlyargs, arguments.vararg, arguments.kwarg] if a}
        defaults = dict(zip([a.arg for a in positional][::-1], arguments.defaults[::-1]))
        defaults.update({a.arg: d for a, d in zip(arguments.kwonlyargs, arguments.kw_defaults) if d is not None})
        static = any(dotted(d) == ["staticmethod"] for d in getattr(node, "decorator_list", []))
        if owner is not None and positional and not static and not isinstance(node, ast.Lambda):
            self_name, self_class = positional[0].arg, owner
        else:
            self_name, self_class = parent.self_name, self.facts.functions.get(parent.qualname, None)
            self_class = self_class.self_class if self_class else None
            if self_name in args:
                self_name, self_class = None, None
        nodes = self.scopes[id(node)]
        context = _function_context(self.module, qualname, nodes, args, self_name, parent, defaults)
        facts = FunctionFacts(qualname, context.span(node), self_class)
        decorators = [context.qualify(d.func if isinstance(d, ast.Call) else d) for d in getattr(node, "decorator_list", [])]
        facts.memoized = any(d in MEMOIZING for d in decorators)
        self.facts.functions[qualname] = facts
        self._bind_locals(nodes, context, qualname)
        self._scan(nodes, context, facts)
        if owner is not None and self_name is not None:
            self._attributes(nodes, context, self.facts.classes[owner])
        self.block(nodes, qualname + ".", context, None)

    def _bind_locals(self, nodes: list[ast.AST], context: FunctionContext, qualname: str) -> None:
        """Loop variables over ``self.layers``, nested defs and aliases of submodules."""
        for node in nodes:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                context.local_refs[node.name] = [Ref("local", f"{qualname}.{node.name}", context.span(node))]
            elif isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
                for name, refs in _loop_bindings(node.target, node.iter, context):
                    context.local_refs[name] = refs
            elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                refs = _alias_refs(node.value, context)
                if refs:
                    context.local_refs[node.targets[0].id] = refs

    def _scan(self, nodes: list[ast.AST], context: FunctionContext, facts: FunctionFacts) -> None:
        seen_once: set[tuple[str, str]] = set()
        for node in nodes:
            for rule in _DISPATCH.get(type(node), ()):
                for hazard in rule.check(node, context):
                    if getattr(rule, "ONCE_PER_FUNCTION", False):
                        if (hazard.code, hazard.what) in seen_once:
                            continue
                        seen_once.add((hazard.code, hazard.what))
                    facts.hazards.append(hazard)
            if isinstance(node, ast.Call):
                self._call(node, context, facts)
            elif isinstance(node, ast.Return) and isinstance(node.value, ast.Name):
                facts.returns_local += [r.name for r in context.local_refs.get(node.value.id, []) if r.kind == "local"]

    def _call(self, node: ast.Call, context: FunctionContext, facts: FunctionFacts) -> None:
        drawn = random_draw(node, context)
        if drawn:
            facts.random_draws.append((context.span(node), drawn))
        entry = entry_point(node, context, self.extra_entries)
        if entry is not None:
            self.facts.call_sites.append(_call_site(node, entry, context))
        else:
            facts.calls.extend(callee_refs(node.func, context))

    def _attributes(self, nodes: list[ast.AST], context: FunctionContext, owner: ClassFacts) -> None:
        """Record the submodule classes assigned to ``self.<attr>`` in a method."""
        local_lists: dict[str, list[str]] = {}
        for node in nodes:
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("append", "extend", "insert"):
                classes = [c for a in node.args for c in _module_classes(a, context, local_lists)]
                holder = node.func.value
                if isinstance(holder, ast.Name):
                    local_lists.setdefault(holder.id, []).extend(classes)
                elif isinstance(holder, ast.Attribute) and context.is_self(holder.value):
                    owner.attributes.setdefault(holder.attr, []).extend(classes)
            elif isinstance(node, ast.Assign):
                classes = _module_classes(node.value, context, local_lists)
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        local_lists.setdefault(target.id, []).extend(classes)
                    elif isinstance(target, ast.Attribute) and context.is_self(target.value) and classes:
                        owner.attributes.setdefault(target.attr, []).extend(classes)


def _alias_refs(value: ast.AST, context: FunctionContext) -> list[Ref]:
    """``layer = self.layers[i]``, ``fn = partial(...)``, ``fn = create_custom_forward(m)``."""
    if isinstance(value, (ast.Attribute, ast.Subscript, ast.Name)):
        return callee_refs(value, context)
    if isinstance(value, ast.Call):
        return target_refs(value, context) if _is_factory_like(value, context) else _instance_refs(value, context)
    return []


def _instance_refs(value: ast.AST, context: FunctionContext) -> list[Ref]:
    """``block = Block(...)``: what the name holds is an instance of the class (or what a
    factory function returns), resolved in phase two; any other value binds nothing."""
    if not (isinstance(value, ast.Call) and isinstance(value.func, ast.Name)):
        return []
    return [r for r in target_refs(value, context) if r.kind == "returned"]


def _is_factory_like(call: ast.Call, context: FunctionContext) -> bool:
    if context.qualify(call.func) in PARTIALS:
        return True
    return any(r.kind == "local" for r in callee_refs(call.func, context))


def _loop_bindings(target: ast.AST, iterable: ast.AST, context: FunctionContext) -> Iterator[tuple[str, list[Ref]]]:
    """``for i, layer in enumerate(self.layers)`` binds ``layer`` to the elements of ``self.layers``."""
    if isinstance(iterable, ast.Call) and isinstance(iterable.func, ast.Name) and iterable.args:
        if iterable.func.id == "enumerate" and isinstance(target, ast.Tuple) and len(target.elts) == 2:
            yield from _loop_bindings(target.elts[1], iterable.args[0], context)
            return
        if iterable.func.id == "zip" and isinstance(target, ast.Tuple) and len(target.elts) == len(iterable.args):
            for element, source in zip(target.elts, iterable.args):
                yield from _loop_bindings(element, source, context)
            return
        if iterable.func.id == "reversed":
            yield from _loop_bindings(target, iterable.args[0], context)
            return
    if isinstance(target, ast.Name):
        source = iterable.value if isinstance(iterable, ast.Subscript) else iterable
        parts = dotted(source)
        if parts and len(parts) == 2 and context.self_name == parts[0]:
            yield target.id, [Ref("elements", parts[1], context.span(source))]
        elif isinstance(source, ast.Attribute) and source.attr in ("values", "children", "modules") and parts is None:
            yield from _loop_bindings(target, source.value, context)
        elif isinstance(source, ast.Call) and isinstance(source.func, ast.Attribute) and source.func.attr in ("values", "children"):
            yield from _loop_bindings(target, source.func.value, context)


def _module_classes(value: ast.AST, context: FunctionContext, local_lists: dict[str, list[str]]) -> list[str]:
    """Qualified class names of the modules an expression builds (containers: their elements)."""
    if isinstance(value, ast.Call):
        qualified = context.qualify(value.func)
        if qualified is None and isinstance(value.func, ast.Name) and value.func.id in context.defaults:
            qualified = context.qualify(context.defaults[value.func.id])  # norm_layer=nn.BatchNorm2d
        if qualified and qualified.rsplit(".", 1)[-1] in CONTAINERS:
            parts = [*value.args, *(k.value for k in value.keywords)]
            return [c for p in parts for c in _module_classes(p, context, local_lists)]
        last = (qualified or "").rsplit(".", 1)[-1]
        return [qualified] if last[:1].isupper() else []
    if isinstance(value, (ast.List, ast.Tuple, ast.Set)):
        return [c for e in value.elts for c in _module_classes(e, context, local_lists)]
    if isinstance(value, (ast.ListComp, ast.GeneratorExp)):
        return _module_classes(value.elt, context, local_lists)
    if isinstance(value, ast.Dict):
        return [c for e in value.values for c in _module_classes(e, context, local_lists)]
    if isinstance(value, ast.Starred):
        return _module_classes(value.value, context, local_lists)
    if isinstance(value, ast.IfExp):
        return _module_classes(value.body, context, local_lists) + _module_classes(value.orelse, context, local_lists)
    if isinstance(value, ast.BinOp):
        return _module_classes(value.left, context, local_lists) + _module_classes(value.right, context, local_lists)
    if isinstance(value, ast.Name):
        return list(local_lists.get(value.id, []))
    return []


def _call_site(node: ast.Call, entry: str, context: FunctionContext) -> CallSite:
    keywords = {k.arg: k for k in node.keywords}
    region = node.args[0] if node.args and not isinstance(node.args[0], ast.Starred) else None
    for name in ("function", "functions", "run_function", "module"):
        if region is None and name in keywords:
            region = keywords[name].value
    if "use_reentrant" in keywords:
        reentrant = "given"
    elif None in keywords:
        reentrant = "splat"
    else:
        reentrant = "missing"
    preserve = keywords.get("preserve_rng_state")
    preserve_false = None
    if preserve is not None and isinstance(preserve.value, ast.Constant) and preserve.value.value is False:
        preserve_false = context.span(preserve)
    return CallSite(
        span=context.span(node),
        entry=entry,
        caller=context.qualname,
        targets=tuple(target_refs(region, context)) if region is not None else (),
        use_reentrant=reentrant,
        preserve_rng_false=preserve_false,
    )
