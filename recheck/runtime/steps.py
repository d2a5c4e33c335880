"""Find the state a zero-argument training step touches, and put it back between runs.

``recheck.measure`` runs the same step in two modes and several times each; every run must
start from the same parameters, gradients, buffers, optimizer state and random-number
generators, or the two modes would not see the same model, data and RNG.  The step is a
plain callable, so the modules and optimizers are found the way a reader would: in the
callable's closure, in the globals its code names, and in the attributes of bound objects
(``functools.partial`` arguments and ``self`` included), recursively through functions it
references.  Callers can also pass them explicitly.
"""

from __future__ import annotations

import copy
import functools
import inspect
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._pytree import tree_map

from recheck.runtime.reach import code_globals
from recheck.runtime.rng import RngRecord

__all__ = ["StepState", "discover_state"]

_MAX_DEPTH = 3
#: Training-loop objects whose ``state_dict`` changes in a step: restored like the optimizer.
_STATEFUL = (torch.optim.lr_scheduler.LRScheduler, torch.amp.GradScaler)


@dataclass
class StepState:
    """What a step uses: modules, optimizers, loose tensors, ``torch.Generator`` objects,
    learning-rate schedulers and gradient scalers (restored through their ``state_dict``), and
    ``torch.distributed.pipelining`` schedules (only found, never restored: their stages'
    modules are found through them)."""

    modules: list[torch.nn.Module] = field(default_factory=list)
    optimizers: list[torch.optim.Optimizer] = field(default_factory=list)
    tensors: list[torch.Tensor] = field(default_factory=list)
    leaves: list[torch.Tensor] = field(default_factory=list)
    generators: list[torch.Generator] = field(default_factory=list)
    stateful: list[Any] = field(default_factory=list)
    schedules: list[Any] = field(default_factory=list)

    def parameters(self) -> list[torch.Tensor]:
        """Every distinct parameter: of the modules, the optimizers' groups, and loose leaves
        that require grad (tensors used as parameters without a module)."""
        seen: dict[int, torch.Tensor] = {id(t): t for t in self.leaves}
        for module in self.modules:
            for p in module.parameters():
                seen.setdefault(id(p), p)
        for opt in self.optimizers:
            for group in opt.param_groups:
                for p in group["params"]:
                    seen.setdefault(id(p), p)
        return list(seen.values())

    def buffers(self) -> list[torch.Tensor]:
        """Every distinct buffer of the modules."""
        seen: dict[int, torch.Tensor] = {}
        for module in self.modules:
            for b in module.buffers():
                seen.setdefault(id(b), b)
        return list(seen.values())

    def optimizer_tensors(self) -> list[torch.Tensor]:
        """Every tensor held in the optimizers' per-parameter state."""
        return [v for opt in self.optimizers for st in opt.state.values() for v in st.values() if isinstance(v, torch.Tensor)]

    def snapshot(self) -> Callable[[], None]:
        """Copy everything now; the returned function restores that copy (any number of times).

        The copies are kept in host memory, so that a measurement on an accelerator does
        not find its own snapshot in the device's allocator figures.
        """
        params = self.parameters()
        values = [_host_copy(p) for p in params]
        grads = [None if p.grad is None else _host_copy(p.grad) for p in params]
        buffers = self.buffers()
        buffer_values = [_host_copy(b) for b in buffers]
        tensors = list(self.tensors)
        tensor_values = [_host_copy(t) for t in tensors]
        restore_loop = self.loop_snapshot()
        _import_numpy()  # so a step that first imports numpy still sees the same numpy RNG in every run
        rng = RngRecord({f"#{i}": g for i, g in enumerate(self.generators)})

        def restore() -> None:
            with torch.no_grad():
                for p, value, grad in zip(params, values, grads):
                    p.copy_(value)
                    p.grad = None if grad is None else grad.to(p.device, copy=True)
                for b, value in zip(buffers, buffer_values):
                    b.copy_(value)
                for t, value in zip(tensors, tensor_values):
                    t.copy_(value)
            restore_loop()
            rng.restore()

        return restore

    def loop_snapshot(self) -> Callable[[], None]:
        """Copy the training loop's own state now (optimizers, schedulers, gradient scalers,
        through their ``state_dict``); the returned function puts that copy back."""
        optimizer_states = [tree_map(_host_copy_if_tensor, opt.state_dict()) for opt in self.optimizers]
        # load_state_dict rebuilds each param group from a copy, "params" last: the key order and
        # the very objects of the group (betas is the tuple ``defaults`` holds too) are put back,
        # so that a restored optimizer is, printed, the optimizer as it was
        group_orders = [[dict(group) for group in opt.param_groups] for opt in self.optimizers]
        stateful_states = [copy.deepcopy(obj.state_dict()) for obj in self.stateful]

        def restore() -> None:
            for opt, state, orders in zip(self.optimizers, optimizer_states, group_orders):
                opt.state.clear()
                opt.load_state_dict(copy.deepcopy(state))
                for group, original in zip(opt.param_groups, orders):
                    items = {key: _same_if_equal(original[key], group[key]) for key in original if key in group}
                    items.update((key, value) for key, value in group.items() if key not in items)
                    group.clear()
                    group.update(items)
            for obj, obj_state in zip(self.stateful, stateful_states):
                obj.load_state_dict(copy.deepcopy(obj_state))

        return restore


def _same_if_equal(original: Any, restored: Any) -> Any:
    """``original`` when ``restored`` is an equal plain value (identity kept), else ``restored``."""
    if original is restored or isinstance(original, (torch.Tensor, list)) or type(original) is not type(restored):
        return restored
    try:
        return original if bool(original == restored) else restored
    except Exception:  # noqa: BLE001 - a value without a plain equality
        return restored


def _host_copy(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu", copy=True)


def _host_copy_if_tensor(value: Any) -> Any:
    return _host_copy(value) if isinstance(value, torch.Tensor) else copy.deepcopy(value)


def _import_numpy() -> None:
    try:
        import numpy  # noqa: F401
    except ImportError:  # pragma: no cover - numpy is optional
        pass


def discover_state(
    step: Callable[..., Any],
    modules: Iterable[torch.nn.Module] = (),
    optimizers: Iterable[torch.optim.Optimizer] = (),
) -> StepState:
    """The modules, optimizers and tensors reachable from ``step``, plus those given.

    Looks through closures, named globals, ``functools.partial`` arguments, bound
    ``self`` objects and their attributes, up to a few levels of referenced functions.
    Submodules of a found module are not listed separately (their parameters are reached
    through the parent).
    """
    state = StepState(modules=list(modules), optimizers=list(optimizers))
    seen: set[int] = {id(m) for m in state.modules} | {id(o) for o in state.optimizers}
    _visit(step, state, seen, depth=0)
    covered = {id(t) for t in state.parameters()} | {id(t) for t in state.buffers()}
    loose = [t for t in state.tensors if id(t) not in covered]
    state.leaves = [t for t in loose if t.requires_grad and t.is_leaf]
    state.tensors = [t for t in loose if not (t.requires_grad and t.is_leaf)]
    return state


def _visit(obj: Any, state: StepState, seen: set[int], depth: int) -> None:
    if id(obj) in seen or depth > _MAX_DEPTH:
        return
    seen.add(id(obj))
    if isinstance(obj, torch.nn.Module):
        state.modules.append(obj)
        return
    if isinstance(obj, torch.optim.Optimizer):
        state.optimizers.append(obj)
        return
    if isinstance(obj, torch.Generator):
        state.generators.append(obj)
        return
    if isinstance(obj, _STATEFUL):
        state.stateful.append(obj)
        return
    if _is_schedule(obj):
        state.schedules.append(obj)  # and on into its attributes: the stages' modules
    if isinstance(obj, torch.Tensor):
        if not obj.is_inference() and obj.device.type != "meta":
            state.tensors.append(obj)
        return
    if isinstance(obj, (list, tuple, set, frozenset)):
        for item in list(obj)[:1000]:
            _visit(item, state, seen, depth)
        return
    if isinstance(obj, dict):
        for item in list(obj.values())[:1000]:
            _visit(item, state, seen, depth)
        return
    if isinstance(obj, functools.partial):
        _visit(obj.func, state, seen, depth)
        for item in (*obj.args, *obj.keywords.values()):
            _visit(item, state, seen, depth)
        return
    if inspect.ismethod(obj):
        _visit(obj.__self__, state, seen, depth)
        _visit(obj.__func__, state, seen, depth)
        return
    if inspect.isfunction(obj):
        for cell in obj.__closure__ or ():
            try:
                _visit(cell.cell_contents, state, seen, depth + 1)
            except ValueError:  # an empty cell
                pass
        for name in code_globals(obj.__code__)[0]:
            if name in obj.__globals__:
                value = obj.__globals__[name]
                if not inspect.ismodule(value) and not inspect.isclass(value):
                    _visit(value, state, seen, depth + 1)
        return
    if inspect.ismodule(obj) or inspect.isclass(obj) or inspect.isbuiltin(obj):
        return
    attributes = getattr(obj, "__dict__", None)
    if isinstance(attributes, dict) and depth < _MAX_DEPTH:
        for value in list(attributes.values()):
            _visit(value, state, seen, depth + 1)
    if callable(obj) and not isinstance(obj, type):
        # a callable object: follow its class's __call__ (inherited ones included)
        call = next((k.__dict__["__call__"] for k in type(obj).__mro__ if "__call__" in k.__dict__), None)
        if inspect.isfunction(call):
            _visit(call, state, seen, depth + 1)


def _is_schedule(obj: Any) -> bool:
    """A ``torch.distributed.pipelining`` schedule (only if that package is already imported)."""
    schedules = sys.modules.get("torch.distributed.pipelining.schedules")
    base = getattr(schedules, "_PipelineSchedule", None)
    return base is not None and isinstance(obj, base)
