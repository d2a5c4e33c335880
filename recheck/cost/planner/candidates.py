"""What a plan can checkpoint, found by running the step once: its regions and its repeated units.

One untraced run with every checkpoint bypassed records every module call of the forward and
the checkpoint region it runs in.  A **unit** is a module of a ``ModuleList`` or ``Sequential``
at least two of whose modules are the first module a checkpoint region calls (through a
one-child wrapper such as ``CheckpointWrapper``, the wrapped module); every module of that
container the forward calls is a unit, checkpointed as written or not.  A **region** is one of
the step's own checkpoint calls that is not a unit's; one that runs units is *outer*: kept as
written, its units are inside it.  Without such a container the units are the forward's
outermost **repeated blocks** (docs/cost.md), and the line each is called from is kept
(:class:`Site`) for :mod:`~recheck.cost.planner.keeping`.  Units are found by what runs, not by
name; a unit called more than once in a step cannot be planned apart and is left out, with a note.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from recheck.cost.router import Router, routing
from recheck.intercept.hooks import CheckpointCall, Phase, Run
from recheck.runtime.naming import RegionKey, unwrap
from recheck.runtime.steps import StepState

__all__ = ["CONTAINERS", "Candidate", "Candidates", "NoRepeatedUnit", "Site", "find_candidates", "region_label"]

CONTAINERS = (torch.nn.ModuleList, torch.nn.Sequential)
_MODULE_FILE = torch.nn.modules.module.__file__


def region_label(key: RegionKey) -> str:
    """How a plan names one of the step's own checkpoint calls: its callable and call site,
    ``_VariableFunctionsClass.tanh at model.py:104`` (where the callable is defined is left out:
    a closure of torch's ``checkpoint_sequential`` is defined in torch)."""
    return f"{key.qualname} at {key.callsite}" if key.callsite else str(key)


class NoRepeatedUnit(ValueError):
    """The step runs no repeated unit or block: there is nothing to plan."""


@dataclass(frozen=True)
class Site:
    """Where the forward first called a block: the call expression's span (lines, and UTF-8 columns
    on them), and the module whose forward made the call, if a module's did."""

    file: str
    line: int
    end_line: int
    column: int
    end_column: int
    owner: torch.nn.Module | None


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
    site: Site | None = None
    #: False once measured to keep nothing more selectively than fully (no matrix product to save)
    selective: bool = True

    @property
    def variants(self) -> tuple[str, ...]:
        """The choices a plan has for it."""
        if self.kind == "unit":
            return ("none", "full", *(("selective",) if self.selective else ()),
                    *(("inside",) if self.outer is not None else ()))
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

    def __init__(self, watched: frozenset[int] = frozenset()) -> None:
        super().__init__()
        self.reset("bypass")
        self.watched = watched  # modules whose call site is kept
        self.sites: dict[int, Site] = {}
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
        if known is None and id(module) in self.watched:
            frame = sys._getframe(1)
            while frame.f_back is not None and frame.f_code.co_filename == _MODULE_FILE:
                frame = frame.f_back
            positions = getattr(frame.f_code, "co_positions", None)  # Python 3.11: the call's own span
            line, end_line, column, end_column = list(positions())[frame.f_lasti // 2] if positions else (None,) * 4
            owner = frame.f_locals.get("self")
            self.sites[id(module)] = Site(frame.f_code.co_filename, line or frame.f_lineno, end_line or 0,
                                          column or 0, end_column or 0,
                                          owner if isinstance(owner, torch.nn.Module) else None)
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
        if isinstance(parent, CONTAINERS):
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


_Units = list[tuple[int, torch.nn.Module, str]]  # (first call, module, path)
_Parents = dict[int, tuple[torch.nn.Module, str]]
_Paths = dict[int, tuple[int, str]]


def _called_once(recorder: _Recorder, unit: torch.nn.Module, path: str, units: _Units, notes: list[str]) -> None:
    """Add ``unit`` to ``units`` when the step calls it exactly once (a shared module is said, not planned)."""
    call = recorder.module_calls[id(unit)]
    if call[1] != 1:
        notes.append(f"{path} runs {call[1]} times in a step (a shared module): it is left out of the plan")
    else:
        units.append((call[2], unit, path))


def _checkpointed_units(recorder: _Recorder, parents: _Parents, paths: _Paths, notes: list[str]) -> _Units:
    """The modules of the containers whose elements are the first module a region calls, two at least."""
    picked: dict[int, tuple[Any, set[int], bool]] = {}
    for region in recorder.found.values():
        for module in region.reached():
            if isinstance(module, CONTAINERS):  # checkpoint(self.layers, x) on a Sequential
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
    units: _Units = []
    for container, elements, inner in picked.values():
        if len(elements) < 2:
            continue
        cpath = paths.get(id(container), (0, type(container).__name__))[1]
        for name, element in container.named_children():
            unit = _unit_of(element, inner)
            if id(unit) in recorder.module_calls:
                _called_once(recorder, unit, paths.get(id(unit), (0, f"{cpath}.{name}"))[1], units, notes)
    return units


def _repeated_blocks(recorder: _Recorder, parents: _Parents, paths: _Paths, notes: list[str]) -> _Units:
    """The outermost repeated blocks the forward calls (see the module docstring); NoRepeatedUnit says why
    there are none."""
    groups: dict[tuple[int, type], list[torch.nn.Module]] = {}
    for module, _, _ in recorder.module_calls.values():
        parent = parents.get(id(module), (None, ""))[0]
        if isinstance(parent, CONTAINERS) and not isinstance(module, CONTAINERS) and next(module.children(), None):
            groups.setdefault((id(parent), type(module)), []).append(module)
    blocks = {id(m) for members in groups.values() if len(members) > 1 for m in members}

    def inside_another(module: torch.nn.Module) -> bool:
        while id(module) in parents:
            module = parents[id(module)][0]
            if id(module) in blocks:
                return True
        return False

    units: _Units = []
    for module, _, _ in list(recorder.module_calls.values()):
        if id(module) in blocks and not inside_another(module):
            _called_once(recorder, module, paths[id(module)][1], units, notes)
    if not units:
        raise NoRepeatedUnit(_no_block_message(recorder, parents, paths))
    classes = sorted({type(module).__name__ for _, module, _ in units})
    notes.append(f"the step {'makes no checkpoint call' if not recorder.found else 'checkpoints no repeated unit'}: "
                 f"the candidates are the repeated blocks its forward runs ({', '.join(classes)})")
    return units


def find_candidates(step: Callable[[], Any], state: StepState, restore: Callable[[], None]) -> Candidates:
    """Run ``step`` once (every checkpoint bypassed) and list what a plan can checkpoint."""
    roots = list(state.modules)
    parents, paths = _parents(roots)
    recorder = _Recorder(frozenset(i for i, (parent, _) in parents.items() if isinstance(parent, CONTAINERS)))
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
    notes: list[str] = []
    units = _checkpointed_units(recorder, parents, paths, notes) or _repeated_blocks(recorder, parents, paths, notes)
    units.sort(key=lambda item: item[0])
    unit_ids = {id(unit) for _, unit, _ in units}
    root_index = max(range(len(roots)), key=lambda i: sum(paths.get(u, (-1,))[0] == i for u in unit_ids))
    items: list[Candidate] = []
    module_candidate: dict[int, Candidate] = {}
    for order, unit, path in units:
        candidate = Candidate(0, path, "unit", module=unit, container=path.rpartition(".")[0] or None,
                              site=recorder.sites.get(id(unit)))
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


def _no_block_message(recorder: _Recorder, parents: _Parents, paths: _Paths) -> str:
    """Why there is nothing to plan: what the step's checkpoint regions and its containers ran."""
    ran: dict[int, tuple[torch.nn.Module, list[torch.nn.Module]]] = {}
    for module, _, _ in recorder.module_calls.values():
        parent = parents.get(id(module), (None, ""))[0]
        if isinstance(parent, CONTAINERS):
            ran.setdefault(id(parent), (parent, []))[1].append(module)
    if not ran:
        why = ("the forward calls no module of a ModuleList or Sequential (a stack of blocks such as "
               "self.layers = nn.ModuleList(Block() for _ in range(n)))")
    else:
        found = []
        for container, members in list(ran.values())[:3]:
            names = [type(m).__name__ for m in members]
            kinds = f"{len(names)} {names[0]}" if len(set(names)) == 1 and len(names) > 1 else ", ".join(names)
            path = paths.get(id(container), (0, ""))[1]
            kind = type(container).__name__
            found.append(f"{path!r} ({kind}) runs {kinds}" if path else f"the step's {kind} runs {kinds}")
        why = ("a repeated block is a module with submodules that a ModuleList or Sequential holds twice or more, of "
               f"one class; {'; '.join(found)}, and a module with no submodule keeps its own input whether or not "
               "it is checkpointed (to checkpoint a run of such layers, use torch.utils.checkpoint.checkpoint_sequential)")
    if recorder.found:
        regions = ", ".join(sorted(str(k) for k in recorder.found)[:3])
        return (f"no repeated unit: the step's checkpoint regions ({regions}) do not go over the modules of a "
                f"ModuleList or Sequential (two of its modules at least), and there is no repeated block: {why}")
    return f"the step makes no checkpoint call and its forward runs no repeated block to plan: {why}"
