"""Phase two: which functions are checkpointed, and the hazards inside them.

The one region finder.  A region is the function a checkpoint entry point runs (or the
``forward`` of a ``GradientCheckpointingLayer`` subclass) plus every function and
submodule ``forward`` it calls inside the linted tree.  Hazards recorded in phase one
become findings only here, named after the region and where it is checkpointed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

from recheck.lint.facts import CallSite, ClassFacts, FileFacts, FunctionFacts, Hazard, Ref, Span
from recheck.lint.index import Index
from recheck.lint.rules import rc001_use_reentrant, rc002_preserve_rng, rc106_batchnorm
from recheck.lint.targets import CHECKPOINTING_BASES

__all__ = ["Hit", "Region", "find_regions", "region_hits"]

MAX_FUNCTIONS_PER_REGION = 400


@dataclass(frozen=True)
class Region:
    """A checkpointed function: its root, its name and how it is checkpointed."""

    name: str
    origin: str  # "checkpointed at model.py:88" or "a GradientCheckpointingLayer, model.py:12"
    file: FileFacts
    function: FunctionFacts
    site: CallSite | None = None


@dataclass(frozen=True)
class Hit:
    """A hazard that is reached from a region (or a call-site rule's finding)."""

    path: str
    hazard: Hazard
    region: str | None
    origin: str | None


def _short(name: str) -> str:
    return name.rsplit(".", 1)[-1]


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
        if ref.kind in ("name", "returned"):
            found = index.lookup(ref.name, file) if ref.member != "local" else (
                (file, file.functions[ref.name]) if ref.name in file.functions else None)
            if found is None:
                return
            found_file, symbol = found
            if isinstance(symbol, ClassFacts):
                if as_target or ref.kind == "returned":
                    yield from self._module(ref.name, found_file, symbol)
            elif ref.kind == "returned":
                yield from ((found_file, found_file.functions[q]) for q in symbol.returns_local if q in found_file.functions)
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
        for qualified in index.attribute_classes(file, owner, ref.name):
            found = index.lookup_class(qualified, file)
            if found is None:
                yield None, qualified
            elif ref.kind == "member":
                method = index.find_method(found[0], found[1], ref.member)
                if method:
                    yield method
            else:
                yield from self._module(qualified, *found)

    def _module(self, qualified: str, file: FileFacts, cls: ClassFacts) -> Iterator[tuple]:
        """A submodule class of the tree: its ``forward``, plus its external bases' names."""
        forward = self.index.find_method(file, cls, "forward")
        if forward:
            yield forward
        for base in self.index.base_names(file, cls):
            if self.index.lookup_class(base) is None:
                yield None, base


def find_regions(index: Index) -> list[Region]:
    """Every region of the tree, in a stable order (by file, then line)."""
    resolver = _Resolver(index)
    regions: list[Region] = []
    seen: set[tuple[str, str]] = set()
    for file in index.files:
        for site in file.call_sites:
            caller = file.functions.get(site.caller)
            for ref in site.targets:
                for target_file, function in resolver.functions(ref, file, caller, as_target=True):
                    regions.append(Region(function.qualname, f"checkpointed at {file.path}:{site.span.line}",
                                          target_file, function, site))
        for cls in file.classes.values():
            if _short(cls.qualname) in CHECKPOINTING_BASES:
                continue
            bases = index.base_names(file, cls)
            if not any(_short(b) in CHECKPOINTING_BASES for b in bases):
                continue
            found = index.find_method(file, cls, "forward")
            if found is None or _short(found[1].qualname.rsplit(".", 1)[0]) in CHECKPOINTING_BASES:
                continue
            key = (found[0].path, found[1].qualname)
            if key not in seen:
                seen.add(key)
                regions.append(Region(found[1].qualname, f"a GradientCheckpointingLayer, {file.path}:{cls.span.line}",
                                      found[0], found[1]))
    return regions


def _walk(resolver: _Resolver, region: Region) -> Iterator[tuple[FileFacts, FunctionFacts, list[tuple[Ref, str]]]]:
    """Each function reached from the region, with the outside module classes it calls."""
    stack = [(region.file, region.function)]
    visited: set[tuple[str, str]] = set()
    while stack and len(visited) < MAX_FUNCTIONS_PER_REGION:
        file, function = stack.pop()
        key = (file.path, function.qualname)
        if key in visited or (function.memoized and visited):
            continue
        visited.add(key)
        external: list[tuple[Ref, str]] = []
        for ref in function.calls:
            for found_file, found in resolver.resolve(ref, file, function, as_target=False):
                if found_file is None:
                    external.append((ref, found))
                else:
                    stack.append((found_file, found))
        yield file, function, external


def region_hits(index: Index, regions: list[Region]) -> list[Hit]:
    """The findings of every region and every checkpoint call site, deduplicated by place."""
    resolver = _Resolver(index)
    hits: list[Hit] = []
    draws: dict[int, tuple[str, Span, str]] = {}
    for region in regions:
        found: list[Hit] = []
        for file, function, external in _walk(resolver, region):
            for hazard in function.hazards:
                if hazard.tag != "root" or function is region.function:
                    found.append(Hit(file.path, hazard, region.name, region.origin))
            for span, what in function.random_draws:
                draws.setdefault(id(region), (file.path, span, what))
            for ref, qualified in external:
                name = _short(qualified)
                if name in rc106_batchnorm.MODULE_CLASSES:
                    found.append(Hit(file.path, rc106_batchnorm.module_call(qualified, ref.name, ref.span), region.name, region.origin))
                if name in rc002_preserve_rng.RANDOM_MODULES:
                    draws.setdefault(id(region), (file.path, ref.span, f"self.{ref.name}"))
        seeded = {h.hazard.tag[5:] for h in found if h.hazard.tag.startswith("seed:")}
        hits.extend(h for h in found if not (h.hazard.tag.startswith("draw:") and h.hazard.tag[5:] in seeded))
    by_site: dict[int, list[Region]] = {}
    for region in regions:
        if region.site is not None:
            by_site.setdefault(id(region.site), []).append(region)
    for file in index.files:
        for site in file.call_sites:
            targets = by_site.get(id(site), [])
            name = targets[0].name if targets else None
            hazard = rc001_use_reentrant.check_site(site)
            if hazard:
                hits.append(Hit(file.path, hazard, name, None))
            for region in targets:
                hazard = rc002_preserve_rng.check_site(site, region.name, draws.get(id(region)))
                if hazard:
                    hits.append(Hit(file.path, hazard, region.name, None))
                    break
    unique: dict[tuple, Hit] = {}
    for hit in hits:
        span = hit.hazard.span
        unique.setdefault((hit.path, span.line, span.column, hit.hazard.code), hit)
    return list(unique.values())
