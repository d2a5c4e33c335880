"""What a plan can checkpoint, found by running the step once: its regions and its repeated units.

One untraced run with every checkpoint bypassed records every module call of the forward
and the checkpoint region it runs in.  From it:

* a **unit** is a module of a ``ModuleList`` or ``Sequential`` that a checkpointed loop goes
  over: a container at least two of whose modules are the first module a checkpoint region
  calls (``checkpoint(block, h)`` in a loop, transformers' layers, a region that loops over the
  layers itself, ``checkpoint_sequential``'s segments).  Every module of such a container the
  forward calls is a unit, checkpointed as written or not (a step that checkpoints every other
  layer still has all its layers as units).  A module behind a one-child wrapper
  (``CheckpointWrapper``) is the unit, not the wrapper.  Variants: none, full, selective.
* a **region** is one of the step's own checkpoint calls (its qualified name and call site)
  that is not a unit's: a function such as ``torch.tanh``, a closure.  One that runs units
  (a segment over several layers) is an *outer* region: keeping it as written puts its units
  *inside* it.  Variants: none (the call dropped) and full (kept as written).

Units are found by what runs, not by name; a unit called more than once in a step (a shared
layer) cannot be planned apart from its other calls and is left out, with a note.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from recheck.cost.router import Router, routing
from recheck.intercept.hooks import CheckpointCall, Phase, Run
from recheck.runtime.naming import RegionKey, unwrap
from recheck.runtime.steps import StepState

__all__ = ["Candidate", "Candidates", "NoRepeatedUnit", "find_candidates", "region_label"]

_CONTAINERS = (torch.nn.ModuleList, torch.nn.Sequential)


def region_label(key: RegionKey) -> str:
    """How a plan names one of the step's own checkpoint calls: its callable and call site,
    ``_VariableFunctionsClass.tanh at model.py:104`` (where the callable is defined is left out:
    a closure of torch's ``checkpoint_sequential`` is defined in torch)."""
    return f"{key.qualname} at {key.callsite}" if key.callsite else str(key)


class NoRepeatedUnit(ValueError):
    """The step runs no repeated unit under checkpointing: there is nothing to plan."""


@dataclass
class Candidate:
    """One thing a plan decides about: a unit (a module) or one of the step's own regions."""

    index: int
    name: str
    kind: str  # "unit", "region" (inner) or "outer"
    module: torch.nn.Module | None = None
    key: RegionKey | None = None
    container: str | None = None
    written: bool = False
    outer: Candidate | None = None
    inner: list[Candidate] = field(default_factory=list)

    @property
    def variants(self) -> tuple[str, ...]:
        """The choices a plan has for it."""
        if self.kind == "unit":
            return ("none", "full", "selective", "inside") if self.outer is not None else ("none", "full", "selective")
        return ("none", "full")

    def __repr__(self) -> str:
        return f"<candidate {self.index} {self.kind} {self.name}>"


@dataclass
class Candidates:
    """Every candidate in forward order, with what they were found in."""

    items: list[Candidate]
    root: torch.nn.Module
    root_name: str
    notes: list[str] = field(default_factory=list)

    @property
    def units(self) -> list[Candidate]:
        return [c for c in self.items if c.kind == "unit"]

    @property
    def regions(self) -> list[Candidate]:
        return [c for c in self.items if c.kind != "unit"]

    def by_module(self) -> dict[int, Candidate]:
        return {id(c.module): c for c in self.units}

    def unit_modules(self) -> dict[int, torch.nn.Module]:
        """``{candidate index: module}`` of every unit."""
        return {c.index: c.module for c in self.units if c.module is not None}

    def by_key(self) -> dict[RegionKey, Candidate]:
        return {c.key: c for c in self.regions if c.key is not None}

    #: region keys of the step's own calls that checkpoint a unit (a plan replaces them)
    unit_keys: frozenset[RegionKey] = frozenset()


@dataclass
class _Region:
    key: RegionKey
    #: per invocation: the object its function is bound to, the modules it calls first, and the
    #: module whose forward was running when it began
    invocations: list[tuple[Any, list[torch.nn.Module], Any]] = field(default_factory=list)
    modules_inside: set[int] = field(default_factory=set)
    order: int = 0

    @staticmethod
    def wrapped(invocation: tuple[Any, list[torch.nn.Module], Any]) -> torch.nn.Module | None:
        """The module whose forward the invocation checkpoints: ``checkpoint(layer, x)``, or a
        checkpoint of ``partial(forward, self)`` made inside the layer's own forward (transformers)."""
        owner, firsts, enclosing = invocation
        if isinstance(owner, torch.nn.Module) and (firsts == [owner] or (enclosing is owner and owner not in firsts)):
            return owner
        return None

    def reached(self) -> list[torch.nn.Module]:
        """The modules the region's invocations go over: the one each wraps, or the ones it calls first."""
        found = []
        for invocation in self.invocations:
            module = self.wrapped(invocation)
            found += [module] if module is not None else invocation[1]
        return found


class _Recorder(Router):
    """A bypassing router that also records which region every module call runs in."""

    def __init__(self) -> None:
        super().__init__()
        self.reset("bypass")
        self.open: list[tuple[_Region, int]] = []
        self.found: dict[RegionKey, _Region] = {}
        self.module_stack: list[torch.nn.Module] = []
        self.module_calls: dict[int, tuple[torch.nn.Module, int, int]] = {}  # id -> (module, count, order)
        self.counter = 0

    @contextlib.contextmanager
    def region_run(self, call: CheckpointCall, phase: Phase, args: tuple | None = None,
                   kwargs: dict | None = None) -> Iterator[Run]:
        region = self.found.get(call.region)
        if region is None:
            region = self.found[call.region] = _Region(call.region, order=self.counter)
        region.invocations.append((unwrap(call.function)[1], [], self.module_stack[-1] if self.module_stack else None))
        self.open.append((region, len(self.module_stack)))
        try:
            with super().region_run(call, phase, args, kwargs) as run:
                yield run
        finally:
            self.open.pop()

    def pre(self, module: torch.nn.Module, _args: Any) -> None:
        if torch._C._current_graph_task_id() != -1:
            return
        self.counter += 1
        known = self.module_calls.get(id(module))
        self.module_calls[id(module)] = (module, (known[1] if known else 0) + 1, known[2] if known else self.counter)
        for region, depth in self.open:
            region.modules_inside.add(id(module))
        if self.open:
            region, depth = self.open[-1]
            if len(self.module_stack) == depth:
                region.invocations[-1][1].append(module)
        self.module_stack.append(module)

    def post(self, module: torch.nn.Module, _args: Any, _out: Any) -> None:
        if torch._C._current_graph_task_id() == -1 and self.module_stack and self.module_stack[-1] is module:
            self.module_stack.pop()


def _parents(roots: list[torch.nn.Module]) -> tuple[dict[int, tuple[torch.nn.Module, str]], dict[int, tuple[int, str]]]:
    """``{id(child): (parent, child's path)}`` and ``{id(module): (root index, path)}``."""
    parents: dict[int, tuple[torch.nn.Module, str]] = {}
    paths: dict[int, tuple[int, str]] = {}
    for index, root in enumerate(roots):
        for path, module in root.named_modules(remove_duplicate=True):
            paths.setdefault(id(module), (index, path))
            for name, child in module.named_children():
                parents.setdefault(id(child), (module, f"{path}.{name}" if path else name))
    return parents, paths


def _element(module: torch.nn.Module, parents: dict[int, tuple[torch.nn.Module, str]]) -> tuple[Any, torch.nn.Module]:
    """The container holding ``module`` (through one-child wrappers) and the element in it."""
    element = module
    while id(element) in parents:
        parent, _ = parents[id(element)]
        if isinstance(parent, _CONTAINERS):
            return parent, element
        if len(list(parent.children())) != 1:
            return None, element
        element = parent
    return None, element


def _unit_of(element: torch.nn.Module, wrapped_inner: bool) -> torch.nn.Module:
    if wrapped_inner:
        children = list(element.children())
        if len(children) == 1:
            return children[0]
    return element


def find_candidates(step: Callable[[], Any], state: StepState, restore: Callable[[], None]) -> Candidates:
    """Run ``step`` once (every checkpoint bypassed) and list what a plan can checkpoint."""
    recorder = _Recorder()
    register = torch.nn.modules.module
    handles = [register.register_module_forward_pre_hook(recorder.pre),
               register.register_module_forward_hook(recorder.post)]
    restore()
    try:
        with routing(recorder):
            step()
    finally:
        for handle in handles:
            handle.remove()
        restore()
    roots = list(state.modules)
    parents, paths = _parents(roots)
    # containers whose elements are the first module a region calls, two at least
    picked: dict[int, tuple[Any, set[int], bool]] = {}
    for region in recorder.found.values():
        for module in region.reached():
            if isinstance(module, _CONTAINERS):  # checkpoint(self.layers, x) on a Sequential
                children = {id(child) for child in module.children()}
                called = [m for m, _, _ in recorder.module_calls.values() if id(m) in children]
                targets = [(module, m) for m in called]
            else:
                container, element = _element(module, parents)
                targets = [(container, element)] if container is not None else []
            for container, element in targets:
                entry = picked.setdefault(id(container), (container, set(), False))
                entry[1].add(id(element))
                if element is not module and module in list(element.children()):
                    picked[id(container)] = (container, entry[1], True)
    notes: list[str] = []
    units: list[tuple[int, torch.nn.Module, str]] = []
    for container, elements, inner in picked.values():
        if len(elements) < 2:
            continue
        cpath = paths.get(id(container), (0, type(container).__name__))[1]
        for name, element in container.named_children():
            unit = _unit_of(element, inner)
            call = recorder.module_calls.get(id(unit))
            if call is None:
                continue
            path = paths.get(id(unit), (0, f"{cpath}.{name}"))[1]
            if call[1] != 1:
                notes.append(f"{path} runs {call[1]} times in a step (a shared module): it is left out of the plan")
                continue
            units.append((call[2], unit, path))
    if not units:
        raise NoRepeatedUnit(_no_unit_message(recorder))
    units.sort(key=lambda item: item[0])
    unit_ids = {id(unit) for _, unit, _ in units}
    root_index = max(range(len(roots)), key=lambda i: sum(paths.get(u, (-1,))[0] == i for u in unit_ids))
    items: list[Candidate] = []
    module_candidate: dict[int, Candidate] = {}
    for order, unit, path in units:
        candidate = Candidate(0, path, "unit", module=unit, container=path.rpartition(".")[0] or None)
        module_candidate[id(unit)] = candidate
        items.append(candidate)
    unit_keys: set[RegionKey] = set()
    regions: list[tuple[int, Candidate]] = []
    for region in sorted(recorder.found.values(), key=lambda r: r.order):
        wrapped = [region.wrapped(invocation) for invocation in region.invocations]
        if all(layer is not None and id(layer) in unit_ids for layer in wrapped):
            for layer in wrapped:
                module_candidate[id(layer)].written = True
            unit_keys.add(region.key)
            continue
        members = [module_candidate[i] for i in region.modules_inside if i in module_candidate]
        candidate = Candidate(0, region_label(region.key), "outer" if members else "region", key=region.key,
                              written=True)
        for member in sorted(members, key=lambda c: items.index(c)):
            if member.outer is None:
                member.outer, member.written = candidate, True
                candidate.inner.append(member)
        regions.append((region.order, candidate))
    ordered = _forward_order(items, regions, recorder)
    for index, candidate in enumerate(ordered):
        candidate.index = index
    return Candidates(ordered, roots[root_index], type(roots[root_index]).__name__, notes, frozenset(unit_keys))


def _forward_order(units: list[Candidate], regions: list[tuple[int, Candidate]], recorder: _Recorder) -> list[Candidate]:
    """Units by their first call; each region just before its first unit, or where it first ran."""
    placed = []
    for candidate in units:
        module, _, order = recorder.module_calls[id(candidate.module)]
        placed.append((order, 1, candidate))
    for order, candidate in regions:
        placed.append((order, 0, candidate))
    return [c for _, _, c in sorted(placed, key=lambda item: (item[0], item[1]))]


def _no_unit_message(recorder: _Recorder) -> str:
    if not recorder.found:
        return ("the step made no checkpoint call, so it runs no checkpointed loop to plan: checkpoint the "
                "repeated layers as you would (checkpoint(layer, x) in the loop, "
                "model.gradient_checkpointing_enable() in transformers) and run --suggest again")
    names = ", ".join(sorted(str(k) for k in recorder.found)[:3])
    return (f"no repeated unit: the step's checkpoint regions ({names}) do not go over the modules of a "
            "ModuleList or Sequential (two of its modules at least), so there is no layer to plan")
