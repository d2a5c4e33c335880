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
import itertools
import sys
import types
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._pytree import tree_map

from recheck.findings import error_line
from recheck.runtime.bits import bits_equal
from recheck.runtime.fingerprints import instance_dict, items_of
from recheck.runtime.reach import code_globals, code_module_attributes, is_library
from recheck.runtime.rng import RngRecord
from recheck.runtime.snapshot import TensorRecord, is_immutable, same_items, same_mapping

__all__ = ["StepState", "discover_state", "given_objects", "unseen_optimizer_tensors"]

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
    #: ``(Type.attribute, object)`` of each object a module keeps that wraps an optimizer without
    #: being one (a training engine's: DeepSpeed ZeRO's): its own state no snapshot can see
    wrappers: list[tuple[str, Any]] = field(default_factory=list)
    #: objects whose own code raised when the search looked into them, by type: why (what they
    #: hold is neither found nor put back; a check names them)
    unreadable: dict[str, str] = field(default_factory=dict)

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
        """Copy the training loop's own state now (optimizers, wrapped ones too, in place: see
        :func:`_optimizer_copy`; schedulers and gradient scalers through their ``state_dict``,
        keeping their objects: :class:`_StatefulCopy`); the returned function puts that copy back."""
        copies = [_optimizer_copy(opt) for opt in self.optimizers] + [_StatefulCopy(obj) for obj in self.stateful]

        def restore() -> None:
            for kept in copies:
                kept.restore()

        return restore


def _optimizer_copy(optimizer: torch.optim.Optimizer) -> _OptimizerCopy | _StateDictCopy:
    """How ``optimizer`` is put back: in place where it keeps its state as torch's do, or where it
    wraps one that does and answers that one's own ``state`` and ``param_groups`` (accelerate's
    ``AcceleratedOptimizer``, a few wrappers deep); through its ``state_dict`` only otherwise,
    whose ``load_state_dict`` would make every container of the state anew at each restore."""
    for _ in range(_MAX_DEPTH):
        if _OptimizerCopy.fits(optimizer):
            return _OptimizerCopy(optimizer)
        inner = next((value for value in vars(optimizer).values() if isinstance(value, torch.optim.Optimizer)
                      and value.state is optimizer.state and value.param_groups is optimizer.param_groups), None)
        if inner is None:
            break
        optimizer = inner
    return _StateDictCopy(optimizer)


class _OptimizerCopy:
    """An optimizer's per-parameter state and parameter groups as they were, put back in place.

    The same ``param_groups`` list and group dicts, the same ``state`` mapping, per-parameter
    dicts and tensors (their bytes and version counters) are the optimizer's again after a
    restore: whoever holds one of them (a scheduler, a fused kernel's cache, the user) holds the
    optimizer's own, no ``load_state_dict`` hook runs, and only tensors a run changed are
    written (Adam's two moments a parameter: no copy of the whole state at every restore).
    Tensors are copied to host memory, as a measurement on an accelerator must not find its own
    copies in the device's allocator.  A value that is neither a tensor nor immutable (LBFGS
    keeps lists of tensors it appends to) is kept as a deep copy and put back as a fresh one.
    """

    @staticmethod
    def fits(optimizer: torch.optim.Optimizer) -> bool:
        """Whether the optimizer keeps its state and groups as torch's do: a dict and a list of
        its own (a wrapper that answers them through a property is put back by its
        ``load_state_dict``, :class:`_StateDictCopy`)."""
        held = vars(optimizer)
        return isinstance(held.get("state"), dict) and type(held.get("param_groups")) is list \
            and all(type(group) is dict for group in held["param_groups"])

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer
        self.groups = optimizer.param_groups
        self.group_items = [(group, self._items(group, "param group")) for group in self.groups]
        self.params = [(group["params"], list(group["params"])) for group in self.groups
                       if type(group.get("params")) is list]
        self.state = optimizer.state
        self.entries = [(key, entry, self._items(entry, "optimizer state")) for key, entry in self.state.items()]
        self.keys = {id(key) for key, _, _ in self.entries}

    def _items(self, mapping: dict[Any, Any], what: str) -> list[tuple[Any, Any, Any]]:
        """``(key, value, how it is put back)``: a tensor's record, a deep copy, or None (the
        value itself: immutable, or a group's ``params`` list, whose items are put back)."""
        items = []
        for key, value in mapping.items():
            if isinstance(value, torch.Tensor):
                keep: Any = TensorRecord("state", what, value, copy=_host_copy(value))
            elif is_immutable(value) or key == "params":
                keep = None
            else:
                keep = _DeepCopy(copy.deepcopy(value))
            items.append((key, value, keep))
        return items

    def restore(self) -> None:
        optimizer = self.optimizer
        if optimizer.param_groups is not self.groups:
            optimizer.param_groups = self.groups
        if not same_items(self.groups, [group for group, _ in self.group_items]):
            self.groups[:] = [group for group, _ in self.group_items]
        for params, items in self.params:
            if not same_items(params, items):
                params[:] = items
        if optimizer.state is not self.state:
            optimizer.state = self.state
        state = self.state
        for key in [key for key in state if id(key) not in self.keys]:  # state a run made
            del state[key]
        for group, items in self.group_items:
            _put_back(group, items)
        for key, entry, items in self.entries:
            if state.get(key) is not entry:
                state[key] = entry
            _put_back(entry, items)


class _StateDictCopy:
    """An optimizer that keeps its state otherwise than torch's do (a wrapper), put back through
    its ``state_dict``: the state as host copies, loaded anew at each restore, and each group's
    key order and plain values as they were (``load_state_dict`` puts "params" last)."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer
        self.state = tree_map(_host_copy_if_tensor, optimizer.state_dict())
        self.orders = [dict(group) for group in optimizer.param_groups]

    def restore(self) -> None:
        optimizer = self.optimizer
        optimizer.state.clear()
        optimizer.load_state_dict(copy.deepcopy(self.state))
        for group, original in zip(optimizer.param_groups, self.orders):
            items = {key: _same_if_equal(original[key], group[key]) for key in original if key in group}
            items.update((key, value) for key, value in group.items() if key not in items)
            group.clear()
            group.update(items)


class _StatefulCopy:
    """A scheduler's or gradient scaler's state, put back through its ``load_state_dict`` only
    where a run changed it, and then with the very objects it held wherever they still hold what
    was captured (``load_state_dict`` binds copies: a list held anew is a trace of the check)."""

    def __init__(self, obj: Any) -> None:
        self.obj = obj
        self.state = copy.deepcopy(obj.state_dict())
        self.held = dict(vars(obj))

    def restore(self) -> None:
        obj = self.obj
        if _same_state(obj.state_dict(), self.state):
            return
        obj.load_state_dict(copy.deepcopy(self.state))
        attributes = vars(obj)
        for key, value in self.held.items():
            if key in attributes and attributes[key] is not value and _same_state(attributes[key], value):
                attributes[key] = value


def _same_state(a: Any, b: Any) -> bool:
    """Whether two values of a ``state_dict`` are equal: containers item by item, tensors by bits."""
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        return bits_equal(a, b)
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same_state(a[key], b[key]) for key in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(map(_same_state, a, b))
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - a value without a plain equality
        return False


def unseen_optimizer_tensors(state: StepState) -> list[str]:
    """``Type.attribute`` of each attribute of an optimizer the step reaches that holds tensors
    (itself, or in lists, tuples and dicts of them, or another optimizer's groups and state it
    wraps) that neither its ``param_groups``/``state`` nor the modules' parameters and buffers
    hold, nor share storage with: master copies or shards a mixed-precision or sharding wrapper
    keeps for itself, which a snapshot of the optimizer cannot see and so cannot put back; and
    each object a module keeps that wraps an optimizer without being one (DeepSpeed's ZeRO
    optimizers: gradient partitions, a loss scaler, ZeRO-3's parameter partitions), whose own
    state no snapshot can see, with the attributes where it holds tensors of its own."""
    if not state.optimizers:
        return []
    known = state.parameters() + state.buffers() + state.optimizer_tensors()
    seen = {id(t) for t in known}
    storages = {_storage(t) for t in known} - {None}
    optimizers = {id(opt) for opt in state.optimizers}

    def unseen(holder: Any) -> list[str]:
        return [key for key, value in vars(holder).items() if key not in ("state", "param_groups", "defaults")
                and any(id(t) not in seen and _storage(t) not in storages for t in _held_tensors(value, optimizers, 0))]

    named = [f"{type(optimizer).__name__}.{key}" for optimizer in state.optimizers for key in unseen(optimizer)]
    for name, wrapper in state.wrappers:  # refused whatever it holds: its state is its own
        keys = unseen(wrapper)
        named.append(f"{name}, a {type(wrapper).__name__} wrapping a torch optimizer"
                     + (f" with {', '.join(keys[:4])}{' ...' if len(keys) > 4 else ''}" if keys else ""))
    return named


def _held_tensors(value: Any, optimizers: set[int], depth: int) -> Iterator[torch.Tensor]:
    """The tensors ``value`` is or holds: in (nested) lists, tuples and dict values, and in the
    groups and state of an optimizer it is (not one of ``optimizers``, the snapshot's own)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, torch.optim.Optimizer):
        if id(value) not in optimizers:
            yield from (p for group in value.param_groups for p in group["params"])
            yield from (v for st in value.state.values() for v in st.values() if isinstance(v, torch.Tensor))
    elif depth < _MAX_DEPTH and isinstance(value, (list, tuple, dict)):
        for item in list(value.values() if isinstance(value, dict) else value)[:1000]:
            yield from _held_tensors(item, optimizers, depth + 1)


def _storage(t: torch.Tensor) -> int | None:
    """Where a tensor's bytes live (a view shares its base's), None where that cannot be read."""
    try:
        return t.untyped_storage().data_ptr() or None
    except Exception:  # noqa: BLE001 - a tensor subclass without storage
        return None


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


class _DeepCopy:
    """A value kept as a deep copy; each restore puts back a deep copy of it."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


def _put_back(mapping: dict[Any, Any], items: list[tuple[Any, Any, Any]]) -> None:
    """``mapping`` holding ``items`` again, in their order, each tensor with its captured bytes."""
    values = {}
    for key, value, keep in items:
        if type(keep) is TensorRecord:
            keep.restore()  # only where its version or bytes moved
        elif keep is not None:
            value = copy.deepcopy(keep.value)
        values[key] = value
    if not same_mapping(mapping, values):
        mapping.clear()
        mapping.update(values)


def _import_numpy() -> None:
    try:
        import numpy  # noqa: F401
    except ImportError:  # pragma: no cover - numpy is optional
        pass


def discover_state(
    step: Callable[..., Any],
    modules: Iterable[torch.nn.Module] = (),
    optimizers: Iterable[torch.optim.Optimizer] = (),
    parts: Iterable[Any] | None = None,
) -> StepState:
    """The modules, optimizers and tensors reachable from ``step``, plus those given.

    Looks through closures, named globals, ``functools.partial`` arguments, bound
    ``self`` objects and their attributes, up to a few levels of referenced functions.
    Submodules of a found module are not listed separately (their parameters are reached
    through the parent).  ``parts``: what a step recheck generates holds (``check()``'s region,
    its arguments), looked through as the step's attributes are; its own code is recheck's.
    """
    state = StepState(modules=given_objects(modules, "modules"), optimizers=given_objects(optimizers, "optimizers"))
    seen: set[int] = {id(m) for m in state.modules} | {id(o) for o in state.optimizers}
    if parts is None:
        _visit(step, state, seen, depth=0)
    for part in parts or ():
        _visit(part, state, seen, depth=1)
    loose = _loose(state)
    state.leaves = [t for t in loose if t.requires_grad and t.is_leaf]
    state.tensors = [t for t in loose if not (t.requires_grad and t.is_leaf)]
    return state


def _loose(state: StepState) -> list[torch.Tensor]:
    """The tensors found that no module holds as a parameter or buffer, nor an optimizer's group
    (their ids read in one walk over the modules, and only where a tensor was found)."""
    if not state.tensors:
        return []
    covered = {id(t) for module in state.modules for sub in module.modules()
               for t in itertools.chain(sub._parameters.values(), sub._buffers.values())}
    covered.update(id(p) for opt in state.optimizers for group in opt.param_groups for p in group["params"])
    return [t for t in state.tensors if id(t) not in covered]


#: What ``modules`` and ``optimizers`` hold, and the name a message gives it.
_GIVEN = {"modules": (torch.nn.Module, "torch.nn.Module"),
          "optimizers": (torch.optim.Optimizer, "torch.optim.Optimizer")}


def given_objects(values: Any, name: str, where: str = "recheck") -> list[Any]:
    """The ``modules`` or ``optimizers`` (``name``) a caller gives, as a list, checked before the step runs.

    Raises:
        TypeError: naming ``where``, the argument and the element that is not a module (an optimizer).
    """
    kind, shown = _GIVEN[name]
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise TypeError(f"{where}: {name} must be a sequence of {shown}, got {type(values).__name__}")
    given = list(values)
    for index, value in enumerate(given):
        if not isinstance(value, kind):
            raise TypeError(f"{where}: {name}[{index}] must be a {shown}, got {type(value).__name__}")
    return given


def _visit(obj: Any, state: StepState, seen: set[int], depth: int) -> None:
    if id(obj) in seen or depth > _MAX_DEPTH:
        return
    seen.add(id(obj))
    try:
        _look_into(obj, state, seen, depth)
    except Exception as exc:  # noqa: BLE001 - the object's own code raised: named, the search goes on
        state.unreadable.setdefault(f"a `{type(obj).__qualname__}` object the step holds", error_line(exc))


def _look_into(obj: Any, state: StepState, seen: set[int], depth: int) -> None:
    kind = type(obj)  # (its type: ``isinstance`` would ask the object for its ``__class__``)
    if issubclass(kind, torch.nn.Module):
        state.modules.append(obj)
        _held_optimizers(obj, state, seen)
        return
    if issubclass(kind, torch.optim.Optimizer):
        state.optimizers.append(obj)
        return
    if issubclass(kind, torch.Generator):
        state.generators.append(obj)
        return
    if issubclass(kind, _STATEFUL):
        state.stateful.append(obj)
        return
    if _is_schedule(obj):
        state.schedules.append(obj)  # and on into its attributes: the stages' modules
    if issubclass(kind, torch.Tensor):
        if not obj.is_inference() and obj.device.type != "meta":
            state.tensors.append(obj)
        return
    if issubclass(kind, (list, tuple, set, frozenset)):
        for item in items_of(obj, kind, 1000)[1]:
            _visit(item, state, seen, depth)
        return
    if issubclass(kind, dict):
        for _, item in items_of(obj, kind, 1000)[1]:
            _visit(item, state, seen, depth)
        return
    if issubclass(kind, functools.partial):
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
        for name, attribute in code_module_attributes(obj.__code__):  # ``train_state.optimizer``
            module = obj.__globals__.get(name)
            if inspect.ismodule(module) and not is_library(module.__name__):
                value = vars(module).get(attribute)
                if not inspect.ismodule(value) and not inspect.isclass(value):
                    _visit(value, state, seen, depth + 1)
        return
    if inspect.ismodule(obj) or inspect.isclass(obj) or inspect.isbuiltin(obj):
        return
    attributes = instance_dict(obj)
    if attributes is not None and depth < _MAX_DEPTH:
        for value in list(attributes.values()):
            _visit(value, state, seen, depth + 1)
    if callable(obj) and not isinstance(obj, type):
        # a callable object: follow its class's __call__ (inherited ones included)
        call = next((k.__dict__["__call__"] for k in type(obj).__mro__ if "__call__" in k.__dict__), None)
        if inspect.isfunction(call):
            _visit(call, state, seen, depth + 1)


def _held_optimizers(module: torch.nn.Module, state: StepState, seen: set[int]) -> None:
    """The optimizers a module keeps in its own attributes (a training engine that steps its
    optimizer itself: DeepSpeed's), and the objects there that wrap one without being one."""
    for key, value in vars(module).items():
        kind = type(value)  # (not isinstance: a user class may answer __class__, or raise)
        if issubclass(kind, torch.optim.Optimizer):
            if id(value) not in seen:
                seen.add(id(value))
                state.optimizers.append(value)
        elif not issubclass(kind, (torch.nn.Module, torch.Tensor, type, types.ModuleType)):
            held = instance_dict(value)
            inner = [v for v in held.values() if issubclass(type(v), torch.optim.Optimizer)] if held is not None else []
            if inner and all(w is not value for _, w in state.wrappers):
                state.wrappers.append((f"{type(module).__name__}.{key}", value))
                for optimizer in inner:
                    if id(optimizer) not in seen:
                        seen.add(id(optimizer))
                        state.optimizers.append(optimizer)


def _is_schedule(obj: Any) -> bool:
    """A ``torch.distributed.pipelining`` schedule (only if that package is already imported)."""
    schedules = sys.modules.get("torch.distributed.pipelining.schedules")
    base = getattr(schedules, "_PipelineSchedule", None)
    return base is not None and issubclass(type(obj), base)
