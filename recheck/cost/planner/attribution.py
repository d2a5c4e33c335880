"""Which candidate every operator, saved tensor and storage of a traced run belongs to.

A candidate is *running* while its frame is open: a unit from its module's forward pre-hook to
its forward hook, a region while its function runs (kept: the router's region run and torch's
checkpoint code around it; dropped: the overlay's direct call), and any candidate while its
recompute runs in backward.  Every other operator of a backward belongs to the candidate whose
forward made the autograd node running it (nodes are labelled as operators make them), or,
for a node made outside every candidate (the loss), to no candidate.

The :class:`CensusTracer` cuts the run into *windows*: the operators of one candidate in one
phase (forward, backward), the operators between candidates, and the optimizer step.  At the
moment a window opens it records the observed total, which named storages are alive and which
candidate holds which of them for backward (saved by an operator it ran, kept as its
checkpoint's input, or kept by its selective policy); while the window runs, the highest
observed total.  Storages are *named* by the order in which the forward created them (the
same in every mode: checkpointing adds no operator to a forward outside torch's own checkpoint
code, which is not counted), and the step's data by its position among the step's tensors, so
the windows of runs in different modes can be laid side by side.
"""

from __future__ import annotations

import contextlib
import time
import weakref
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._pytree import tree_leaves

from recheck.cost.ledger import storage_key
from recheck.cost.planner.candidates import Candidates
from recheck.cost.planner.wrapping import planned_module
from recheck.cost.router import Router
from recheck.cost.trace import Tracer, label_graph, running_label, tensor_storage
from recheck.cost.work import Work, op_work
from recheck.intercept.hooks import CheckpointCall, Phase, Run
from recheck.runtime.naming import RegionKey, unwrap
from recheck.runtime.steps import StepState

__all__ = ["OPTIMIZER", "OUTSIDE", "CensusRouter", "CensusTracer", "Name", "Window"]

#: The owner of operators outside every candidate, and of the optimizer step.
OUTSIDE, OPTIMIZER = -1, -2
_NODE_KEY = "recheck_candidate"
#: A storage's name: ("op", n) for the forward's n-th new storage, ("data", i) for the step's i-th tensor.
Name = tuple[str, int]


@dataclass
class Window:
    """One window of a traced run (see the module docstring)."""

    key: tuple[str, int, int]  # (phase, owner, ordinal among the owner's windows of that phase)
    opened: int
    peak: int
    alive: frozenset[Name]
    holds: frozenset[tuple[int, Name]]

    @property
    def rise(self) -> int:
        return self.peak - self.opened


class CensusRouter(Router):
    """The router of a census run: frames per candidate, recompute time per candidate."""

    def __init__(self, candidates: Candidates, clock: Callable[[], float] = time.perf_counter) -> None:
        super().__init__()
        self.clock = clock
        self.reset("checkpoint")
        self.units = candidates.by_module()
        self.region_candidates = {c.key: c for c in candidates.regions}
        self.frames: list[tuple[int, bool]] = []
        self.recompute_seconds: dict[int, float] = {}
        self.tracer: CensusTracer | None = None

    def reset(self, mode: str) -> None:
        super().reset(mode)
        self.frames = []
        self.recompute_seconds = {}

    def candidate_of(self, function: Any, key: RegionKey | None) -> int | None:
        """The candidate a checkpointed (or dropped) callable is: a unit's forward, or a region."""
        module = planned_module(function)
        if module is None:
            owner = unwrap(function)[1]
            module = owner if isinstance(owner, torch.nn.Module) else None
        if module is not None and id(module) in self.units:
            return self.units[id(module)].index
        region = self.region_candidates.get(key) if key is not None else None
        return region.index if region is not None else None

    @contextlib.contextmanager
    def frame(self, index: int | None, recompute: bool = False, inputs: Any = ()) -> Iterator[None]:
        """The candidate ``index`` runs for the block (None: no frame); ``inputs`` were made before it."""
        if index is None:
            yield
            return
        if self.tracer is not None and not recompute:
            self.tracer.label(inputs, self.running())
        self.frames.append((index, recompute))
        started = self.clock()
        try:
            yield
        finally:
            if recompute:
                self.recompute_seconds[index] = self.recompute_seconds.get(index, 0.0) + self.clock() - started
            if (index, recompute) in self.frames:
                del self.frames[len(self.frames) - 1 - self.frames[::-1].index((index, recompute)):]

    def running(self) -> int:
        """The innermost running candidate, or OUTSIDE."""
        return self.frames[-1][0] if self.frames else OUTSIDE

    def recomputing(self) -> int | None:
        """The candidate whose recompute runs now (innermost), if any."""
        return next((i for i, recompute in reversed(self.frames) if recompute), None)

    # -- the interceptor's decisions ---------------------------------------------------------
    @contextlib.contextmanager
    def region_run(self, call: CheckpointCall, phase: Phase, args: tuple | None = None,
                   kwargs: dict | None = None) -> Iterator[Run]:
        recompute = phase is Phase.RECOMPUTE or torch._C._current_graph_task_id() != -1
        index = self.candidate_of(call.function, call.region)
        with self.frame(index, recompute, (args, kwargs)), super().region_run(call, phase, args, kwargs) as run:
            yield run
            self.ended(index, run.output)

    def around_machinery(self, call: CheckpointCall, run: Any) -> Any:
        index = self.candidate_of(call.function, call.region)
        with self.frame(index):
            result = super().around_machinery(call, run)
            self.ended(index, result)  # a reentrant checkpoint's node is made here
        return result

    # -- the overlay's direct calls and the units' module hooks --------------------------------
    def ended(self, index: int | None, output: Any) -> None:
        """The candidate ``index`` returned ``output``: the nodes that made it are its own."""
        if self.tracer is not None and index is not None and torch._C._current_graph_task_id() == -1:
            self.tracer.label(output, index)

    @contextlib.contextmanager
    def dropped(self, function: Any, key: RegionKey, args: tuple = ()) -> Iterator[Any]:
        index = self.candidate_of(function, key)
        with self.frame(index, False, args):
            outcome: list[Any] = []
            yield outcome
            if outcome:
                self.ended(index, outcome[0])

    def module_pre(self, module: torch.nn.Module, args: Any) -> None:
        unit = self.units.get(id(module))
        if unit is not None and torch._C._current_graph_task_id() == -1:
            if self.tracer is not None:
                self.tracer.label(args, self.running())
            self.frames.append((unit.index, False))

    def module_post(self, module: torch.nn.Module, _args: Any, output: Any) -> None:
        unit = self.units.get(id(module))
        if unit is not None and torch._C._current_graph_task_id() == -1 and (unit.index, False) in self.frames:
            self.ended(unit.index, output)
            position = len(self.frames) - 1 - self.frames[::-1].index((unit.index, False))
            del self.frames[position:]


class CensusTracer(Tracer):
    """A :class:`~recheck.cost.trace.Tracer` that also keeps per-candidate windows, holds and work."""

    def __init__(self, state: StepState, router: CensusRouter, selective: frozenset[Any] = frozenset()) -> None:
        super().__init__(state, router)
        self.census = router
        router.tracer = self
        self.selective = selective
        self.data = {id(t): i for i, t in enumerate(state.tensors)}
        self.names: dict[int, Name] = {}
        self.sizes: dict[Name, int] = {}
        self.created_order = 0
        self.in_force: Counter[tuple[int, Name]] = Counter()
        self.kept_alive: dict[tuple[int, Name], int] = {}  # selective saves: held while the storage lives
        self.holds_made: dict[int, set[Name]] = {}
        self.forward_work: dict[int, Work] = {}
        self.recompute_work: dict[int, Work] = {}
        self.windows: dict[tuple[str, int, int], Window] = {}
        self.order: list[tuple[str, int, int]] = []
        self.current: Window | None = None
        self.last_backward = OUTSIDE
        self.previous_owner: dict[str, int] = {}
        self.trace.ledger.listeners.append(self)

    # -- names ------------------------------------------------------------------------------
    def __enter__(self) -> CensusTracer:
        super().__enter__()
        for tensor in self.state.tensors:
            storage = tensor_storage(tensor)
            if storage is not None:
                name: Name = ("data", self.data[id(tensor)])
                self.names[storage_key(storage)] = name
                self.sizes[name] = int(storage.nbytes())
        return self

    def created(self, key: int) -> None:
        self.names.pop(key, None)  # a new storage where a freed one was: the key is reused
        if self.phase() != "forward" or self.router.machinery() is not None or self.census.recomputing() is not None:
            return
        entry = self.trace.ledger.entries[key]
        name: Name = ("op", self.created_order)
        self.created_order += 1
        self.names[key] = name
        self.sizes[name] = entry.nbytes

    # -- holds ------------------------------------------------------------------------------
    def _pack(self, tensor: torch.Tensor) -> Any:
        packed = super()._pack(tensor)
        storage = tensor_storage(tensor)
        if packed is tensor or storage is None or self.phase() != "forward":
            return packed
        name = self.names.get(storage_key(storage))
        if name is None:
            return packed
        hold = (self.census.running(), name)
        self.in_force[hold] += 1
        self.holds_made.setdefault(hold[0], set()).add(name)
        weakref.finalize(packed, self._let_go, hold)
        return packed

    def _let_go(self, hold: tuple[int, Name]) -> None:
        self.in_force[hold] -= 1
        if self.in_force[hold] <= 0:
            del self.in_force[hold]

    def label(self, tensors: Any, owner: int) -> None:
        """Label the graph behind ``tensors`` with ``owner`` where it is not labelled yet."""
        label_graph(tensors, _NODE_KEY, owner)

    # -- operators ----------------------------------------------------------------------------
    def owner(self) -> tuple[str, int]:
        """The phase running now and the candidate (or OUTSIDE, OPTIMIZER) it belongs to."""
        phase = self.phase()
        if phase == "optimizer":
            return phase, OPTIMIZER
        if phase == "forward":
            return phase, self.census.running()
        recomputing = self.census.recomputing()
        owner = running_label(_NODE_KEY)
        if recomputing is not None and (owner is None or owner == OUTSIDE):
            owner = recomputing
        if owner is None:
            owner = self.last_backward
        self.last_backward = owner
        return phase, owner

    def before_operator(self) -> None:
        super().before_operator()
        if not hasattr(self, "census"):
            return
        phase, owner = self.owner()
        current = self.current
        if current is None or current.key[0] != phase or current.key[1] != owner:
            self._open(phase, owner)
        self._sample()

    def after_operator(self, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
        super().after_operator(func, args, kwargs, out)
        phase = self.phase()
        recomputing = self.census.recomputing()
        running = self.census.running()
        work = None
        if recomputing is not None:
            work = self.recompute_work.setdefault(recomputing, Work())
        elif phase == "forward" and running != OUTSIDE:
            work = self.forward_work.setdefault(running, Work())
            if self.selective and getattr(func, "overloadpacket", None) in self.selective:
                self._kept_by_policy(running, out)
        if work is not None:
            work.add(op_work(func, args, kwargs, out))
        self._sample()

    def _kept_by_policy(self, owner: int, out: Any) -> None:
        for leaf in tree_leaves(out):
            storage = tensor_storage(leaf)
            name = self.names.get(storage_key(storage)) if storage is not None else None
            if name is not None:
                self.kept_alive[(owner, name)] = storage_key(storage)
                self.holds_made.setdefault(owner, set()).add(name)

    # -- windows ----------------------------------------------------------------------------
    def _sample(self) -> None:
        if self.current is not None:
            total = self.trace.ledger.observed_total
            if total > self.current.peak:
                self.current.peak = total

    def _open(self, phase: str, owner: int) -> None:
        self._close()
        ordinal_owner = owner if owner >= 0 else self.previous_owner.get(phase, OUTSIDE - 10)
        key = (phase, owner, ordinal_owner)
        if owner >= 0:
            self.previous_owner[phase] = owner
        if key in self.windows:  # the same window again (operators of one candidate interleaved)
            self.current = self.windows.pop(key)
            return
        ledger = self.trace.ledger
        alive = frozenset(self.names[k] for k, e in ledger.entries.items()
                          if e.observed and k in self.names and e.ref() is not None)
        holds = set(self.in_force)
        holds |= {hold for hold, k in self.kept_alive.items()
                  if k in ledger.entries and ledger.entries[k].ref() is not None and self.names.get(k) == hold[1]}
        total = ledger.observed_total
        self.current = Window(key, total, total, alive, frozenset(holds))
        self.order.append(key)

    def _close(self) -> None:
        current, self.current = self.current, None
        if current is not None:
            self.windows[current.key] = current

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        self._close()
        self.order = [k for k in dict.fromkeys(self.order) if k in self.windows]
