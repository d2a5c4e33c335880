"""Phase two: which functions are checkpointed, and the hazards inside them.

The one region finder.  A region is the function a checkpoint entry point runs (or the
``forward`` of a ``GradientCheckpointingLayer`` subclass) plus every function and
submodule ``forward`` it calls inside the linted tree.  Hazards recorded in phase one
become findings only here, named after the region and where it is checkpointed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator, NamedTuple

from recheck.lint.facts import CallSite, ClassFacts, FileFacts, FunctionFacts, Hazard, Ref
from recheck.lint.index import Index
from recheck.lint.reachability import SPLAT, binds, empty_params, passes_on, unreachable
from recheck.lint.rules import RULES
from recheck.lint.rules.base import RegionView, TreeView
from recheck.lint.targets import CHECKPOINTING_BASES, ENTRY_POINTS
from recheck.lint.wrappers import ASSUMED, Wrapper, find_wrapper, installed

__all__ = ["Hit", "Region", "SiteReport", "discovered_entries", "find_regions", "region_hits", "walk_regions"]

MAX_FUNCTIONS_PER_REGION = 400
#: the bases of a custom autograd Function, whose ``apply`` runs its ``forward``
FUNCTION_BASES = ("autograd.Function", "autograd.function.Function")


@dataclass(frozen=True)
class Region:
    """A checkpointed function: its root, its name and how it is checkpointed."""

    name: str
    origin: str  # "checkpointed at model.py:88" or "a GradientCheckpointingLayer, model.py:12"
    file: FileFacts
    function: FunctionFacts
    site: CallSite | None = None
    #: what the checkpointing passes the root when no call site says (see :func:`_layer_passes`)
    passed: tuple[int, tuple[str, ...]] | None = None




@dataclass(frozen=True)
class Hit:
    """A hazard that is reached from a region (or a call-site rule's finding)."""

    path: str
    hazard: Hazard
    region: str | None
    origin: str | None


class SiteReport(NamedTuple):
    """One checkpoint call site and what it resolved to (``--statistics``, ``--show-regions``).

    ``kind`` is ``"site"`` (it names a region), or ``"wrapper"``: the region is a parameter
    of the function that makes the call, which is itself an entry point for its callers.
    """

    path: str
    line: int
    column: int
    entry: str
    caller: str
    region_source: str
    kind: str
    regions: list[str]  # "Block.forward (model.py:12)"
    reason: str  # why no region was found ("" when one was), or what a wrapper passes on


def _short(name: str) -> str:
    return name.rsplit(".", 1)[-1]


MAX_FACTORY_DEPTH = 4


class _Resolver:
    def __init__(self, index: Index) -> None:
        self.index = index

    def functions(self, ref: Ref, file: FileFacts, func: FunctionFacts | None, as_target: bool) -> Iterator[tuple[FileFacts, FunctionFacts]]:
        """Functions a reference may run; class references run ``forward`` only as targets."""
        for item in self.resolve(ref, file, func, as_target):
            if isinstance(item[1], FunctionFacts):
                yield item  # type: ignore[misc]

    def resolve(self, ref: Ref, file: FileFacts, func: FunctionFacts | None, as_target: bool) -> Iterator[tuple]:
        """``(file, FunctionFacts)`` for code in the tree, ``(None, qualified_class)`` for outside modules."""
        index = self.index
        if ref.kind == "local":
            if ref.name in file.functions:
                yield file, file.functions[ref.name]
            return
        if ref.kind in ("instance", "policy"):
            for qualified in ref.name.split(","):
                yield from self._built(qualified, file, 0)
            return
        if ref.kind == "param":
            if func is not None and ref.name in func.annotations:
                annotation = func.annotations[ref.name]
                outside = self._installed(annotation, file) if as_target else None
                yield from self._module(annotation, *outside) if outside else self._built(annotation, file, 0)
            return
        if ref.kind == "param_path":
            head, _, rest = ref.name.partition(".")
            annotation = func.annotations.get(head, "") if func else ""
            annotated = self.index.lookup_class(annotation, file) if annotation else None
            if annotated is not None:
                yield from self._path(annotated[0], annotated[1], rest)
            elif as_target:  # the region is a parameter's attribute, its class not in the tree: the
                # installed class's, else by what holds it
                outside = self._installed(annotation, file) if annotation else None
                through = [item for item in self._path(*outside, rest) if item[0] is not None] if outside else []
                yield from through or (item for holder_file, holder in self.index.holders(rest.partition(".")[0])
                                       for item in self._path(holder_file, holder, rest))
            return
        if ref.kind == "result":
            owner = file.classes.get(func.self_class) if func is not None and func.self_class else None
            method = index.find_method(file, owner, ref.name) if owner is not None else None
            if method is not None and method[1] is not func:
                for returned in method[1].returns_refs:
                    yield from self.resolve(returned, method[0], method[1], as_target)
            return
        if ref.kind in ("name", "returned"):
            found = index.lookup(ref.name, file) if ref.member != "local" else (
                (file, file.functions[ref.name]) if ref.name in file.functions else None)
            if found is None:
                return
            found_file, symbol = found
            if isinstance(symbol, ClassFacts) and ref.member == "apply":
                if any(b.endswith(FUNCTION_BASES) for b in index.base_names(found_file, symbol)):
                    forward = index.find_method(found_file, symbol, "forward")
                    if forward is not None:
                        yield forward
            elif isinstance(symbol, ClassFacts):
                if as_target or ref.kind == "returned":
                    yield from self._module(ref.name, found_file, symbol)
            elif ref.kind == "returned":
                yield from ((found_file, found_file.functions[q]) for q in symbol.returns_local if q in found_file.functions)
                for built in symbol.returns_built:  # a factory: get_block(...) returns a module
                    yield from self._built(built, found_file, 1)
            else:
                yield found_file, symbol
            return
        owner = file.classes.get(func.self_class) if func is not None and func.self_class else None
        if owner is None:
            return
        if ref.kind == "super":
            found = index.find_method(file, owner, ref.name, skip_self=True)
            if found:
                yield found
            return
        if ref.kind == "self":
            method = index.find_method(file, owner, ref.name)
            if method:
                yield method
                return
            held = [(f, q) for f, k in index.lineage(file, owner) for q in k.function_attributes.get(ref.name, ())]
            if held:
                yield from ((f, f.functions[q]) for f, q in held if q in f.functions)
                return
        if ref.kind == "children":  # for child in self.children(): every submodule attribute
            for _, klass in index.lineage(file, owner):
                for attribute in klass.attributes.values():
                    for qualified in attribute:
                        yield from self._built(qualified, file, 0)
            return
        if ref.kind == "member":  # caches written before "path" existed
            ref = Ref("path", f"{ref.name}.{ref.member}", ref.span)
        if ref.kind == "path":
            yield from self._path(file, owner, ref.name)
            return
        classes = index.attribute_classes(file, owner, ref.name)
        for qualified in classes:
            yield from self._built(qualified, file, 0)
        if not classes and as_target and ref.kind in ("self", "elements"):
            # a container the class never fills itself (``self.blocks = other.blocks`` in a
            # classmethod): the classes of the tree that fill one under that name
            for holder_file, holder in index.holders(ref.name):
                if holder is not owner:
                    for qualified in index.attribute_classes(holder_file, holder, ref.name):
                        yield from self._built(qualified, holder_file, 0)

    def _installed(self, annotation: str, file: FileFacts) -> tuple[FileFacts, ClassFacts] | None:
        """The class an annotation names outside the tree, read from the installed package."""
        return self.index.installed_class(annotation) if self.index.lookup(annotation, file) is None else None

    def _path(self, file: FileFacts, owner: ClassFacts, path: str) -> Iterator[tuple]:
        """``self.a.b``: the modules recorded under ``a.b``, or ``b`` of each module in ``a``
        (a method ``b`` of ``a``'s class when there is one)."""
        direct = self.index.attribute_classes(file, owner, path)
        if direct:
            for qualified in direct:
                yield from self._built(qualified, file, 0)
            return
        head, _, rest = path.partition(".")
        for qualified in self.index.attribute_classes(file, owner, head):
            found = self.index.lookup_class(qualified, file)
            if found is None:
                continue
            if "." not in rest:
                method = self.index.find_method(found[0], found[1], rest)
                if method is not None:
                    yield method
                    continue
            yield from self._path(found[0], found[1], rest)

    def _built(self, qualified: str, origin: FileFacts, depth: int) -> Iterator[tuple]:
        """What calling an instance of ``qualified`` runs: a class's ``forward`` (plus its
        outside bases), a factory function's products, or the name itself when outside."""
        found = self.index.lookup(qualified, origin)
        if found is None:
            if not qualified.endswith(".__call__"):  # what an instance's call returns: no module when unseen
                yield None, qualified
        elif isinstance(found[1], ClassFacts):
            yield from self._module(qualified, found[0], found[1])
        elif depth < MAX_FACTORY_DEPTH:
            for built in found[1].returns_built:
                yield from self._built(built, found[0], depth + 1)

    def _module(self, qualified: str, file: FileFacts, cls: ClassFacts) -> Iterator[tuple]:
        """A submodule class of the tree: its ``forward`` (a callable object's ``__call__``), plus
        its external bases' names."""
        forward = self.index.find_method(file, cls, "forward") or self.index.find_method(file, cls, "__call__")
        if forward:
            yield forward
        for base in self.index.base_names(file, cls):
            if self.index.lookup_class(base) is None:
                yield None, base

    def why_not(self, site: CallSite, file: FileFacts, caller: FunctionFacts | None) -> str:
        """Why a call site resolved to no region, in words."""
        shown = f"`{site.region_source}`" if site.region_source else "the region argument"
        entry = ENTRY_POINTS.get(site.entry)
        if not site.targets and entry is not None and entry.policy:
            return (f"`{site.entry.rsplit('.', 1)[-1]}` picks the modules of {shown} by a `check_fn` or "
                    "`auto_wrap_policy` whose classes are not written where it is called (computed at run time)")
        if not site.targets:
            if site.region_source:
                return f"{shown} is not a function, method, module or container the linter can follow"
            return "the call passes no region argument the linter can see (a `*args` splat?)"
        reasons = []
        for ref in site.targets:
            items = list(self.resolve(ref, file, caller, as_target=True))
            outside = sorted({q for f, q in items if f is None})
            factory = self._opaque_factory(ref, file, caller)
            if factory:
                reasons.append(f"{shown} is built by `{factory}(...)`, whose product the linter cannot see "
                               "(chosen at run time)")
            elif ref.kind == "children":  # self.items() of a ModuleDict filled by update() at run time
                reasons.append(f"{shown} is a child module of `{caller.self_class if caller else 'its class'}`, "
                               "and no module of the linted tree is assigned to it (its children are added at "
                               "run time)")
            elif outside and self.index.lookup_class(outside[0].rpartition(".")[0], file) is not None:
                holder, _, field = outside[0].rpartition(".")
                reasons.append(f"{shown} is built from `{_short(holder)}.{field}`, a field of `{holder}` set at run "
                               "time (the module class is chosen by configuration)")
            elif outside:
                reasons.append(f"{shown} is a `{outside[0]}`, defined outside the linted tree")
            elif ref.kind in ("name", "returned") and self.index.lookup(ref.name, file) is None:
                reasons.append(f"`{ref.name}` is defined outside the linted tree")
            elif ref.kind in ("self", "path", "elements"):
                reasons.append(f"`self.{ref.name}` is never assigned a module the linter can see in "
                               f"`{caller.self_class if caller and caller.self_class else 'its class'}`")
            elif ref.kind == "param":
                reasons.append(f"{shown} is parameter `{ref.name}` and no caller in the tree passes it")
            elif ref.kind == "param_path":
                head = ref.name.partition(".")[0]
                annotation = caller.annotations.get(head) if caller else None
                reasons.append(f"{shown} comes from `{ref.name}`, parameter `{head}` of `{site.caller}`"
                               + (f" ({self._annotated(annotation, ref.name)})" if annotation else
                                  ", which has no annotation"))
            elif ref.kind == "result":
                reasons.append(f"{shown} is what `self.{ref.name}()` returns, which the linter cannot see")
            elif ref.kind == "policy":
                reasons.append("the policy's classes are not defined in the linted tree")
            else:
                reasons.append(f"{shown} resolves to nothing in the linted tree")
        return reasons[0] if reasons else f"{shown} resolves to nothing in the linted tree"


    def _annotated(self, annotation: str, path: str) -> str:
        """Why a parameter's annotation led to no region, in words."""
        package = annotation.split(".", 1)[0]
        if package in self.index.roots:
            return f"annotated `{annotation}`, not a class of the linted tree"
        outside = self.index.installed_class(annotation)
        if outside is not None:
            attribute = path.split(".")[1] if path.count(".") else path
            return f"annotated `{annotation}`, which as the installed `{package}` defines it assigns no module to `{attribute}`"
        if installed(package):
            return f"annotated `{annotation}`, which neither the linted tree nor the installed `{package}` defines"
        return f"annotated `{annotation}`: not a class of the linted tree, and `{package}` is not installed where recheck runs"

    def _opaque_factory(self, ref: Ref, file: FileFacts, caller: FunctionFacts | None) -> str | None:
        """A function of the tree that builds ``self.<attr>`` but returns nothing visible."""
        owner = file.classes.get(caller.self_class) if caller is not None and caller.self_class else None
        if owner is None or ref.kind not in ("self", "path", "elements"):
            return None
        for qualified in self.index.attribute_classes(file, owner, ref.name.partition(".")[0]):
            found = self.index.lookup(qualified, file)
            if found is not None and isinstance(found[1], FunctionFacts) and not list(self._built(qualified, file, 0)):
                return qualified.rsplit(".", 1)[-1]
        return None


def _source_order(cls: ClassFacts) -> tuple[int, int]:
    return cls.span.line, cls.span.column


def _where(file: FileFacts, function: FunctionFacts) -> str:
    return f"{function.qualname} ({file.path}:{function.span.line})"


def find_regions(index: Index, reports: list[SiteReport] | None = None,
                 source_text: Callable[[str], str | None] | None = None,
                 assumed: list[str] | None = None, read: dict[str, list[str]] | None = None) -> list[Region]:
    """Every region of the tree, in a stable order (by file, then line).

    With ``reports``, also append one :class:`SiteReport` per checkpoint call site.
    ``source_text(path)``: a linted file's text, to read a checkpointing base class defined
    in the tree (:mod:`recheck.lint.wrappers`); ``assumed`` collects, for each such class
    whose source was found nowhere, what was assumed of it instead; ``read``, the stamps of
    the installed files read for them (:func:`recheck.lint.wrappers.unchanged`).
    """
    wrappers: dict[str, Wrapper | None] = {}
    resolver = _Resolver(index)
    regions: list[Region] = []
    seen: set[tuple[str, str]] = set()
    for file in index.files:
        for site in file.call_sites:
            caller = file.functions.get(site.caller)
            found: dict[tuple[str, str], tuple[FileFacts, FunctionFacts]] = {}
            for ref in site.targets:
                for target_file, function in resolver.functions(ref, file, caller, as_target=True):
                    found.setdefault((target_file.path, function.qualname), (target_file, function))
            for target_file, function in found.values():
                regions.append(Region(function.qualname, f"checkpointed at {file.path}:{site.span.line}",
                                      target_file, function, site))
            if reports is not None:
                forwarded = site.forwards or (constructor_forward(file, site) if not found else None)
                kind = "wrapper" if forwarded is not None else "site"
                if forwarded is not None:
                    reason = f"`{forwarded[0]}` passes its parameter `{forwarded[2]}` on: its callers name the region"
                else:
                    reason = "" if found else resolver.why_not(site, file, caller)
                reports.append(SiteReport(file.path, site.span.line, site.span.column, site.entry, site.caller,
                                          site.region_source, kind, [_where(*f) for f in found.values()], reason))
        for cls in sorted(file.classes.values(), key=_source_order):  # outlined bodies fill in later
            if _short(cls.qualname) in CHECKPOINTING_BASES:
                continue
            bases = index.base_names(file, cls)
            if not any(_short(b) in CHECKPOINTING_BASES for b in bases):
                continue
            method = index.find_method(file, cls, "forward")
            if method is None or _short(method[1].qualname.rsplit(".", 1)[0]) in CHECKPOINTING_BASES:
                continue
            key = (method[0].path, method[1].qualname)
            if key not in seen:
                seen.add(key)
                wrapper = _wrapper(index, file, cls, wrappers, source_text, assumed, read)
                regions.append(Region(method[1].qualname, f"a GradientCheckpointingLayer, {file.path}:{cls.span.line}",
                                      method[0], method[1], passed=_layer_passes(index, file, cls, method[1], wrapper)))
    return regions


def _wrapper(index: Index, file: FileFacts, cls: ClassFacts, found: dict[str, Wrapper | None],
             source_text: Callable[[str], str | None] | None, assumed: list[str] | None,
             read: dict[str, list[str]] | None) -> Wrapper | None:
    """What the checkpointing base of ``cls`` does to its arguments, read from its source
    (the tree's, else the installed package's), or the built-in assumption (said in ``assumed``)."""
    base = next((b for b in sorted(index.base_names(file, cls)) if _short(b) in CHECKPOINTING_BASES), None)
    if base is None:
        return None
    if base not in found:
        in_tree = index.lookup_class(base, file)
        text = source_text(in_tree[0].path) if in_tree is not None and source_text is not None else None
        wrapper = find_wrapper(base, (in_tree[0].path, in_tree[0].module, in_tree[1].qualname, text)
                               if in_tree is not None and text is not None else None, read)
        if wrapper is None:
            wrapper = ASSUMED.get(_short(base))
            if wrapper is not None and assumed is not None:
                cleared = ", ".join(f"`{name}`" for name, _ in wrapper.cleared)
                assumed.append(f"wrapper `{base}` not found in the tree or installed; assumed it checkpoints "
                               f"`{wrapper.checkpoints}` with {cleared} set to None or False")
        found[base] = wrapper  # None too: a base found nowhere is searched for once
    return found[base]


def _layer_passes(index: Index, file: FileFacts, cls: ClassFacts, forward: FunctionFacts,
                  wrapper: Wrapper | None) -> tuple[int, tuple[str, ...]] | None:
    """What a checkpointing layer hands its checkpointed forward: every argument the caller
    gave (unknown: all of them), but the keywords its wrapper clears set to ``None`` (unless
    the class, or the nearest base that says, sets the flag that keeps them).  Layers are
    called with their cache as a keyword (``layer(hidden, cache=cache)``), which is what
    the wrapper clears."""
    if wrapper is None:
        return None
    flags: dict[str, bool] = {}
    for _, klass in index.lineage(file, cls):
        for name, value in klass.flags.items():
            flags.setdefault(name, value)
    cleared = wrapper.cleared_for(flags)
    if not (len(forward.star) == 2 and forward.star[1]):  # without **kwargs, only its own parameters
        cleared &= set(forward.optional)
    if not cleared:
        return None
    return 0, (SPLAT, *(f"-{name}" for name in sorted(cleared)))  # every other argument may be given


def constructor_forward(file: FileFacts, site: CallSite) -> tuple[str, int, str] | None:
    """``checkpoint(self._wrapped, *args)`` in a class whose ``__init__`` did ``self._wrapped
    = module``: the class is a wrapper, and ``Wrapper(block)`` names the region (class
    qualname, position of that parameter, its name)."""
    caller = file.functions.get(site.caller)
    owner = file.classes.get(caller.self_class) if caller is not None and caller.self_class else None
    if owner is None or not site.targets or site.forwards is not None:
        return None
    if all(ref.kind == "self" and ref.name in owner.param_attributes for ref in site.targets):
        parameter, position = owner.param_attributes[site.targets[0].name]
        return owner.qualname, position, parameter
    return None


def discovered_entries(index: Index) -> dict[str, tuple[int, str]]:
    """Entry points the tree defines, with the position and name of their region parameter:
    functions and methods that pass a parameter to an entry point as its region (``def
    maybe_checkpoint(fn, *a): return checkpoint(fn, *a)``; methods as ``module.Class.m``,
    nested functions as ``module.outer.inner``), and ``self.<attr>`` for attributes that
    hold an entry point (``self.ckpt = partial(checkpoint, ...)``)."""
    found: dict[str, tuple[int, str]] = {}
    for file in index.files:
        for site in file.call_sites:
            forwarded = site.forwards or constructor_forward(file, site)
            if forwarded is not None:
                owner, position, parameter = forwarded
                found[f"{file.module}.{owner}"] = (position, parameter)
        for attribute in file.entry_attributes:
            found[f"self.{attribute.rsplit('.', 1)[-1]}"] = (0, "")
    return found


Key = tuple[str, str]
Passes = dict[Key, list]
Edge = tuple[Key, object, Key]  # caller, its call record (or None), callee


#: references a call makes bound (to a module or a method of ``self``): their arguments bind
#: to the callee's parameters after ``self``
_BOUND = frozenset({"self", "elements", "member", "super", "path", "instance"})


def _walk(resolver: _Resolver, region: Region, edges: list[Edge]) -> Iterator[tuple[FileFacts, FunctionFacts, list[tuple[Ref, str]]]]:
    """Each function reached from the region, with the outside module classes it calls.

    ``edges`` collects the region's calls between functions of the tree, with the call
    record of each (see :func:`_passes`)."""
    stack = [(region.file, region.function)]
    visited: set[Key] = set()
    while stack and len(visited) < MAX_FUNCTIONS_PER_REGION:
        file, function = stack.pop()
        key = (file.path, function.qualname)
        if key in visited or (function.memoized and visited):
            continue
        visited.add(key)
        calls = iter(function.call_passes)
        call = next(calls, None)
        external: list[tuple[Ref, str]] = []
        for position, ref in enumerate(function.calls):
            while call is not None and position >= call[0] + call[1]:
                call = next(calls, None)
            record = call if call is not None and call[0] <= position else None
            for found_file, found in resolver.resolve(ref, file, function, as_target=False):
                if found_file is None:
                    external.append((ref, found))
                elif record is not None and ref.kind in _BOUND and not binds(found, record):
                    continue  # `self.self(x, a, b, c, d, e)` cannot run this attention's forward
                else:
                    edges.append((key, record, (found_file.path, found.qualname)))
                    stack.append((found_file, found))
        yield file, function, external


def _passes(region: Region, reached: dict[Key, FunctionFacts], edges: list[Edge]) -> Passes:
    """What every call in the region passes to each function it reaches: the checkpoint
    call's arguments into the root, then, round by round, what each function passes on of
    the optional parameters none of its calls gave it (bounded: a few rounds settle it)."""
    root = (region.file.path, region.function.qualname)
    passes: Passes = {}
    # each round asks mostly what the last one did (the last round all of it): answered once
    emptied: dict[tuple, set[str]] = {}
    passed_on: dict[tuple, tuple[int, tuple[str, ...]] | None] = {}
    for _ in range(4):
        empty: dict[Key, set[str] | None] = {}
        for key, function in reached.items():
            incoming = [_root_passed(region)] if key == root else passes.get(key, [])
            if not incoming or any(p is None for p in incoming):
                empty[key] = None
            else:
                sets = [emptied[key, p] if (key, p) in emptied else emptied.setdefault((key, p), empty_params(function, p))
                        for p in incoming]
                empty[key] = set.intersection(*sets)
        updated: Passes = {root: [_root_passed(region)]}
        for caller, record, callee in edges:
            if caller not in reached or record is None:
                updated.setdefault(callee, []).append(None)
                continue
            given = updated.get(caller) if caller == root else passes.get(caller, [])
            if caller != root and not given and passes:
                continue  # the caller is itself only called from branches that cannot run
            if unreachable(reached[caller], given or [], record[5]):  # type: ignore[index]
                continue  # a call in a branch none of the caller's calls takes
            none_given = empty.get(caller)
            asked = (caller, record, callee, None if none_given is None else frozenset(none_given))
            if asked not in passed_on:
                passed_on[asked] = passes_on(reached[caller], record, none_given, reached.get(callee))  # type: ignore[arg-type]
            updated.setdefault(callee, []).append(passed_on[asked])
        if updated == passes:
            break
        passes = updated
    return passes


def _root_passed(region: Region) -> tuple[int, tuple[str, ...]] | None:
    """What the checkpointing passes the root; a ``None`` argument of the call passes nothing
    to the parameter it binds to (when the region is bound or a plain function, so that
    arguments bind to its parameters in order)."""
    site = region.site
    if site is None or site.passed is None:
        return site.passed if site is not None else region.passed
    if site.none_positions and (region.function.self_class is None or all(r.kind in _BOUND for r in site.targets)):
        params = region.function.params
        return site.passed[0], (*site.passed[1], *(f"-{params[i]}" for i in site.none_positions if i < len(params)))
    return site.passed


#: the rules, by the phase-two hooks they implement
_OUTSIDE = [rule for rule in RULES if rule.overrides("outside_call")]
_REGION = [rule for rule in RULES if rule.overrides("region")]
_SETTLE = [rule for rule in RULES if rule.overrides("settle")]
_SITE = [rule for rule in RULES if rule.overrides("site")]
_TREE = [rule for rule in RULES if rule.overrides("tree")]
_BRANCH_SENSITIVE = frozenset(rule.CODE for rule in RULES if rule.BRANCH_SENSITIVE)


def runs_reentrant(site: CallSite) -> bool | None:
    """Whether the call runs a reentrant implementation: the constant it passes as
    ``use_reentrant``, else its entry point's default; None when that cannot be told
    (a value computed at run time, a ``**`` splat, an entry point the linter discovered)."""
    if site.use_reentrant == "given":
        return site.reentrant
    entry = ENTRY_POINTS.get(site.entry)
    if site.use_reentrant == "missing" and entry is not None:
        return entry.reentrant_default
    return None


class _TreeView(TreeView):
    """Every region, as the rules' tree hooks see them."""

    def __init__(self, index: Index, resolver: _Resolver, regions: list[Region], inside: dict[Key, Region]) -> None:
        self.index, self.resolver, self.regions, self.inside = index, resolver, regions, inside
        self._checkpointing: dict[Key, Region] | None = None

    def hooked(self, code: str) -> Iterator[tuple[FileFacts, FunctionFacts, Hazard, list[Ref]]]:
        for file in self.index.files:
            for qualname, draft, refs in file.hooked:
                function = file.functions.get(qualname) if draft.code == code else None
                if function is not None:
                    yield file, function, draft, refs

    def targets(self, ref: Ref, file: FileFacts, function: FunctionFacts) -> Iterator[tuple[FileFacts, FunctionFacts]]:
        return self.resolver.functions(ref, file, function, as_target=True)

    def running(self, file: FileFacts, function: FunctionFacts) -> Region | None:
        return self.inside.get((file.path, function.qualname))

    def reaching(self, file: FileFacts, function: FunctionFacts) -> Region | None:
        if self._checkpointing is None:  # the functions that make a checkpoint call, with a region of it
            site_files = {id(site): f.path for f in self.index.files for site in f.call_sites}
            self._checkpointing = {}
            for region in self.regions:
                if region.site is not None and id(region.site) in site_files:
                    self._checkpointing.setdefault((site_files[id(region.site)], region.site.caller), region)
        for reached_file, reached, _ in _walk(self.resolver, Region(function.qualname, "", file, function), []):
            key = (reached_file.path, reached.qualname)
            running = self.inside.get(key) or self._checkpointing.get(key)
            if running is not None:
                return running
        return None


def walk_regions(index: Index, regions: list[Region]) -> None:
    """Walk every region's calls as :func:`region_hits` does, for its lookups alone: the names
    they miss tell the engine which files to parse next.  The rules run once the walks miss
    nothing more the tree could answer (they may look up more: the engine asks again after)."""
    resolver = _Resolver(index)
    for region in regions:
        for _ in _walk(resolver, region, []):
            pass


def region_hits(index: Index, regions: list[Region], walked: set[tuple[str, str]] | None = None) -> list[Hit]:
    """The findings of every region and every checkpoint call site, deduplicated by place:
    each rule's hooks called on what the region reaches (see :mod:`recheck.lint.rules.base`).

    ``walked`` collects ``(path, qualname)`` of every function a region reached."""
    resolver = _Resolver(index)
    hits: list[Hit] = []
    views: dict[int, RegionView] = {}
    inside: dict[Key, Region] = {}  # every function a region runs, with the first such region
    for region in regions:
        found: list[tuple[str, Hazard]] = []
        edges: list[Edge] = []
        reached = list(_walk(resolver, region, edges))
        passes = _passes(region, {(f.path, fn.qualname): fn for f, fn, _ in reached}, edges)
        root = (region.file.path, region.function.qualname)
        reached = [r for r in reached if (r[0].path, r[1].qualname) in passes or (r[0].path, r[1].qualname) == root]
        for file, function, external in reached:
            inside.setdefault((file.path, function.qualname), region)
            if walked is not None:
                walked.add((file.path, function.qualname))
            for hazard in function.hazards:
                if hazard.code in _BRANCH_SENSITIVE and unreachable(
                        function, passes.get((file.path, function.qualname), []), hazard.span.line):
                    continue  # in a branch none of this region's calls takes
                if hazard.tag != "root" or function is region.function:
                    found.append((file.path, hazard))
            for ref, qualified in external:
                for rule in _OUTSIDE:
                    found += ((file.path, hazard) for hazard in rule.outside_call(qualified, ref))
        view = RegionView(index, region, [(file, function) for file, function, _ in reached],
                           runs_reentrant(region.site) if region.site is not None else None, found)
        views[id(region)] = view
        for rule in _REGION:
            found = found + list(rule.region(view))
        view.hits = found
        for rule in _SETTLE:
            found = rule.settle(found, view)
        hits.extend(Hit(path, hazard, region.name, region.origin) for path, hazard in found)
    tree = _TreeView(index, resolver, regions, inside)
    hits += (Hit(path, hazard, name, None) for rule in _TREE for path, hazard, name in rule.tree(tree))
    by_site: dict[int, list[RegionView]] = {}
    for region in regions:
        if region.site is not None:
            by_site.setdefault(id(region.site), []).append(views[id(region)])
    for file in index.files:
        for hazard in file.file_hazards:
            hits.append(Hit(file.path, hazard, None, None))
        for site in file.call_sites:
            targets = by_site.get(id(site), [])
            for rule in _SITE:
                hits += (Hit(file.path, hazard, name, None) for name, hazard in rule.site(site, targets))
    unique: dict[tuple, Hit] = {}
    for hit in hits:
        span = hit.hazard.span
        unique.setdefault((hit.path, span.line, span.column, hit.hazard.code), hit)
    return list(unique.values())
