"""Pipeline schedules as orders of actions on one stage, and what an order implies for memory.

A schedule decides *how many* microbatch bundles of saved state a stage holds at once;
checkpointing decides *what each bundle holds*.  This module is the first half: the order
in which a stage runs the forward (``F``) and backward (``B``) of each microbatch, the
*theoretical bundle count* that order implies (most microbatches forwarded and not yet
backpropagated at one time), and the retained-state peak it predicts from bundle sizes.

* GPipe: every forward, then every backward — ``M`` bundles on every stage.
* 1F1B: stage ``s`` of ``S`` runs ``min(M, S - s - 1)`` warm-up forwards, then alternates
  one forward and one backward, then drains — ``min(M, S - s)`` bundles.
* Other schedules (interleaved, zero-bubble) are read from the schedule object's
  ``pipeline_order`` when it has one (``I``/``B``/full backward count as the backward that
  frees a bundle; weight-only backward ``W`` does not hold activations of the stage input).

The observed peak (every live storage) also depends on what torch's GPipe and 1F1B keep
beside the bundles: stage outputs and input gradients held by their caches and send
handles (:func:`cached_outputs`, :func:`sent_gradients`, read from torch 2.13's
``schedules.py``); :func:`predict_observed_peak` adds each action's measured rise.

No torch import: the schedule object, when given, is only read through attributes.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["KINDS", "Action", "ObservedModel", "PeakModel", "cached_outputs", "order_for", "order_of_schedule",
           "predict_observed_peak", "predict_retained_peak", "schedule_kind", "sent_gradients", "theoretical_bundles"]

#: The schedules ``recheck cost --plan`` can lay out from a stage count and a microbatch count.
KINDS = ("gpipe", "1f1b")
_CLASS_KINDS = {"ScheduleGPipe": "gpipe", "Schedule1F1B": "1f1b"}
_FREES_BUNDLE = {"B", "I", "FULL_BACKWARD", "BACKWARD_INPUT"}


@dataclass(frozen=True)
class Action:
    """``F`` (forward) or ``B`` (the backward that frees the bundle) of one microbatch."""

    phase: str
    microbatch: int

    def __str__(self) -> str:
        return f"{self.phase}{self.microbatch}"


def order_for(kind: str, num_stages: int, stage: int, microbatches: int) -> list[Action]:
    """The order of actions of ``stage`` (0-based) under schedule ``kind`` (one of :data:`KINDS`)."""
    if kind not in KINDS:
        raise ValueError(f"unknown schedule {kind!r}; expected one of {', '.join(KINDS)}")
    if not 0 <= stage < num_stages or microbatches < 1:
        raise ValueError(f"stage {stage} of {num_stages} with {microbatches} microbatches is not a pipeline")
    forward = [Action("F", m) for m in range(microbatches)]
    backward = [Action("B", m) for m in range(microbatches)]
    if kind == "gpipe":
        return forward + backward
    warmup = min(microbatches, num_stages - stage - 1)
    order = forward[:warmup]
    for index in range(microbatches - warmup):
        order += [forward[warmup + index], backward[index]]
    return order + backward[microbatches - warmup :]


def schedule_kind(schedule: Any) -> str | None:
    """``"gpipe"`` or ``"1f1b"`` for torch's single-stage schedules, else None."""
    for klass in type(schedule).__mro__:
        if klass.__name__ in _CLASS_KINDS:
            return _CLASS_KINDS[klass.__name__]
    return None


def order_of_schedule(schedule: Any, stage: int, num_stages: int, microbatches: int) -> list[Action] | None:
    """The order ``schedule`` runs on ``stage``: from its class for GPipe and 1F1B, else from
    its ``pipeline_order`` (None when neither is known)."""
    kind = schedule_kind(schedule)
    if kind is not None:
        return order_for(kind, num_stages, stage, microbatches)
    table = getattr(schedule, "pipeline_order", None)
    if not isinstance(table, dict):
        return None
    order: list[Action] = []
    for actions in table.values():
        for action in actions or ():
            order += _compute_actions(action, stage)
    return order or None


def _compute_actions(action: Any, stage: int) -> list[Action]:
    """The forward / bundle-freeing backward in one ``pipeline_order`` entry (overlapped
    F+B entries carry theirs in ``sub_actions``)."""
    if action is None:
        return []
    subs = getattr(action, "sub_actions", None)
    if subs:
        return [found for sub in subs for found in _compute_actions(sub, stage)]
    microbatch = getattr(action, "microbatch_index", None)
    if getattr(action, "stage_index", None) != stage or microbatch is None:
        return []
    kind = getattr(action, "computation_type", None)
    name = getattr(kind, "name", str(kind))
    if name in ("F", "FORWARD"):
        return [Action("F", int(microbatch))]
    return [Action("B", int(microbatch))] if name in _FREES_BUNDLE else []


def _walk(order: list[Action]) -> Iterator[tuple[int, Action, set[int], set[int], int]]:
    """Each action of ``order`` with the microbatches whose bundles are alive before and after it, and
    the backwards done before it: the one walk every count and peak of a schedule is read from."""
    alive: set[int] = set()
    backwarded = 0
    for done, action in enumerate(order):
        after = alive | {action.microbatch} if action.phase == "F" else alive - {action.microbatch}
        yield done, action, alive, after, backwarded
        alive, backwarded = after, backwarded + (action.phase != "F")


def theoretical_bundles(order: list[Action]) -> int:
    """Most microbatches forwarded and not yet backpropagated at once under ``order``."""
    return max((len(after) for _, action, _, after, _ in _walk(order) if action.phase == "F"), default=0)


@dataclass(frozen=True)
class PeakModel:
    """What the retained-state prediction of a stage is made of.

    ``bundle`` bytes held per microbatch while it waits for its backward (its own storages);
    ``backward_extra`` the most bytes held for a microbatch above that while its backward
    runs (a checkpoint's rebuilt set); ``shared`` bytes held for all microbatches at once
    (the step's input batch, of which each microbatch is a view), alive while any bundle is.
    """

    bundle: int
    backward_extra: int = 0
    shared: int = 0


def predict_retained_peak(order: list[Action], model: PeakModel) -> int:
    """The retained-state peak ``order`` implies: bundles alive x bundle bytes, plus the rebuilt
    set of the microbatch in backward, plus the shared bytes while any bundle is alive."""
    def held(alive: set[int]) -> int:
        return len(alive) * model.bundle + (model.shared if alive else 0)

    return max((held(after) if action.phase == "F" else held(before) + model.backward_extra
                for _, action, before, after, _ in _walk(order)), default=0)


@dataclass(frozen=True)
class ObservedModel:
    """What the observed-peak prediction of a stage is made of (bytes).

    ``fixed``: alive through the step (parameters, optimizer state, recv buffers, the batch's
    data the stage holds); ``gradients`` the stage's ``.grad``, of which ``gradients_absent``
    is not allocated until the stage's first backward (set to None before the step);
    ``bundle`` held per microbatch in flight beyond the fixed state; ``kept`` per microbatch
    forwarded: its output (the last stage's also its loss), held by the schedule
    (:func:`cached_outputs`); ``sent_gradient`` per microbatch backpropagated (not on the
    first stage): the gradient of its input, held by a send handle (:func:`sent_gradients`);
    the rises: most bytes above what was alive when a forward, a backward (the stage's
    first, and a later one whose weight gradients add to an existing ``.grad``) or the
    optimizer step began.
    """

    fixed: int
    gradients: int
    gradients_absent: int
    bundle: int
    kept: int
    sent_gradient: int
    forward_rise: int
    first_backward_rise: int
    backward_rise: int
    optimizer_rise: int

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def cached_outputs(kind: str, order: list[Action], done: int, num_stages: int, stage: int) -> int:
    """How many microbatch outputs the stage holds before action ``done`` of ``order``, as
    torch's schedules keep them: the last stage every output forwarded so far (``output_chunks``
    and the losses, until the step ends); GPipe every output forwarded (its forward send
    handles are waited on, and let go, when the step ends); 1F1B each output until its
    backward (``fwd_cache``), and the last warm-up send but one until the cool-down (the
    handle ``send_work`` keeps it).
    """
    forwarded = [a.microbatch for a in order[:done] if a.phase == "F"]
    if stage == num_stages - 1 or kind == "gpipe":
        return len(forwarded)
    backwarded = {a.microbatch for a in order[:done] if a.phase == "B"}
    alive = [m for m in forwarded if m not in backwarded]
    microbatches = sum(1 for a in order if a.phase == "F")
    warmup = min(microbatches, num_stages - stage)
    held = warmup - 2  # torch fires every warm-up send but the last; send_work keeps the latest fired
    last_forward = max(i for i, a in enumerate(order) if a.phase == "F")
    cooldown = any(a.phase == "B" for a in order[last_forward + 1 : done])
    keeps_send = held >= 0 and held in forwarded and held not in alive and not cooldown
    return len(alive) + keeps_send


def sent_gradients(kind: str, backwarded: int) -> int:
    """How many input gradients of earlier backwards a send handle still holds: GPipe waits on
    its backward sends when the step ends; 1F1B on each one after the next backward."""
    return backwarded if kind == "gpipe" else min(backwarded, 1)


def predict_observed_peak(kind: str, order: list[Action], model: ObservedModel, num_stages: int, stage: int) -> tuple[int, str]:
    """The observed peak ``order`` implies and the action it falls in (``F2``, ``B1``,
    ``optimizer``): before each action, the fixed state, the gradients allocated so far,
    the bundles alive, the outputs and input gradients the schedule still holds; plus the
    action's rise."""
    peak, where = 0, ""

    def before(done: int, alive: set[int], backwarded: int) -> int:
        gradients = model.gradients - (model.gradients_absent if backwarded == 0 else 0)
        cached = cached_outputs(kind, order, done, num_stages, stage) * model.kept
        return (model.fixed + gradients + len(alive) * model.bundle + cached
                + sent_gradients(kind, backwarded) * model.sent_gradient)

    alive: set[int] = set()
    backwarded = 0
    for done, action, alive, after, backwarded in _walk(order):
        rise = (model.forward_rise if action.phase == "F" else
                model.first_backward_rise if backwarded == 0 else model.backward_rise)
        value = before(done, alive, backwarded) + rise
        if value > peak:
            peak, where = value, str(action)
        alive, backwarded = after, backwarded + (action.phase != "F")
    value = before(len(order), alive, backwarded) + model.optimizer_rise
    if value > peak:
        peak, where = value, "optimizer"
    return peak, where
