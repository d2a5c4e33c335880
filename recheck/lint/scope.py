"""What a function body can see: its parameters, locals, closure and module globals.

A light replacement for libcst's ScopeProvider, computed only for the functions of a
file and only from assignments; it answers the questions the rules ask ("is ``x`` an
argument of this region that is still the caller's object at line 12?", "is ``CACHE``
a module global that something mutates?").
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Iterator, NamedTuple, cast

from recheck.lint.facts import Ref, Span
from recheck.lint.imports import dotted

__all__ = ["Binding", "FunctionContext", "ModuleContext", "Scopes", "bound_names", "constant_names", "tested_attributes",
           "written_names"]

FUNCTION_NODES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
SCOPE_NODES = (*FUNCTION_NODES, ast.ClassDef)
MUTATING_METHODS = frozenset(
    {"append", "extend", "update", "insert", "add", "setdefault", "pop", "popitem",
     "clear", "remove", "discard", "__setitem__"}
)
LOGGER_FACTORIES = ("getLogger", "get_logger")
#: What one local name may hold is cut at this many references: ``x = f(x)`` repeated down
#: a long function would otherwise double the list at every line.
MAX_REFS = 32


class Scopes:
    """The nodes of each scope (the module, classes, functions, lambdas) in source order.

    A nested scope's own node, with its decorators, defaults and bases, belongs to the
    enclosing scope's list, its body to its own.  Each list is made on first request, so
    the bodies nobody asks about are never walked.
    """

    def __init__(self, tree: ast.Module) -> None:
        self.tree = tree
        self._lists: dict[int, list[ast.AST]] = {}
        self._nested: dict[int, list[ast.AST]] = {}

    def of(self, scope: ast.AST) -> list[ast.AST]:
        """The nodes of ``scope`` (the module or a class, function or lambda node)."""
        found = self._lists.get(id(scope))
        if found is None:
            found = self._lists[id(scope)] = self._partition(scope)
        return found

    def nested(self, scope: ast.AST) -> list[ast.AST]:
        """The scope nodes directly inside ``scope``, in source order."""
        self.of(scope)
        return self._nested[id(scope)]

    def within(self, scope: ast.AST) -> Iterator[ast.AST]:
        """Every scope node inside ``scope``, at any depth (each partitioned on the way)."""
        stack = list(reversed(self.nested(scope)))
        while stack:
            node = stack.pop()
            yield node
            stack.extend(reversed(self.nested(node)))

    def _partition(self, scope: ast.AST) -> list[ast.AST]:
        body = scope.body  # type: ignore[attr-defined]
        out: list[ast.AST] = []
        nested: list[ast.AST] = []
        self._nested[id(scope)] = nested
        stack: list[ast.AST] = list(reversed(body)) if type(body) is list else [body]
        node_type, scope_types, order = ast.AST, _SCOPE_TYPES, _PARTITION_FIELDS
        while stack:
            node = stack.pop()
            out.append(node)
            kind = type(node)
            names = order.get(kind)
            if names is None:
                names = order[kind] = _partition_fields(kind)
            if kind in scope_types:  # its body is its own scope, partitioned when asked for
                nested.append(node)
            for name in names:  # pushed last field first, each list backwards: popped in source order
                value = getattr(node, name, None)
                if type(value) is list:
                    if None in value:  # a dict's ``**`` key, a keyword-only parameter with no default
                        stack += [v for v in reversed(value) if v is not None]
                    else:
                        stack += reversed(value)
                elif isinstance(value, node_type):
                    stack.append(value)
        return out


#: Fields that never hold a node in any node class that has them (identifiers, numbers,
#: flags; ``ctx``: Load/Store carry nothing).  ``name`` is an identifier everywhere but in
#: ``TypeAlias`` (Python 3.12), whose name is a ``Name``.
_NEVER_NODES = frozenset({"ctx", "id", "attr", "arg", "name", "module", "level", "kind", "conversion", "is_async",
                          "type_comment", "tag"})


def _node_fields(kind: type[ast.AST]) -> tuple[str, ...]:
    """The fields of node class ``kind`` that can hold nodes (a ``Constant``'s value never does)."""
    if kind is ast.Constant:
        return ()
    keep = {"name"} if kind.__name__ == "TypeAlias" else set()
    return tuple(f for f in kind._fields if f not in _NEVER_NODES or f in keep)


#: list fields of identifiers (``global a, b``, ``case C(x=..)``'s attribute names): no nodes
_NAME_LISTS = frozenset({"names", "kwd_attrs"})


def _partition_fields(kind: type[ast.AST]) -> tuple[str, ...]:
    """:meth:`Scopes._partition`'s fields of node class ``kind``, last first: a nested scope's
    body left out (its own scope), no list of identifiers."""
    names = _node_fields(kind)
    if kind in _SCOPE_TYPES:
        names = tuple(f for f in names if f != "body")
    if kind in (ast.Global, ast.Nonlocal, ast.MatchClass):
        names = tuple(f for f in names if f not in _NAME_LISTS)
    return names[::-1]


def subtree(node: ast.AST) -> list[ast.AST]:
    """``node`` and every node inside it, in no set order: what ``ast.walk`` yields (for the
    sets made of it), without its generator per node."""
    out: list[ast.AST] = []
    stack, fields = [node], _CHILD_FIELDS
    while stack:
        current = stack.pop()
        out.append(current)
        kind = type(current)
        names = fields.get(kind)
        if names is None:
            names = fields[kind] = _node_fields(kind)
        for name in names:
            value = getattr(current, name, None)
            if type(value) is list:
                stack += [v for v in value if isinstance(v, ast.AST)]
            elif isinstance(value, ast.AST):
                stack.append(value)
    return out


_SCOPE_TYPES = frozenset(SCOPE_NODES)
_PARTITION_FIELDS: dict[type, tuple[str, ...]] = {}
_CHILD_FIELDS: dict[type, tuple[str, ...]] = {}


_BINDERS = frozenset({
    ast.Assign, ast.AnnAssign, ast.AugAssign, ast.For, ast.AsyncFor, ast.comprehension, ast.withitem,
    ast.NamedExpr, ast.ExceptHandler, ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef,
})
_WRITERS = frozenset({ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete, ast.Call})


def written_names(nodes: list[ast.AST]) -> set[int]:
    """``id()`` of every Name that is written through: ``X[k] = v``, ``X.a = v``, ``X.append(v)``."""
    written: set[int] = set()
    for node in nodes:
        if type(node) not in _WRITERS:
            continue
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            for target in targets:
                if isinstance(target, (ast.Subscript, ast.Attribute)) and isinstance(target.value, ast.Name):
                    written.add(id(target.value))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in MUTATING_METHODS and isinstance(node.func.value, ast.Name):
                written.add(id(node.func.value))
    return written


def tested_attributes(nodes: list[ast.AST], self_name: str | None) -> frozenset[str]:
    """Attributes of ``self`` whose being set a test among ``nodes`` checks (``if self.prev
    is None``, ``if not self.cache``, also inside ``and``/``or``)."""
    if self_name is None:
        return frozenset()
    found: set[str] = set()
    for node in nodes:
        kind = type(node)
        if kind is ast.If or kind is ast.While or kind is ast.IfExp:
            condition = cast("ast.If | ast.While | ast.IfExp", node).test
            tests = condition.values if isinstance(condition, ast.BoolOp) else [condition]
            for test in tests:
                if _first_use_test(test, self_name):
                    inner = test.operand if isinstance(test, ast.UnaryOp) else test
                    inner = inner.left if isinstance(inner, ast.Compare) else inner
                    found.add(cast(ast.Attribute, inner).attr)
    return frozenset(found)


def _self_attributes(node: ast.AST, self_name: str | None) -> set[str]:
    return {
        n.attr for n in subtree(node)
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == self_name
    }


def _first_use_test(test: ast.AST, self_name: str) -> bool:
    """``self.x is None``, ``self.x is not None``, ``not self.x``, ``self.x``: a test of
    whether state was filled yet (not of a cache key)."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        test = test.operand
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], (ast.Is, ast.IsNot)) \
            and isinstance(test.comparators[0], ast.Constant) and test.comparators[0].value is None:
        test = test.left
    return isinstance(test, ast.Attribute) and isinstance(test.value, ast.Name) and test.value.id == self_name


def memo_targets(nodes: list[ast.AST], self_name: str | None, inputs: frozenset[str] = frozenset()) -> set[int]:
    """``id()`` of assignment targets that fill a cache the guarding ``if`` tests.

    ``if key not in self.cache: self.cache[key] = ...`` and ``if n != self._len_cached:
    self._len_cached = n; self._cos_cached = ...`` fill a cache once: the block writes an
    attribute its own test reads (the cache key).  A recomputation finds it filled and
    computes the same values.  Not so a first-use fill of an input (``if self.prev is
    None: self.prev = x``, ``x`` one of ``inputs``): the recomputation finds it filled
    and takes the other branch, so that write is not hidden.
    """
    found: set[int] = set()
    if self_name is None:
        return found
    for node in nodes:
        if type(node) is not ast.If:
            continue
        guarded = _self_attributes(node.test, self_name)
        if not guarded:
            continue
        if inputs and _first_use_test(node.test, self_name) and any(
                isinstance(n, ast.Name) and n.id in inputs
                for statement in node.body if isinstance(statement, (ast.Assign, ast.AnnAssign)) and statement.value
                for n in ast.walk(statement.value)):
            continue  # a branch-changing cache: reported
        writes: list[tuple[ast.AST, str]] = []
        for statement in node.body:
            if not isinstance(statement, (ast.Assign, ast.AnnAssign)):
                continue
            targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
            for target in targets:
                for element in target.elts if isinstance(target, ast.Tuple) else [target]:
                    base = element.value if isinstance(element, ast.Subscript) else element
                    if isinstance(base, ast.Attribute) and isinstance(base.value, ast.Name) and base.value.id == self_name:
                        writes.append((element, base.attr))
        if guarded & {attribute for _, attribute in writes}:
            found.update(id(element) for element, _ in writes)
    return found


def constant_names(nodes: list[ast.AST], bound: list[tuple[str, int, bool]] | None = None) -> dict[str, object]:
    """Names that one scope's ``nodes`` bind exactly once, to a literal constant
    (``bound``: the scope's :func:`bound_names`, when already computed)."""
    counts: dict[str, int] = {}
    for name, _, _ in bound if bound is not None else bound_names(nodes):
        counts[name] = counts.get(name, 0) + 1
    values: dict[str, object] = {}
    for node in nodes:
        kind = type(node)
        if kind is ast.Assign or kind is ast.AnnAssign:
            assignment = cast("ast.Assign | ast.AnnAssign", node)
            if type(assignment.value) is not ast.Constant:
                continue
            constant = cast(ast.Constant, assignment.value).value
            for target in assignment.targets if isinstance(assignment, ast.Assign) else [assignment.target]:
                if type(target) is ast.Name and counts.get(target.id) == 1:
                    values[target.id] = constant
    return values


def _target_names(target: ast.AST) -> Iterator[str]:
    if isinstance(target, ast.Name):
        yield target.id
    elif isinstance(target, (ast.Tuple, ast.List)):
        for element in target.elts:
            yield from _target_names(element)
    elif isinstance(target, ast.Starred):
        yield from _target_names(target.value)


def bound_names(nodes: list[ast.AST]) -> Iterator[tuple[str, int, bool]]:
    """``(name, line, is_plain_assignment)`` for every name bound by one scope's ``nodes``."""
    for node in nodes:
        if type(node) not in _BINDERS:
            continue
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for name in _target_names(target):
                    yield name, node.lineno, True
        elif isinstance(node, ast.AugAssign):
            yield from ((n, node.lineno, False) for n in _target_names(node.target))
        elif isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
            yield from ((n, getattr(node, "lineno", 0), True) for n in _target_names(node.target))
        elif isinstance(node, ast.withitem) and node.optional_vars is not None:
            yield from ((n, node.optional_vars.lineno, True) for n in _target_names(node.optional_vars))
        elif isinstance(node, ast.NamedExpr):
            yield node.target.id, node.lineno, True
        elif isinstance(node, ast.ExceptHandler) and node.name:
            yield node.name, node.lineno, True
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                yield (alias.asname or alias.name).split(".")[0], node.lineno, True
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield node.name, node.lineno, True


@dataclass
class ModuleContext:
    """Module-wide facts: imports, module-level names, mutated globals, loggers."""

    module: str
    lines: list[str]
    imports: dict[str, str]
    defined: dict[str, str] = field(default_factory=dict)  # def/class name -> qualname
    assigned: set[str] = field(default_factory=set)  # module-level variables
    mutated_globals: set[str] = field(default_factory=set)
    lazy_globals: set[str] = field(default_factory=set)  # see set_once_names()
    loggers: set[str] = field(default_factory=set)
    constants: dict[str, object] = field(default_factory=dict)  # module names assigned once, to a constant
    function_nodes: dict[str, ast.AST] = field(default_factory=dict)  # qualname -> def/lambda node
    set_once: set[str] = field(default_factory=set)  # module variables initialised to None or False
    #: the value last assigned to each module variable (``_block_registry = dict(basic=BasicBlock)``)
    values: dict[str, ast.AST] = field(default_factory=dict)
    #: does a line set an ``always`` warnings filter (RC103's question, answered once per file)
    always_filter: bool | None = None

    @classmethod
    def build(cls, tree: ast.Module, top_level: list[ast.AST], module: str, lines: list[str],
              imports: dict[str, str]) -> ModuleContext:
        """The module scope's facts (``top_level``: its nodes); :meth:`add_nested` adds what
        the nested scopes do to module variables."""
        context = cls(module, lines, imports)
        context.defined = defined_names(tree, module)
        context.assigned = assigned_names(top_level, context.defined, imports)
        for node in top_level:
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                callee = dotted(node.value.func)
                if callee and callee[-1] in LOGGER_FACTORIES:
                    context.loggers.update(n for t in node.targets for n in _target_names(t))
        context.constants = constant_names(top_level)
        context.values = {node.targets[0].id: node.value for node in top_level if type(node) is ast.Assign
                          and len(node.targets) == 1 and type(node.targets[0]) is ast.Name}
        context.set_once = set_once_names(tree)
        return context

    def add_nested(self, declared_global: set[str], written: set[str]) -> None:
        """``declared_global``: the names some nested scope declares ``global``; ``written``:
        the names some nested scope writes through (``X[k] = v``, ``X.a = v``,
        ``X.append(v)``; see :func:`written_names`)."""
        self.lazy_globals = lazy = self.set_once & declared_global
        self.mutated_globals = ((declared_global - lazy) | (written - lazy)) & self.assigned

    def qualify_parts(self, parts: list[str]) -> str:
        head = parts[0]
        if head in self.imports:
            return ".".join([self.imports[head], *parts[1:]])
        if head in self.defined:
            return ".".join([self.defined[head], *parts[1:]])
        return ".".join(parts)

    def span(self, node: ast.AST) -> Span:
        """The node's range with 1-based character columns (ast columns count UTF-8 bytes)."""
        located = cast(ast.expr, node)  # any node with a position: expressions, statements, arguments
        line, end_line = located.lineno, located.end_lineno or located.lineno
        return Span(line, self._column(line, located.col_offset) + 1, end_line,
                    self._column(end_line, located.end_col_offset or located.col_offset) + 1)

    def _column(self, line: int, byte_offset: int) -> int:
        text = self.lines[line - 1] if 0 < line <= len(self.lines) else ""
        if text.isascii():
            return byte_offset
        return len(text.encode("utf-8")[:byte_offset].decode("utf-8", "replace"))


def defined_names(tree: ast.Module, module: str) -> dict[str, str]:
    """The module's own top-level defs and classes: name -> qualified name."""
    return {node.name: f"{module}.{node.name}" for node in tree.body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}


def assigned_names(top_level: list[ast.AST], defined: dict[str, str], imports: dict[str, str]) -> set[str]:
    """Module-level variables: names the module scope binds that are no def, class or import."""
    return {name for name, _, _ in bound_names(top_level) if name not in defined and name not in imports}


def set_once_names(tree: ast.Module) -> set[str]:
    """Module variables initialised to ``None`` or ``False``.

    Those that some function rebinds under ``global`` are *lazy globals*: a lazily created
    singleton (a kernel, an RNG tracker, a cached version) or a flag a setup function turns
    on.  Neither changes between a forward and its recomputation.  Module variables that
    functions rebind (``global``) or mutate in place at run time are *mutated globals*
    (RC101), except the lazy ones, which are set up once, also through their methods
    (``_TRACKER.add(name, seed)``); mutations at module level run once, at import
    (``REGISTRY["x"] = f``), and do not count either."""
    return {
        name for node in tree.body if isinstance(node, (ast.Assign, ast.AnnAssign))
        and isinstance(node.value, ast.Constant) and (node.value.value is None or node.value.value is False)
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        for name in _target_names(target)
    }


def written_through(nodes: list[ast.AST]) -> Iterator[str]:
    """The names one scope's ``nodes`` write through (see :func:`written_names`)."""
    written = written_names(nodes)
    return (n.id for n in nodes if type(n) is ast.Name and id(n) in written)


class Binding(NamedTuple):
    """A local name holds ``refs`` from ``start`` (to ``end`` for a block-scoped binding)."""

    start: int
    end: int | None
    refs: list[Ref]


@dataclass
class FunctionContext:
    """One function's view of names, handed to every rule's ``check``."""

    module: ModuleContext
    qualname: str
    self_name: str | None
    params: dict[str, ast.arg]
    local_names: set[str]
    closure_names: set[str]
    declared_global: set[str]
    declared_nonlocal: set[str]
    rebound_at: dict[str, int]  # parameter -> first line that rebinds it
    #: what local names hold: loop variables over ``self.layers``, aliases, nested defs,
    #: names narrowed by ``isinstance`` (see :meth:`refs_of`)
    bindings: dict[str, list[Binding]]
    defaults: dict[str, ast.AST] = field(default_factory=dict)  # parameter -> default value
    written: set[int] = field(default_factory=set)  # ids of names written through (x[k] = v, x.append)
    memo_targets: set[int] = field(default_factory=set)  # ids of cache-fill targets (see memo_targets)
    #: parameter (own or of an enclosing function) -> (that function's qualname, its position
    #: among a call's arguments, -1 for keyword-only)
    param_positions: dict[str, tuple[str, int]] = field(default_factory=dict)
    #: local names assigned once, to a constant: ``flag = False``
    constants: dict[str, object] = field(default_factory=dict)
    #: attributes of ``self`` that hold a checkpoint entry point (``self.ckpt = checkpoint``)
    entry_attributes: frozenset[str] = frozenset()
    #: attributes of ``self`` whose being set a test of this function checks (``is None``)
    tested: frozenset[str] = frozenset()
    #: ``*args`` and ``**kwargs``: fresh objects on every call, never the caller's
    fresh_params: frozenset[str] = frozenset()
    #: names this function (or an enclosing one) binds by ``import``: qualified like globals
    imported: frozenset[str] = frozenset()
    #: the last value assigned to each local name (``policy = partial(...)``)
    values: dict[str, ast.AST] = field(default_factory=dict)
    #: :meth:`qualify`'s answers by ``id()`` of the node (every rule qualifies each call)
    _qualified: dict[int, str | None] = field(default_factory=dict, repr=False, compare=False)

    def bind(self, name: str, refs: list[Ref], start: int = 0, end: int | None = None) -> None:
        """``name`` holds ``refs`` from line ``start`` on; with ``end``, only inside the block
        ``start..end`` (a loop body, an ``isinstance`` branch), where it overrides the rest."""
        self.bindings.setdefault(name, []).append(Binding(start, end, list(dict.fromkeys(refs))[:MAX_REFS]))

    def refs_of(self, name: str, line: int) -> list[Ref] | None:
        """What ``name`` may hold at ``line`` (None: nothing known).

        Inside a loop body or an ``isinstance`` branch that binds it, the innermost such
        block decides (two loops reusing one variable name each see their own container);
        elsewhere every binding made before the line counts (an alias assigned in both
        branches of an ``if`` holds either value), loop bindings only after their loop.
        """
        bindings = self.bindings.get(name)
        if not bindings:
            return None
        scoped = [b for b in bindings if b.end is not None and b.start <= line <= b.end]
        if scoped:
            return list(max(scoped, key=lambda b: b.start).refs)
        before = [r for b in bindings if (b.end is None and b.start <= line) or (b.end is not None and b.end < line)
                  for r in b.refs]
        if before:
            return list(dict.fromkeys(before))[:MAX_REFS]
        return list(dict.fromkeys(r for b in bindings for r in b.refs))[:MAX_REFS] or None

    def is_self(self, node: ast.AST) -> bool:
        return self.self_name is not None and isinstance(node, ast.Name) and node.id == self.self_name

    def is_live_param(self, name: str, line: int) -> bool:
        """True when ``name`` is an argument still bound to the caller's object at ``line``."""
        if name not in self.params or name == self.self_name or name in self.fresh_params:
            return False
        return self.rebound_at.get(name, 1 << 30) >= line

    def is_local(self, name: str) -> bool:
        return (name in self.local_names or name in self.params) and name not in self.declared_global

    def is_global_variable(self, name: str) -> bool:
        """A module-level variable (not a constant import, def or class) seen from here."""
        if self.is_local(name):
            return False
        if name in self.closure_names and name not in self.declared_global:
            return False
        return name in self.module.assigned

    def qualify(self, node: ast.AST) -> str | None:
        """The dotted qualified name of a name chain whose head is not a local variable.
        What it depends on is fixed when the context is made, so each answer is kept."""
        key = id(node)
        if key in self._qualified:
            return self._qualified[key]
        qualified = self._qualified[key] = self._qualify(node)
        return qualified

    def _qualify(self, node: ast.AST) -> str | None:
        parts = dotted(node)
        if parts is None:
            return None
        if parts[0] in self.imported and parts[0] in self.module.imports:  # a function-local import
            return self.module.qualify_parts(parts)
        if self.is_local(parts[0]) or parts[0] in self.closure_names:
            return None
        return self.module.qualify_parts(parts)

    def span(self, node: ast.AST) -> Span:
        return self.module.span(node)

    def source(self, node: ast.AST) -> str:
        """Short source text of ``node`` for messages."""
        text = ast.unparse(node)
        return text if len(text) <= 60 else text[:57] + "..."
