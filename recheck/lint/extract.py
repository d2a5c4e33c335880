"""Phase one: read one file's syntax tree into :class:`~recheck.lint.facts.FileFacts`.

The tree is the standard library's :mod:`ast`; ``--fix`` places its insertions with the
same positions.  Every function body is scanned once, by every body rule,
without knowing yet whether it is checkpointed.
"""

from __future__ import annotations

import ast
import itertools
import warnings
from typing import Iterable, Iterator, Mapping, cast

from recheck.lint.facts import DYNAMIC_ATTRIBUTE, CallSite, ClassFacts, FileFacts, FunctionFacts, Ref, Span
from recheck.lint.imports import dotted, import_aliases
from recheck.lint.outline import (
    DEFINITIONS,
    StatementScan,
    TextLines,
    Unit,
    call_write_units,
    call_writes,
    statement_scan,
    units_with_words,
)
from recheck.lint.reachability import NoneStates, argument_value, guards, none_names, none_states, optional_params
from recheck.lint.rules import RULES
from recheck.lint.scope import (
    FUNCTION_NODES,
    FunctionContext,
    ModuleContext,
    Scopes,
    bound_names,
    constant_names,
    memo_targets,
    tested_attributes,
    written_names,
)
from recheck.lint.targets import (
    CHECKPOINTING_BASES,
    CHECKPOINTING_CLASSES,
    CONTAINERS,
    ENTRY_ATTRIBUTES,
    ENTRY_POINTS,
    ITERATION_METHODS,
    PARTIALS,
    REGION_KEYWORDS,
    callee_refs,
    entry_point,
    lambda_name,
    self_path,
    submodule_path,
    target_refs,
)

__all__ = ["ENTRY_WORDS", "FileExtraction", "extract", "parse"]

MEMOIZING = frozenset({"functools.lru_cache", "functools.cache", "lru_cache", "cache"})
_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef)
FunctionNode = ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda
#: the rules' hooks, by the node type of their body hook; the rules with a class or function hook
_DISPATCH: dict[type, list] = {}
for _rule in RULES:
    for _node_type in _rule.NODES:
        _DISPATCH.setdefault(_node_type, []).append(_rule)
_CLASS_RULES = [rule for rule in RULES if rule.overrides("visit_class")]
_FUNCTION_RULES = [rule for rule in RULES if rule.overrides("visit_function")]
#: a unit whose text holds one of these is analysed at once (the class and function hooks judge
#: code no region needs to reach)
_UNIT_WORDS = sorted({word for rule in RULES for word in rule.UNIT_WORDS})


def parse(source: str, path: str) -> ast.Module:
    """``ast.parse`` without the warnings CPython's compiler prints about the code it
    reads (``SyntaxWarning: invalid escape sequence``): they are not the linter's."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ast.parse(source, filename=path)


def extract(source: str, path: str, module: str, is_package: bool = False,
            extra_entries: Mapping[str, tuple[int, str]] | frozenset[str] = frozenset(),
            demand: Iterable[str] | None = None) -> FileFacts:
    """Parse ``source`` and collect its facts.  Raises :class:`SyntaxError` if it does not parse.

    ``extra_entries``: qualified names (or ``self.<attr>``) of further entry points, each
    with the position and keyword of the call argument that is its region.  With
    ``demand`` (names of top-level definitions a region is known to reach, maybe none),
    the bodies analysed are those that may hold a checkpoint, the ``demand`` and what they
    reach in the file (:meth:`FileExtraction.analyse_needed`); the others are outlined
    (:class:`~recheck.lint.facts.Deferred`).  Without it, every body is analysed.
    """
    extraction = FileExtraction(source, path, module, is_package, extra_entries, lazy=demand is not None)
    if demand is not None:
        extraction.analyse_needed(demand)
    return extraction.facts


#: Spellings of the known entry points, checkpointing classes and entry attributes; those
#: holding ``heckpoint`` are found by one scan for it (see ``FileExtraction.must_analyse``).
ENTRY_WORDS = frozenset({name.rsplit(".", 1)[-1] for name in ENTRY_POINTS} | CHECKPOINTING_CLASSES | ENTRY_ATTRIBUTES)
_FRAGMENT = "heckpoint"


class FileExtraction:
    """One parsed file: its module-wide facts, an outline of every top-level definition
    (a *unit*), and the bodies of the units analysed so far.

    Analysing a unit runs the same extraction on the same nodes with the same module-wide
    facts whenever it is done, so an outlined unit analysed later (in another process,
    after parsing the file again) gets the facts it would have got at once.
    """

    def __init__(self, source: str, path: str, module: str, is_package: bool = False,
                 extra_entries: Mapping[str, tuple[int, str]] | frozenset[str] = frozenset(),
                 lazy: bool = True) -> None:
        tree = parse(source, path)
        self.module = module
        self.extra = dict.fromkeys(extra_entries, (0, "")) if not isinstance(extra_entries, Mapping) else dict(extra_entries)
        self.scopes = scopes = Scopes(tree)
        nodes = scopes.of(tree)
        nested = scopes.nested(tree)
        self.units = [n for n in nested if isinstance(n, DEFINITIONS)]
        scan = StatementScan()
        for unit in self.units:
            statement_scan(unit, scan)
        # a function's own imports first: one table per file, where a name the module imports
        # keeps that meaning (``from transformers import X`` inside one function does not
        # rebind the module's ``from transformers.models.x import X`` for every other)
        imports = import_aliases(itertools.chain(*scan.imports, nodes), module, is_package)
        self.facts = facts = FileFacts(path=path, module=module, imports=imports)
        # lines as the parser counts them, for columns: str.splitlines also breaks at \f, \x85, \u2028
        lines = (source.replace("\r\n", "\n").replace("\r", "\n") if "\r" in source else source).split("\n")
        context = ModuleContext.build(tree, nodes, module, lines, imports)
        self.text = TextLines(source) if lazy else None
        written = set(scan.written)
        walked = call_write_units(self.text, self.units, context.assigned) if self.text else range(len(self.units))
        for scope in [*(self.units[i] for i in sorted(walked)), *(n for n in nested if type(n) is ast.Lambda)]:
            written.update(call_writes(scopes, scope))
        context.add_nested(scan.declared_global, written)
        self.top = top = _function_context(context, "<module>", [], {}, None, None)
        self.extractor = extractor = _Extractor(facts, context, self.extra, scopes)
        for node in nodes:  # module-level instances: `BLOCK = Block()`, later `checkpoint(BLOCK, x)`
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                refs = _instance_refs(node.value, top)
                if refs:
                    top.bind(node.targets[0].id, refs)
        for unit in self.units:  # a policy's check_fn is found wherever the module defines it
            if not isinstance(unit, ast.ClassDef):
                context.function_nodes[unit.name] = unit
        self.by_name: dict[str, list[ast.AST]] = {}
        for unit in self.units:
            self.by_name.setdefault(unit.name, []).append(unit)
        self.must = must = self.must_analyse() if lazy else set(self.by_name)
        extractor.block(nested, "", top, None, outline={id(u) for u in self.units if u.name not in must},
                        units={id(u) for u in self.units})
        facts.outlined = extractor.outlined
        for node in nodes:  # scripts checkpoint at module level too
            if isinstance(node, ast.Call):
                entry = entry_point(node, top, self.extra)
                if entry is not None:
                    facts.call_sites.append(_call_site(node, entry, top))

    def must_analyse(self) -> set[str]:
        """Names of the units whose text may use a checkpoint entry point (a known one, one of
        ``extra``, or a name an import binds to one; called or handed on, not named in prose)
        or one of a rule's ``UNIT_WORDS``: only an analysed body yields call sites, entry
        attributes and the class and function hooks' hazards."""
        assert self.text is not None
        entries = set(ENTRY_POINTS) | set(self.extra)
        words = {name.rsplit(".", 1)[-1] for name in self.extra}
        words |= {alias for alias, target in self.facts.imports.items() if target in entries}
        spelled = {w for w in ENTRY_WORDS | words if _FRAGMENT in w}
        found = units_with_words(self.text, self.units, sorted(words - spelled), [(_FRAGMENT, frozenset(spelled))],
                                 used=True)
        found |= units_with_words(self.text, self.units, (), [(w, frozenset()) for w in _UNIT_WORDS])
        return {self.units[i].name for i in found}

    def analyse(self, names: Iterable[str]) -> list[str]:
        """Analyse the outlined units called ``names``; return the names analysed now."""
        done = []
        for name in names:
            if name in self.facts.outlined:
                self.extractor.analyse_unit(name, self.by_name[name], self.top)
                done.append(name)
        return done

    def analyse_needed(self, demand: Iterable[str] = (), regions: bool = True, skip: Iterable[str] = ()) -> list[str]:
        """Analyse the ``demand``, the units whose classes are regions by their bases in this
        file (``GradientCheckpointingLayer`` subclasses; unless ``regions`` is false), and
        every unit they reach in the file, transitively, except those in ``skip``; return
        the names analysed.  Which units are analysed here changes only where the work is
        done: an outlined one is analysed when phase two reads it."""
        roots = set(demand) | (self._region_units() | self._reached(sorted(self.must)) if regions else set())
        done: list[str] = []
        seen: set[str] = set(skip)
        while roots:
            batch = [n for n in sorted(roots) if n in self.facts.outlined and n not in seen]
            seen |= roots
            analysed = self.analyse(batch)
            done += analysed
            roots = self._reached(analysed) - seen
        return done

    def created(self, name: str) -> list[tuple[str, str]]:
        """``("class" | "function", qualname)`` of what analysing unit ``name`` made."""
        return self.extractor.created.get(name, [])

    def _region_units(self) -> set[str]:
        classes = self.facts.classes
        regions: set[str] = set()
        changed = True
        while changed:  # bases defined in this file, transitively
            changed = False
            for qualname, cls in classes.items():
                if qualname not in regions and any(
                        b.rsplit(".", 1)[-1] in CHECKPOINTING_BASES
                        or (b.startswith(self.module + ".") and b[len(self.module) + 1:] in regions) for b in cls.bases):
                    regions.add(qualname)
                    changed = True
        return {q.split(".", 1)[0] for q in regions} & set(self.facts.outlined)

    def _reached(self, names: list[str]) -> set[str]:
        """Units of this file that the analysed units ``names`` name: callees, bases,
        submodule classes, factories' products, annotations."""
        mentioned: list[str] = []
        for name in names:
            for kind, qualname in self.created(name):
                if kind == "class":
                    cls = self.facts.classes[qualname]
                    mentioned += cls.bases
                    mentioned += (c for held in cls.attributes.values() for c in held)
                    mentioned += (f"{self.module}.{q}" for held in cls.function_attributes.values() for q in held)
                    continue
                function = self.facts.functions[qualname]
                for ref in (*function.calls, *function.returns_refs):
                    if ref.kind in ("name", "returned", "instance", "policy"):
                        mentioned += ref.name.split(",")
                mentioned += function.returns_built
                mentioned += function.annotations.values()
        prefix = self.module + "."
        return {q[len(prefix):].split(".", 1)[0] for q in mentioned if q.startswith(prefix)} & set(self.by_name)


def _function_context(module: ModuleContext, qualname: str, nodes: list[ast.AST],
                      args: dict[str, ast.arg], self_name: str | None,
                      parent: FunctionContext | None, defaults: dict | None = None,
                      positions: dict[str, int] | None = None,
                      entry_attributes: frozenset[str] = frozenset(),
                      fresh: frozenset[str] | None = None) -> FunctionContext:
    declared_global: set[str] = set()
    declared_nonlocal: set[str] = set()
    imported: set[str] = set()
    for node in nodes:
        kind = type(node)
        if kind is ast.Global:
            declared_global.update(cast(ast.Global, node).names)
        elif kind is ast.Nonlocal:
            declared_nonlocal.update(cast(ast.Nonlocal, node).names)
        elif kind is ast.Import or kind is ast.ImportFrom:
            aliases = cast("ast.Import | ast.ImportFrom", node).names
            imported.update(alias.asname or alias.name.split(".")[0] for alias in aliases)
    bound = list(bound_names(nodes))
    local_names, rebound_at = set(), {}
    for name, line, plain in bound:
        local_names.add(name)
        if plain and name in args and name not in rebound_at:
            rebound_at[name] = line
    closure = set()
    if parent is not None and parent.qualname != "<module>":
        closure = parent.local_names | set(parent.params) | parent.closure_names
    inherited = {k: list(v) for k, v in parent.bindings.items()} if parent is not None else {}
    param_positions = dict(parent.param_positions) if parent is not None and parent.qualname != "<module>" else {}
    for name in local_names - set(args):
        param_positions.pop(name, None)
    param_positions.update({name: (qualname, index) for name, index in (positions or {}).items()})
    if parent is not None:
        imported |= parent.imported
    context = FunctionContext(
        module, qualname, self_name, args, local_names - declared_global - declared_nonlocal,
        closure, declared_global, declared_nonlocal, rebound_at,
        inherited, defaults or {}, written_names(nodes),
        memo_targets(nodes, self_name, frozenset(a for a in args if a != self_name)), param_positions,
        constant_names(nodes, bound),
        entry_attributes or (parent.entry_attributes if parent is not None else frozenset()),
        tested_attributes(nodes, self_name),
        fresh or frozenset(),
        frozenset(imported),
    )
    return context


class _Extractor:
    def __init__(self, facts: FileFacts, module: ModuleContext, extra_entries: dict[str, tuple[int, str]],
                 scopes: Scopes) -> None:
        self.scopes = scopes
        self.facts = facts
        self.module = module
        self.extra_entries = extra_entries
        self.class_entries: dict[str, frozenset[str]] = {}
        #: what is None in the function being scanned while its parameters are left out (call
        #: arguments are read against it)
        self._none: NoneStates = ({}, {})
        #: units outlined, by name: the qualnames of the classes and functions outlined
        self.outlined: dict[str, list[str]] = {}
        #: units analysed after the first pass, by name: what their analysis made
        self.created: dict[str, list[tuple[str, str]]] = {}
        self._making: list[tuple[str, str]] | None = None

    def block(self, nodes: list[ast.AST], prefix: str, context: FunctionContext, owner: str | None,
              outline: set[int] | frozenset[int] = frozenset(), units: set[int] | frozenset[int] = frozenset()) -> None:
        """Visit the functions and classes among ``nodes`` (the scope nodes directly inside one
        scope, :meth:`Scopes.nested`): those whose ``id`` is in ``outline`` only outlined;
        what the other ``units`` make is recorded."""
        for node in nodes:
            if outline and id(node) in outline:  # the ids of top-level definitions
                self.outline(node, prefix, context, owner, self.outlined.setdefault(cast(Unit, node).name, []))
            elif units and id(node) in units:
                self.analyse_unit(cast(Unit, node).name, [node], context)
            elif isinstance(node, ast.ClassDef):
                self.klass(node, prefix + node.name, context)
            elif isinstance(node, FUNCTION_NODES):
                name = lambda_name(node, context.qualname) if isinstance(node, ast.Lambda) else prefix + node.name
                self.module.function_nodes[name] = node
                self.function(node, name, context, owner)

    def outline(self, node: ast.AST, prefix: str, context: FunctionContext, owner: str | None, into: list[str]) -> None:
        """What :meth:`block` would record of ``node``'s classes and functions without their
        bodies: classes with their bases and methods (nested classes of class bodies too),
        functions with their place and class (:attr:`FunctionFacts.OUTLINE`)."""
        if isinstance(node, ast.ClassDef):
            qualname = prefix + node.name
            facts = ClassFacts(qualname, context.span(node), [q for q in (context.qualify(b) for b in node.bases) if q])
            self.facts.classes[qualname] = facts
            into.append(qualname)
            nested = self.scopes.nested(node)
            for child in nested:
                if type(child) in _DEFS:
                    facts.methods[child.name] = f"{qualname}.{child.name}"  # type: ignore[attr-defined]
            for child in nested:
                self.outline(child, qualname + ".", context, qualname, into)
            return
        function = cast(FunctionNode, node)  # block and outline hand on only definitions and lambdas
        name = lambda_name(function, context.qualname) if isinstance(function, ast.Lambda) else prefix + function.name
        self.module.function_nodes[name] = function
        self.facts.functions[name] = FunctionFacts(name, context.span(function),
                                                   _self_binding(function, owner, context, self.facts)[1])
        into.append(name)

    def analyse_unit(self, name: str, nodes: list[ast.AST], top: FunctionContext) -> None:
        """Analyse the units called ``name`` (a name defined twice is one unit)."""
        self._making = self.created.setdefault(name, [])
        try:
            self.block(nodes, "", top, None)
        finally:
            self._making = None
        self.outlined.pop(name, None)

    def klass(self, node: ast.ClassDef, qualname: str, context: FunctionContext) -> None:
        bases = [q for q in (context.qualify(b) for b in node.bases) if q]
        facts = ClassFacts(qualname, context.span(node), bases)
        self.facts.classes[qualname] = facts
        if self._making is not None:
            self._making.append(("class", qualname))
        nested = self.scopes.nested(node)  # the scope nodes of the class body, in source order
        for child in nested:
            if type(child) in _DEFS:
                facts.methods[child.name] = f"{qualname}.{child.name}"  # type: ignore[attr-defined]
                self.module.function_nodes.setdefault(facts.methods[child.name], child)  # type: ignore[attr-defined]
        for statement in node.body:
            if (type(statement) is ast.Assign and len(statement.targets) == 1 and type(statement.targets[0]) is ast.Name
                    and type(statement.value) is ast.Constant and type(statement.value.value) is bool):
                facts.flags[statement.targets[0].id] = statement.value.value
        attributes = self._entry_attributes(nested, context)
        self.class_entries[qualname] = attributes
        self.facts.entry_attributes.extend(f"{qualname}.{a}" for a in sorted(attributes))
        if any(isinstance(d, ast.Name | ast.Attribute | ast.Call) and _is_dataclass(d, context)
               for d in node.decorator_list):
            facts.flags["@dataclass"] = True
        self.block(nested, qualname + ".", context, qualname)
        for rule in _CLASS_RULES:
            for method, hazard in rule.visit_class(node, bases, context):
                if method is None:
                    self.facts.file_hazards.append(hazard)
                    continue
                reached = self.facts.functions.get(f"{qualname}.{method}")
                if reached is not None:  # counts where a region reaches it (``Function.apply`` runs ``forward``)
                    reached.hazards.append(hazard)

    def _entry_attributes(self, class_nodes: list[ast.AST], context: FunctionContext) -> frozenset[str]:
        """``self.<attr> = checkpoint`` (a partial of one, a parameter defaulting to one, or
        ``CheckpointWithoutOutput()``) in the class's methods: calling it checkpoints."""
        found: set[str] = set()
        for method in class_nodes:
            if not isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)) or not method.args.args:
                continue
            self_name = method.args.args[0].arg
            positional = [*method.args.posonlyargs, *method.args.args]
            defaults = dict(zip([a.arg for a in positional][::-1], method.args.defaults[::-1]))
            defaults.update({a.arg: d for a, d in zip(method.args.kwonlyargs, method.args.kw_defaults) if d is not None})
            for node in self.scopes.of(method):
                if type(node) is not ast.Assign:
                    continue
                node = cast(ast.Assign, node)
                for target in node.targets:
                    if (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
                            and target.value.id == self_name and self._holds_entry(node.value, context, defaults)):
                        found.add(target.attr)
        return frozenset(found)

    def _holds_entry(self, value: ast.AST, context: FunctionContext, defaults: Mapping[str, ast.AST]) -> bool:
        if isinstance(value, ast.IfExp):
            return self._holds_entry(value.body, context, defaults) or self._holds_entry(value.orelse, context, defaults)
        if isinstance(value, ast.Name) and value.id in defaults:
            value = defaults[value.id]
        if isinstance(value, ast.Call):
            qualified = context.module.qualify_parts(dotted(value.func) or ["?"])
            if qualified in PARTIALS and value.args:
                return self._holds_entry(value.args[0], context, defaults)
            return qualified.rsplit(".", 1)[-1] in CHECKPOINTING_CLASSES
        parts = dotted(value)
        if not parts:
            return False
        qualified = context.module.qualify_parts(parts)
        return qualified in ENTRY_POINTS or qualified in self.extra_entries

    def function(self, node: FunctionNode, qualname: str, parent: FunctionContext, owner: str | None) -> None:
        arguments = node.args
        positional = [*arguments.posonlyargs, *arguments.args]
        args = {a.arg: a for a in [*positional, *arguments.kwonlyargs, arguments.vararg, arguments.kwarg] if a}
        defaults = dict(zip([a.arg for a in positional][::-1], arguments.defaults[::-1]))
        defaults.update({a.arg: d for a, d in zip(arguments.kwonlyargs, arguments.kw_defaults) if d is not None})
        decorators = getattr(node, "decorator_list", [])
        (self_name, self_class), bound = _self_binding(node, owner, parent, self.facts), _bound(node, owner)
        call_order = [a.arg for a in positional][1 if bound else 0:]
        positions = {name: index for index, name in enumerate(call_order)}
        positions.update({a.arg: -1 for a in arguments.kwonlyargs})
        nodes = self.scopes.of(node)
        entries = self.class_entries.get(owner, frozenset()) if owner is not None else frozenset()
        fresh = frozenset(a.arg for a in (arguments.vararg, arguments.kwarg) if a is not None)
        context = _function_context(self.module, qualname, nodes, args, self_name, parent, defaults, positions, entries,
                                    fresh)
        facts = FunctionFacts(qualname, context.span(node), self_class)
        if self._making is not None:
            self._making.append(("function", qualname))
        facts.params = call_order
        facts.annotations = {a.arg: q for a in positional if a.annotation is not None
                             for q in [context.qualify(a.annotation)] if q}
        decorated = [context.qualify(d.func if isinstance(d, ast.Call) else d) for d in decorators]
        facts.memoized = any(d in MEMOIZING for d in decorated)
        if isinstance(node, ast.Lambda):
            built = _container(node.body, context)
            if built:
                facts.returned.append((context.span(node.body), built))
        elif node.returns is not None:
            returns = node.returns.value if isinstance(node.returns, ast.Subscript) else node.returns
            facts.returns_annotation = context.qualify(returns) or ""
        self.facts.functions[qualname] = facts
        self._bind_locals(nodes, context, qualname)
        optional = optional_params(arguments)
        if not isinstance(node, ast.Lambda) and optional:
            facts.none_if = none_names(nodes, arguments)
        self._none = none_states(facts.none_if, optional)
        sites = len(self.facts.call_sites)
        self._scan(nodes, context, facts)
        calls = len(self.facts.call_sites) > sites
        for rule in _FUNCTION_RULES:
            if rule.SITES_ONLY and not calls:
                continue
            for draft, refs in rule.visit_function(nodes, context, self_class if bound else None):
                self.facts.hooked.append((qualname, draft, refs))
        if self_name is not None and bound:
            facts.self_reads, facts.self_writes = _self_data(nodes, context)
            if owner is not None and getattr(node, "name", None) == "__init__":
                owner_facts = self.facts.classes[owner]
                if any(b.rsplit(".", 1)[-1] in TORCH_WRAPPER_BASES for b in owner_facts.bases):
                    for statement in nodes:  # torch's ActivationWrapper keeps its first argument
                        if (type(statement) is ast.Call and isinstance(statement.func, ast.Attribute)
                                and statement.func.attr == "__init__" and statement.args
                                and isinstance(statement.args[0], ast.Name) and statement.args[0].id in positions):
                            name = statement.args[0].id
                            owner_facts.param_attributes["_checkpoint_wrapped_module"] = (name, positions[name])
                for statement in nodes:
                    if type(statement) is ast.Assign and isinstance(statement.value, ast.Name) \
                            and statement.value.id in positions:
                        for target in statement.targets:
                            if isinstance(target, ast.Attribute) and context.is_self(target.value):
                                owner_facts.param_attributes[target.attr] = (statement.value.id, positions[statement.value.id])
        if not isinstance(node, ast.Lambda):
            facts.optional = sorted(optional)
            facts.star = [a.arg if a is not None else "" for a in (arguments.vararg, arguments.kwarg)]
            facts.keyword_only = [a.arg for a in arguments.kwonlyargs]
            if facts.optional:  # branches that cannot run hide their side effects and their calls
                facts.guards = guards(nodes, arguments)
        self._attributes(nodes, context, self.facts.classes[owner] if owner is not None and self_name is not None else None, facts)
        self.block(self.scopes.nested(node), qualname + ".", context, None)

    def _bind_locals(self, nodes: list[ast.AST], context: FunctionContext, qualname: str) -> None:
        """Loop variables, aliases, nested defs, ``isinstance`` branches (see ``refs_of``)."""
        iterables: dict[str, ast.AST] = {}
        for node in nodes:
            kind = type(node)
            if kind not in _BINDING_NODES:
                continue
            if kind is ast.FunctionDef or kind is ast.AsyncFunctionDef or kind is ast.ClassDef:
                definition = cast("ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef", node)
                context.bind(definition.name, [Ref("local", f"{qualname}.{definition.name}", context.span(node))],
                             definition.lineno)
            elif kind is ast.For or kind is ast.AsyncFor or kind is ast.comprehension:
                loop = cast("ast.For | ast.AsyncFor | ast.comprehension", node)
                start, end = ((loop.lineno, loop.end_lineno or loop.lineno) if not isinstance(loop, ast.comprehension)
                              else (0, None))
                for name, refs in _loop_bindings(loop.target, loop.iter, context, iterables, 0):
                    context.bind(name, refs, start, end)
            elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                name = node.targets[0].id
                context.values[name] = node.value
                shortened = isinstance(node.value, ast.Subscript) and isinstance(node.value.value, ast.Name) \
                    and node.value.value.id == name  # stages = stages[:k]: still the same elements
                if _is_iterable(node.value) and not (shortened and name in iterables):
                    iterables[name] = node.value
                refs = _alias_refs(node.value, context, iterables)
                if refs:  # from the next line on: `block = wrap(block)` reads the old value
                    context.bind(name, refs, (node.end_lineno or node.lineno) + 1)
            elif isinstance(node, ast.If) and node.body:
                for name, classes in _isinstance_tests(node.test, context):
                    context.bind(name, [Ref("instance", c, context.span(node.test)) for c in classes],
                                 node.body[0].lineno, node.body[-1].end_lineno or node.body[-1].lineno)

    def _scan(self, nodes: list[ast.AST], context: FunctionContext, facts: FunctionFacts) -> None:
        seen_once: set[tuple[str, str]] = set()
        dispatch, call, returned = _DISPATCH, ast.Call, ast.Return
        for node in nodes:  # by exact type: a parsed tree holds no subclass of a node class
            kind = type(node)
            for rule in dispatch.get(kind, ()):
                for hazard in rule.visit(node, context):
                    if rule.ONCE_PER_FUNCTION:
                        if (hazard.code, hazard.what) in seen_once:
                            continue
                        seen_once.add((hazard.code, hazard.what))
                    facts.hazards.append(hazard)
            if kind is call:
                self._call(cast(ast.Call, node), context, facts)
            elif kind is not returned:
                continue
            elif isinstance(value := cast(ast.Return, node).value, (ast.Name, ast.Attribute, ast.Subscript)):
                held = callee_refs(value, context)
                facts.returns_local += [r.name for r in held if r.kind == "local"]
                facts.returns_refs += [r for r in held if r.kind != "local"]
            elif value is not None:
                built = _container(value, context)
                if built:
                    facts.returned.append((context.span(value), built))

    def _call(self, node: ast.Call, context: FunctionContext, facts: FunctionFacts) -> None:
        entry = entry_point(node, context, self.extra_entries)
        if entry is not None:
            self.facts.call_sites.append(_call_site(node, entry, context))
        else:
            refs = callee_refs(node.func, context)
            if refs:
                positional = -1 if any(isinstance(a, ast.Starred) for a in node.args) else len(node.args)
                splats = tuple(k.value.id if isinstance(k.value, ast.Name) else "?" for k in node.keywords if k.arg is None)
                values = [(k.arg, argument_value(k.value, self._none)) for k in node.keywords]
                keywords = tuple(f"{name}={value}" if value else name for name, value in values if name is not None)
                facts.call_passes.append((len(facts.calls), len(refs), positional, keywords, splats, node.lineno,
                                          tuple(argument_value(a, self._none) for a in node.args)))
            facts.calls.extend(refs)

    def _attributes(self, nodes: list[ast.AST], context: FunctionContext, owner: ClassFacts | None,
                    facts: FunctionFacts) -> None:
        """The modules a body builds: into ``self.<path>`` (``owner``'s submodules), into
        local lists and plain local objects (``down = nn.Module(); down.block = ...``), and
        what it returns (a factory)."""
        local_lists: dict[str, list[str]] = {}
        local_objects: dict[str, dict[str, list[str]]] = {}

        def store(whole: ast.AST, classes: list[str], value: ast.AST | None) -> None:
            # no recursion: a closure that calls itself is a reference cycle, which keeps the
            # file's syntax tree (that ``context`` holds) alive until the collector runs
            for target in _leaves(whole):  # self.stages, info = create_stages(cfg): either
                if target is not whole:
                    value = None
                if isinstance(target, ast.Name):
                    local_lists.setdefault(target.id, []).extend(classes)
                    if isinstance(value, ast.Name) and value.id in local_objects:
                        local_objects[target.id] = local_objects[value.id]
                    continue
                path = self_path(target, context.self_name)
                if path is not None and owner is not None:
                    if classes:
                        owner.attributes.setdefault(path, []).extend(classes)
                    if isinstance(value, ast.Name):  # self.act = act_fn, a nested or module function
                        held = context.refs_of(value.id, value.lineno) or []
                        named = [r.name for r in held if r.kind == "local"]
                        if not held and value.id in context.module.defined:
                            named = [value.id]
                        owner.function_attributes.setdefault(path, []).extend(named)
                    if isinstance(value, ast.Name) and value.id in local_objects:
                        for attribute, classes_held in local_objects[value.id].items():
                            owner.attributes.setdefault(f"{path}.{attribute}", []).extend(classes_held)
                    continue
                base = target.value if isinstance(target, (ast.Attribute, ast.Subscript)) else None
                if isinstance(target, ast.Attribute) and isinstance(base, ast.Name):
                    local_objects.setdefault(base.id, {}).setdefault(target.attr, []).extend(classes)
                elif isinstance(target, ast.Subscript) and isinstance(base, ast.Name):  # blocks[name] = Block()
                    local_lists.setdefault(base.id, []).extend(classes)

        sources: dict[str, ast.AST] | None = None  # made when a module is added by name (rare)

        def traced(value: ast.AST) -> list[str]:
            """What ``value`` builds, through the loops and unpackings that bound its names."""
            nonlocal sources
            if sources is None:
                sources = _unpacked_sources(nodes)
            for depth in range(4):
                classes = _module_classes(value, context, local_lists)
                inner = value.value if isinstance(value, ast.Starred) else value
                if classes or depth == 3 or not (isinstance(inner, ast.Name) and inner.id in sources):
                    break
                value = sources[inner.id]
            return classes

        for node in nodes:
            kind = type(node)
            if kind is not ast.Call and kind is not ast.Assign and kind is not ast.Return and kind is not ast.AugAssign:
                continue
            named = _named_module(cast(ast.Call, node), context) if kind is ast.Call and owner is not None else None
            if named is not None:  # self.add_module("layer1", m), setattr(self, name, m): "*" when computed
                attribute, value = named
                classes = traced(value)
                if classes:
                    owner.attributes.setdefault(attribute, []).extend(classes)  # type: ignore[union-attr]
                continue
            if kind is ast.Call and isinstance(func := cast(ast.Call, node).func, ast.Attribute) \
                    and func.attr in ("append", "extend", "insert", "add_module"):
                args = cast(ast.Call, node).args
                values = args[1:] if func.attr in ("insert", "add_module") else args
                for value in values:
                    store(func.value, _module_classes(value, context, local_lists), value)
            elif isinstance(node, ast.Assign):
                classes = _module_classes(node.value, context, local_lists)
                for target in node.targets:
                    store(target, classes, node.value)
            elif isinstance(node, ast.AugAssign):  # stages += [Stage(...)]
                store(node.target, _module_classes(node.value, context, local_lists), None)
            elif isinstance(node, ast.Return) and node.value is not None:
                facts.returns_built.extend(_module_classes(node.value, context, local_lists))
                if isinstance(node.value, ast.Name):  # return block_fn: the class a factory picks
                    facts.returns_built.extend(_class_references(node.value, context))


def _unpacked_sources(nodes: list[ast.AST]) -> dict[str, ast.AST]:
    """Each loop variable's iterable and each name unpacked from a value, by name (the first)."""
    sources: dict[str, ast.AST] = {}
    for node in nodes:
        kind = type(node)
        if kind is ast.For or kind is ast.comprehension or (
                kind is ast.Assign and any(isinstance(t, ast.Tuple) for t in node.targets)):  # type: ignore[attr-defined]
            targets = [node.target] if kind is not ast.Assign else node.targets  # type: ignore[attr-defined]
            origin = node.value if kind is ast.Assign else node.iter  # type: ignore[attr-defined]
            for target in targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        sources.setdefault(name.id, origin)
    return sources


def _leaves(target: ast.AST) -> Iterator[ast.AST]:
    """The targets inside a tuple or list target (at any depth), in order; else ``target``."""
    if isinstance(target, (ast.Tuple, ast.List)):
        for element in target.elts:
            yield from _leaves(element)
    else:
        yield target

_ADDING_METHODS = frozenset({"add_module", "register_module"})


def _named_module(node: ast.Call, context: FunctionContext) -> tuple[str, ast.AST] | None:
    """``self.add_module(name, m)``, ``self.register_module(name, m)``, ``setattr(self, name,
    m)``: the attribute (``DYNAMIC_ATTRIBUTE`` when not a constant) and the module expression
    (``*pair`` as given)."""
    func, args = node.func, node.args
    if isinstance(func, ast.Attribute) and func.attr in _ADDING_METHODS and context.is_self(func.value):
        pair = args
    elif isinstance(func, ast.Name) and func.id == "setattr" and args and context.is_self(args[0]):
        pair = args[1:]
    else:
        return None
    if len(pair) == 1 and isinstance(pair[0], ast.Starred):
        return DYNAMIC_ATTRIBUTE, pair[0]
    if len(pair) != 2 or any(isinstance(a, ast.Starred) for a in pair):
        return None
    known, name = _constant(pair[0], context)
    attribute = name if known and isinstance(name, str) and name.isidentifier() else DYNAMIC_ATTRIBUTE
    return attribute, pair[1]


def _bound(node: FunctionNode, owner: str | None) -> bool:
    """A method called on an instance: ``self`` is its first parameter."""
    if owner is None or isinstance(node, ast.Lambda):
        return False
    positional = [*node.args.posonlyargs, *node.args.args]
    return bool(positional) and not any(dotted(d) == ["staticmethod"] for d in node.decorator_list)


def _self_binding(node: FunctionNode, owner: str | None, parent: FunctionContext,
                  facts: FileFacts) -> tuple[str | None, str | None]:
    """The name ``self`` has in a function, and the qualname of its class: a method's first
    parameter, or what the enclosing function's ``self`` is (unless a parameter shadows it)."""
    if _bound(node, owner):
        return [*node.args.posonlyargs, *node.args.args][0].arg, owner
    enclosing = facts.functions.get(parent.qualname)
    self_name, self_class = parent.self_name, enclosing.self_class if enclosing else None
    arguments = node.args
    names = {a.arg for a in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs,
                             arguments.vararg, arguments.kwarg] if a}
    if self_name in names:
        return None, None
    return self_name, self_class


def _self_data(nodes: list[ast.AST], context: FunctionContext) -> tuple[list[tuple[str, Span]], list[str]]:
    """What a method reads of ``self`` as data, and what it rebinds (see FunctionFacts)."""
    called = {id(n.func) for n in nodes if type(n) is ast.Call}
    reads: dict[str, Span] = {}
    writes: list[str] = []
    for node in nodes:
        kind = type(node)
        if kind is ast.Attribute:
            attribute = cast(ast.Attribute, node)
            if type(attribute.ctx) is ast.Load and id(node) not in called \
                    and context.is_self(attribute.value) and attribute.attr not in reads:
                reads[attribute.attr] = context.span(node)
        elif kind is ast.Assign or kind is ast.AnnAssign:
            assignment = cast("ast.Assign | ast.AnnAssign", node)
            for target in assignment.targets if isinstance(assignment, ast.Assign) else [assignment.target]:
                if isinstance(target, ast.Attribute):
                    path = self_path(target, context.self_name)
                    if path is not None:
                        writes.append(path)
    return list(reads.items()), writes


_ITERATION_WRAPPERS = frozenset({"list", "tuple", "reversed", "sorted", "iter"})
#: torch's wrapper bases, whose ``__init__(module)`` keeps ``self._checkpoint_wrapped_module``
TORCH_WRAPPER_BASES = frozenset({"ActivationWrapper", "CheckpointWrapper", "OffloadWrapper"})
_BINDING_NODES = frozenset({ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.For, ast.AsyncFor,
                            ast.comprehension, ast.Assign, ast.If})


def _is_iterable(value: ast.AST) -> bool:
    """An expression a later ``for`` may loop over: ``list(zip(...))``, ``self.blocks[:k]``."""
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name):
        return value.func.id in _ITERATION_WRAPPERS | {"zip", "enumerate"}
    return isinstance(value, (ast.Attribute, ast.Subscript, ast.List, ast.Tuple))


def _alias_refs(value: ast.AST, context: FunctionContext, iterables: dict[str, ast.AST]) -> list[Ref]:
    """``layer = self.layers[i]``, ``fn = partial(...)``, ``fn = create_custom_forward(m)``,
    ``blocks = list(self.blocks)``, ``layers = model.get_submodule("layers")``."""
    value = submodule_path(value)
    if isinstance(value, (ast.Attribute, ast.Subscript, ast.Name)):
        return callee_refs(value, context)
    if isinstance(value, (ast.IfExp, ast.BoolOp)):  # block_fn = PostNormBlock if post_norm else Block
        arms = [value.body, value.orelse] if isinstance(value, ast.IfExp) else value.values
        return [r for arm in arms for r in _alias_refs(arm, context, iterables)]
    if isinstance(value, ast.Call):
        if isinstance(value.func, ast.Name) and value.func.id in _ITERATION_WRAPPERS and value.args:
            return _alias_refs(value.args[0], context, iterables)
        if isinstance(value.func, ast.Attribute) and context.is_self(value.func.value):
            return [Ref("result", value.func.attr, context.span(value))]  # layer = self._get_layer(i)
        if context.qualify(value.func) in PARTIALS or _is_factory_like(value, context):
            return target_refs(value, context)
        return _instance_refs(value, context)
    if isinstance(value, (ast.List, ast.Tuple)):
        return [r for e in value.elts for r in _alias_refs(e, context, iterables)]
    return []


def _instance_refs(value: ast.AST, context: FunctionContext) -> list[Ref]:
    """``block = Block(...)``: what the name holds is an instance of the class (or what a
    factory function returns), resolved in phase two; any other value binds nothing."""
    if not (isinstance(value, ast.Call) and isinstance(value.func, (ast.Name, ast.Attribute))):
        return []
    if isinstance(value.func, ast.Attribute) and not context.qualify(value.func):
        return []
    return [r for r in target_refs(value, context) if r.kind == "returned"]


def _is_factory_like(call: ast.Call, context: FunctionContext) -> bool:
    if context.qualify(call.func) in PARTIALS:
        return True
    return any(r.kind == "local" for r in callee_refs(call.func, context))


def _isinstance_tests(test: ast.AST, context: FunctionContext) -> Iterator[tuple[str, list[str]]]:
    """``isinstance(x, (A, B))`` (also inside ``and``) narrows ``x`` to classes A and B."""
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        for value in test.values:
            yield from _isinstance_tests(value, context)
        return
    if (isinstance(test, ast.Call) and isinstance(test.func, ast.Name) and test.func.id == "isinstance"
            and len(test.args) == 2 and isinstance(test.args[0], ast.Name)):
        kinds = test.args[1].elts if isinstance(test.args[1], ast.Tuple) else [test.args[1]]
        classes = [q for q in (context.qualify(k) for k in kinds) if q]
        if classes:
            yield test.args[0].id, classes


def _loop_bindings(target: ast.AST, iterable: ast.AST, context: FunctionContext,
                   iterables: dict[str, ast.AST], depth: int) -> Iterator[tuple[str, list[Ref]]]:
    """``for i, (a, b) in enumerate(zip(self.xs, self.ys))`` binds ``a`` and ``b`` to the
    elements of ``self.xs`` and ``self.ys`` (through local aliases, slices, ``list()``,
    ``.items()``, ``.named_children()``, ``.values()``)."""
    if depth > 6:
        return
    if isinstance(iterable, ast.Name) and iterable.id in iterables and depth < 6:
        yield from _loop_bindings(target, iterables[iterable.id], context, iterables, depth + 1)
        return
    if isinstance(iterable, ast.Subscript) and isinstance(iterable.slice, ast.Slice):
        yield from _loop_bindings(target, iterable.value, context, iterables, depth + 1)
        return
    if isinstance(iterable, ast.Call) and isinstance(iterable.func, ast.Name) and iterable.args:
        name, first = iterable.func.id, iterable.args[0]
        if name == "enumerate" and isinstance(target, ast.Tuple) and len(target.elts) == 2:
            yield from _loop_bindings(target.elts[1], first, context, iterables, depth + 1)
            return
        if name == "zip" and isinstance(target, ast.Tuple) and len(target.elts) == len(iterable.args):
            for element, source in zip(target.elts, iterable.args):
                yield from _loop_bindings(element, source, context, iterables, depth + 1)
            return
        if name in _ITERATION_WRAPPERS:
            yield from _loop_bindings(target, first, context, iterables, depth + 1)
            return
    if isinstance(iterable, ast.Call) and isinstance(iterable.func, ast.Attribute) and iterable.func.attr in ITERATION_METHODS:
        pairs = iterable.func.attr in ("items", "named_children", "named_modules")
        if context.is_self(iterable.func.value):  # self.children(), self.items() of a ModuleDict subclass
            child = target.elts[1] if pairs and isinstance(target, ast.Tuple) and len(target.elts) == 2 else target
            if isinstance(child, ast.Name):  # every submodule of this module
                yield child.id, [Ref("children", "", context.span(iterable))]
            return
        if pairs and isinstance(target, ast.Tuple) and len(target.elts) == 2:
            yield from _loop_bindings(target.elts[1], iterable.func.value, context, iterables, depth + 1)
        elif not pairs:
            yield from _loop_bindings(target, iterable.func.value, context, iterables, depth + 1)
        return
    if isinstance(target, ast.Tuple) and isinstance(iterable, (ast.List, ast.Tuple)) and iterable.elts and all(
            isinstance(e, ast.Tuple) and len(e.elts) == len(target.elts) for e in iterable.elts):
        for index, element in enumerate(target.elts):  # for embed, stage in [(self.embed1, self.stage1), ...]
            column = ast.List(elts=[cast(ast.Tuple, e).elts[index] for e in iterable.elts], ctx=ast.Load())
            yield from _loop_bindings(element, column, context, iterables, depth + 1)
        return
    if not isinstance(target, ast.Name):
        return
    if isinstance(iterable, (ast.List, ast.Tuple)):
        refs = [r for e in iterable.elts for r in callee_refs(e, context)]
    else:
        refs = callee_refs(iterable, context)
    if refs:
        yield target.id, refs


def _module_classes(value: ast.AST, context: FunctionContext, local_lists: dict[str, list[str]]) -> list[str]:
    """Qualified names of what an expression builds: classes, or factory functions whose
    returns phase two follows (a class is a module because of its bases, so every call of a
    name the file can qualify counts; containers give their elements)."""
    if isinstance(value, ast.Call):
        func = value.func
        if isinstance(func, ast.Call):  # get_block_fn(cfg)(dim): what the factory returns, called
            return _module_classes(func, context, local_lists)
        if isinstance(func, ast.Subscript):  # _block_registry[kind](...): any class the registry holds
            return _class_references(func.value, context)
        qualified = context.qualify(func)
        if qualified is None and isinstance(func, ast.Name):
            called = _called_name(func, context)
            if called:
                return called
        if qualified is None and isinstance(func, ast.Attribute) and context.is_self(func.value):
            owner = context.qualname.rsplit(".", 1)[0] if "." in context.qualname else ""
            qualified = f"{context.module.module}.{owner}.{func.attr}" if owner else None  # self._make_layer(...)
        last = (qualified or "").rsplit(".", 1)[-1]
        if last in _HOLDERS:
            parts = [*value.args, *(k.value for k in value.keywords)]
            return [c for p in parts for c in _module_classes(p, context, local_lists)]
        return [qualified] if qualified and qualified not in _NOT_MODULES else []
    if isinstance(value, (ast.List, ast.Tuple, ast.Set)):
        return [c for e in value.elts for c in _module_classes(e, context, local_lists)]
    if isinstance(value, (ast.ListComp, ast.GeneratorExp, ast.SetComp)):
        return _module_classes(value.elt, context, local_lists)
    if isinstance(value, ast.DictComp):
        return _module_classes(value.value, context, local_lists)
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


#: Calls whose arguments are what they hold: ``nn.Sequential(OrderedDict([("b1", Block())]))``.
_HOLDERS = CONTAINERS | {"list", "tuple", "dict", "OrderedDict"}
#: Annotation names that hold classes without being one (``Tuple[Type[Block], ...]``).
_TYPING = ("typing.", "typing_extensions.", "collections.abc.")


def _called_name(func: ast.Name, context: FunctionContext) -> list[str]:
    """What calling the name ``func`` builds when it is no global: a parameter's default or
    the classes its annotation names (``block_fn: Type[Block] = Block``), the classes a local
    alias holds (``block_fn = PostNorm if post else Block``, a loop over an annotated
    parameter), a nested factory's product, or what an object's ``__call__`` returns
    (``builder = StageBuilder(); builder(cfg)``)."""
    found: list[str] = []
    if func.id in context.params:
        found += _class_references(context.defaults.get(func.id), context)
        found += _annotated_classes(context.params[func.id].annotation, context)
    for ref in context.refs_of(func.id, func.lineno) or ():
        if ref.kind == "local":  # a nested factory: def build_layer(i)
            found.append(f"{context.module.module}.{ref.name}")
        elif ref.kind == "name":
            found.append(ref.name)
        elif ref.kind == "param" and ref.name in context.params:
            found += _annotated_classes(context.params[ref.name].annotation, context)
        elif ref.kind == "returned" and ref.member == "name":  # an instance, called
            found.append(f"{ref.name}.__call__")
    return list(dict.fromkeys(found))


def _class_references(value: ast.AST | None, context: FunctionContext, depth: int = 0) -> list[str]:
    """Qualified names of the classes (or functions) an expression refers to without calling
    them: a name, an alias, both arms of ``a if c else b`` and ``a or b``, the values of a
    dict or a registry module variable, the function of a ``partial``."""
    if value is None or depth > 4:
        return []
    if isinstance(value, ast.Name) and (context.is_local(value.id) or value.id in context.closure_names):
        return [r.name for r in context.refs_of(value.id, value.lineno) or () if r.kind == "name"]
    if isinstance(value, (ast.Name, ast.Attribute)):
        qualified = context.qualify(value)
        if qualified and "." in qualified:
            return [qualified]
        held = context.module.values.get(value.id) if isinstance(value, ast.Name) else None
        return _class_references(held, context, depth + 1)
    parts: list[ast.expr] = []
    if isinstance(value, ast.IfExp):
        parts = [value.body, value.orelse]
    elif isinstance(value, ast.BoolOp):
        parts = value.values
    elif isinstance(value, ast.Dict):
        parts = [v for v in value.values if v is not None]
    elif isinstance(value, (ast.List, ast.Tuple, ast.Set)):
        parts = value.elts
    elif isinstance(value, ast.Call):
        called = context.qualify(value.func) or ""
        if called in PARTIALS:
            parts = value.args[:1]
        elif called.rsplit(".", 1)[-1] in ("dict", "OrderedDict"):
            parts = [*value.args, *(k.value for k in value.keywords)]
    return [c for part in parts for c in _class_references(part, context, depth + 1)]


def _annotated_classes(annotation: ast.AST | None, context: FunctionContext) -> list[str]:
    """The classes an annotation names: ``Tuple[Union[Type[A], Type[B]], ...]`` and ``A | B``
    give ``A`` and ``B`` (typing's own names and builtins left out)."""
    if annotation is None:
        return []
    if isinstance(annotation, ast.Subscript):
        return _annotated_classes(annotation.slice, context)
    if isinstance(annotation, (ast.Tuple, ast.List)):
        return [c for e in annotation.elts for c in _annotated_classes(e, context)]
    if isinstance(annotation, ast.BinOp):
        return _annotated_classes(annotation.left, context) + _annotated_classes(annotation.right, context)
    if isinstance(annotation, (ast.Name, ast.Attribute)):
        qualified = context.qualify(annotation)
        if qualified and "." in qualified and not qualified.startswith(_TYPING):
            return [qualified]
    return []


#: Calls that never build a module (kept out of attribute facts to keep them small).
_NOT_MODULES = frozenset({"range", "len", "int", "float", "str", "bool", "dict", "set", "getattr", "isinstance",
                          "super", "print", "min", "max", "sum", "zip", "enumerate", "sorted", "type"})


def _constant(value: ast.AST, context: FunctionContext) -> tuple[bool, object]:
    """``(known, value)`` of a literal, or of a name assigned once to one (locally or in the module)."""
    if isinstance(value, ast.Constant):
        return True, value.value
    if isinstance(value, ast.Name) and value.id not in context.params:
        if value.id in context.constants:
            return True, context.constants[value.id]
        if not context.is_local(value.id) and value.id in context.module.constants:
            return True, context.module.constants[value.id]
    return False, None


def _is_dataclass(decorator: ast.AST, context: FunctionContext) -> bool:
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    return (context.qualify(target) or "").rsplit(".", 1)[-1] == "dataclass"


def _container(value: ast.AST, context: FunctionContext) -> str:
    """What a returned expression builds when it is neither a tensor nor a tuple of them:
    ``"dict"``, ``"list"``, ``"call:<qualified>"`` for a capitalised callable (a class), else ``""``."""
    if isinstance(value, (ast.Dict, ast.DictComp)):
        return "dict"
    if isinstance(value, (ast.List, ast.ListComp)):
        return "list"
    if isinstance(value, ast.Call):
        parts = dotted(value.func)
        if parts == ["dict"] and "dict" not in context.module.defined:
            return "dict"
        if parts and parts[-1][:1].isupper():
            qualified = context.qualify(value.func)
            return f"call:{qualified}" if qualified else ""
    return ""


def _call_site(node: ast.Call, entry: tuple[str, int, str], context: FunctionContext) -> CallSite:
    name, position, region_keyword = entry
    keywords = {k.arg: k for k in node.keywords}
    region = None
    if position >= 0 and len(node.args) > position and not any(isinstance(a, ast.Starred) for a in node.args[:position + 1]):
        region = node.args[position]
    for keyword in (region_keyword, *REGION_KEYWORDS) if region_keyword else REGION_KEYWORDS:
        if region is None and keyword in keywords:
            region = keywords[keyword].value
    reentrant_value = None
    if "use_reentrant" in keywords:
        reentrant = "given"
        known, value = _constant(keywords["use_reentrant"].value, context)
        reentrant_value = value if known and isinstance(value, bool) else None
    elif None in keywords:
        reentrant = "splat"
    else:
        reentrant = "missing"
    preserve = keywords.get("preserve_rng_state")
    preserve_false = None
    if preserve is not None:
        known, value = _constant(preserve.value, context)
        if known and value is False:
            preserve_false = context.span(preserve)
    targets = tuple(target_refs(region, context)) if region is not None else ()
    if ENTRY_POINTS.get(name) is not None and ENTRY_POINTS[name].policy:
        targets = tuple(_policy_refs(node, context))
    forwards = None
    params = [r for r in targets if r.kind == "param"]
    if params and len(params) == len(targets):
        owner, index = context.param_positions.get(params[0].name, (context.qualname, -1))
        forwards = (owner, index, params[0].name)
    passed = None
    if name in FORWARDING_ENTRIES and region is not None and node.args and node.args[0] is region \
            and not any(isinstance(a, ast.Starred) for a in node.args) and None not in keywords:
        passed = (len(node.args) - 1, tuple(k for k in keywords if k is not None and k not in CHECKPOINT_KEYWORDS))
    return CallSite(
        passed=passed,
        none_positions=tuple(i for i, a in enumerate(node.args[1:]) if isinstance(a, ast.Constant) and a.value is None)
        if passed is not None else (),
        span=context.span(node),
        entry=name,
        caller=context.qualname,
        targets=targets,
        use_reentrant=reentrant,
        reentrant=reentrant_value,
        preserve_rng_false=preserve_false,
        forwards=forwards,
        region_source=context.source(region) if region is not None else "",
    )


#: Entry points that call their region with exactly the call's other arguments
#: (``checkpoint(fn, *args, **kwargs)`` less the checkpoint's own keywords).
FORWARDING_ENTRIES = frozenset({"torch.utils.checkpoint.checkpoint", "self._gradient_checkpointing_func",
                                "_gradient_checkpointing_func", "timm.models._manipulate.checkpoint",
                                "timm.models.checkpoint", "timm.models.helpers.checkpoint"})
CHECKPOINT_KEYWORDS = frozenset({"use_reentrant", "preserve_rng_state", "context_fn", "determinism_check",
                                 "debug", "early_stop"})


def _policy_refs(node: ast.Call, context: FunctionContext) -> list[Ref]:
    """``apply_activation_checkpointing(model, check_fn=..., auto_wrap_policy=...)``: the
    classes the policy picks (``isinstance`` tests in ``check_fn``; the class sets of
    ``ModuleWrapPolicy``/``transformer_auto_wrap_policy``), whatever ``model`` is."""
    classes: list[str] = []
    for keyword in node.keywords:
        if keyword.arg == "check_fn":
            classes += _check_fn_classes(keyword.value, context)
        elif keyword.arg == "auto_wrap_policy":
            classes += _policy_classes(keyword.value, context)
    span = context.span(node)
    if not classes:
        return []
    return [Ref("policy", ",".join(dict.fromkeys(classes)), span)]


def _check_fn_classes(value: ast.AST, context: FunctionContext) -> list[str]:
    body: ast.AST | None = None
    if isinstance(value, ast.Lambda):
        body = value.body
    elif isinstance(value, ast.Name):
        held = context.refs_of(value.id, value.lineno) or []
        qualname = next((r.name for r in held if r.kind == "local"), None)
        if qualname is None and value.id in context.module.defined:
            qualname = value.id
        body = context.module.function_nodes.get(qualname) if qualname else None
    elif isinstance(value, ast.Call) and context.qualify(value.func) in PARTIALS and value.args:
        return _check_fn_classes(value.args[0], context)
    if body is None:
        return []
    found = []
    for node in ast.walk(body):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance" and len(node.args) == 2:
            kinds = node.args[1].elts if isinstance(node.args[1], (ast.Tuple, ast.List, ast.Set)) else [node.args[1]]
            found += [q for q in (context.qualify(k) for k in kinds) if q]
    return found


def _policy_classes(value: ast.AST, context: FunctionContext) -> list[str]:
    if isinstance(value, ast.Name) and value.id in context.values:  # policy = partial(...)
        value = context.values[value.id]
    found = []
    for node in ast.walk(value):
        if isinstance(node, (ast.Set, ast.List, ast.Tuple)):
            found += [q for q in (context.qualify(e) for e in node.elts) if q]
        elif isinstance(node, ast.keyword) and node.arg in ("transformer_layer_cls", "module_classes"):
            if isinstance(node.value, (ast.Name, ast.Attribute)):
                found += [q for q in [context.qualify(node.value)] if q]
    return found
