"""``recheck.apply_plan(model, plan)``: checkpoint exactly the modules a plan names, and undo it.

Each module of the plan gets an instance attribute ``forward`` (a :class:`PlannedForward`)
that checkpoints the module's own forward (``use_reentrant=False``; for ``selective``, with a
``context_fn`` saving the outputs of the plan's ``selective_ops``), so its path, ``state_dict``
keys and hooks stay as they are; under ``torch.no_grad()`` it runs as it was.  The region is a
:class:`PlannedRegion`, ``partial(Type.forward, module)``: reports name it as the module's
forward, and the planner tells a call the plan added from the step's own calls.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from recheck.cost.planner.plans import SELECTIVE_OPS, Plan, PlanError, load_plan

__all__ = ["PlanHandle", "PlannedForward", "PlannedRegion", "SelectiveContext", "apply_plan", "planned_module",
           "wrap_modules"]

_MISSING = object()


class PlannedRegion(functools.partial):
    """``partial(forward, module)`` the plan checkpoints (a subclass only to be told apart)."""


def planned_module(function: Any) -> torch.nn.Module | None:
    """The module whose planned region ``function`` is, or None for any other callable."""
    if isinstance(function, PlannedRegion):
        return function.module  # type: ignore[attr-defined,no-any-return]
    return None


def _resolve_ops(names: Iterable[str]) -> frozenset[Any]:
    """The operator packets named ``aten.mm`` ...; a default one this torch lacks is skipped."""
    packets = set()
    for name in names:
        namespace, _, op = name.partition(".")
        packet = getattr(getattr(torch.ops, namespace, None), op, None) if op else None
        if packet is None:
            if name in SELECTIVE_OPS:
                continue  # e.g. cuDNN attention on an older torch
            raise PlanError(f"selective_ops: {name!r} is not an operator of this torch (write it as aten.mm)")
        packets.add(packet)
    return frozenset(packets)


class SelectiveContext:
    """A ``context_fn`` for ``checkpoint``: save the outputs of ``packets``, recompute the rest."""

    def __init__(self, ops: Iterable[str] = SELECTIVE_OPS) -> None:
        #: the operator packets whose outputs are saved
        self.packets = _resolve_ops(ops)

    def policy(self, _ctx: Any, func: Any, *_args: Any, **_kwargs: Any) -> Any:
        from torch.utils.checkpoint import CheckpointPolicy

        saved = getattr(func, "overloadpacket", func) in self.packets
        return CheckpointPolicy.MUST_SAVE if saved else CheckpointPolicy.PREFER_RECOMPUTE

    def __call__(self) -> Any:
        from torch.utils.checkpoint import create_selective_checkpoint_contexts

        return create_selective_checkpoint_contexts(self.policy)


class PlannedForward:
    """The ``forward`` a plan gives a module: its previous forward, checkpointed."""

    def __init__(self, module: torch.nn.Module, variant: str, ops: Iterable[str], previous: Any) -> None:
        self.variant = variant
        self.previous = previous
        function = previous if previous is not _MISSING else type(module).forward
        self.region = PlannedRegion(function) if previous is not _MISSING else PlannedRegion(function, module)
        self.region.module = module  # type: ignore[attr-defined]
        self.context_fn = SelectiveContext(ops) if variant == "selective" else None
        # signature and name of the bound forward, as ``module.forward`` showed them before
        functools.update_wrapper(self, previous if previous is not _MISSING else module.forward, updated=())

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():
            return self.region(*args, **kwargs)
        options: dict[str, Any] = {"use_reentrant": False}
        if self.context_fn is not None:
            options["context_fn"] = self.context_fn
        return torch.utils.checkpoint.checkpoint(self.region, *args, **options, **kwargs)

    def __repr__(self) -> str:
        return f"<recheck plan: {self.variant} checkpoint of {self.region.func!r}>"


@dataclass
class PlanHandle:
    """What :func:`apply_plan` changed; :meth:`remove` undoes it (also as a context manager)."""

    plan: Plan
    wrapped: list[tuple[torch.nn.Module, PlannedForward]] = field(default_factory=list)

    def remove(self) -> None:
        """Give every wrapped module its forward back; a module whose forward was replaced since is said."""
        while self.wrapped:
            module, wrapper = self.wrapped.pop()
            if module.__dict__.get("forward") is not wrapper:
                warnings.warn(f"recheck.apply_plan: the forward of {type(module).__name__} was replaced after "
                              "the plan was applied; it is left as it is now", RuntimeWarning, stacklevel=2)
                continue
            if wrapper.previous is _MISSING:
                del module.forward
            else:
                module.forward = wrapper.previous

    def __enter__(self) -> PlanHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    def modules(self) -> Iterator[torch.nn.Module]:
        """The modules the plan checkpoints now."""
        return (module for module, _ in self.wrapped)


def apply_plan(model: torch.nn.Module, plan: Plan | dict[str, Any] | str, /) -> PlanHandle:
    """Checkpoint exactly the modules ``plan`` names (paths under ``model``); returns the undo handle.

    ``plan`` is a :class:`Plan`, its dict, its JSON text or the path of a JSON file written by
    ``recheck cost --suggest --format json``.  Turn the model's own checkpointing of those
    modules off first (``model.gradient_checkpointing_disable()`` in transformers, which also
    turns the KV cache back on: set ``model.config.use_cache = False`` to run the step that was
    measured), or they are checkpointed twice.

    Raises:
        PlanError: a path that is not a module of ``model``, an unknown variant or operator, a
            module that already carries a plan; nothing is changed then.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"recheck.apply_plan() needs the model (a torch.nn.Module), got {type(model).__name__}")
    plan = load_plan(plan)
    targets = []
    for path, variant in plan.modules:
        try:
            module = model.get_submodule(path)
        except AttributeError:
            where = f" (the plan was made for {plan.root})" if plan.root and plan.root != type(model).__name__ else ""
            raise PlanError(f"the plan's module {path!r} is not a module of {type(model).__name__}{where}") from None
        current = module.__dict__.get("forward", _MISSING)
        if isinstance(current, PlannedForward):
            raise PlanError(f"module {path!r} already carries a plan; remove that one first (handle.remove())")
        targets.append((module, variant, current))
    return wrap_modules([(module, variant) for module, variant, _ in targets], plan.selective_ops, plan)


def wrap_modules(pairs: Iterable[tuple[torch.nn.Module, str]], ops: Iterable[str] = SELECTIVE_OPS,
                 plan: Plan | None = None) -> PlanHandle:
    """Checkpoint each module of ``pairs`` with its variant (``full``, ``selective``); the undo handle."""
    pairs, ops = list(pairs), tuple(ops)
    if any(variant == "selective" for _, variant in pairs):
        _resolve_ops(ops)  # a bad operator name fails before anything changes
    for module, variant in pairs:
        if isinstance(module.__dict__.get("forward"), PlannedForward):
            raise PlanError(f"{type(module).__name__} already carries a plan; remove that one first")
        if variant not in ("full", "selective"):
            raise PlanError(f"unknown variant {variant!r} for {type(module).__name__}")
    handle = PlanHandle(plan if plan is not None else Plan(selective_ops=ops))
    for module, variant in pairs:
        wrapper = PlannedForward(module, variant, ops, module.__dict__.get("forward", _MISSING))
        module.forward = wrapper
        handle.wrapped.append((module, wrapper))
    return handle
