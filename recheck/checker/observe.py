"""The callable handed to ``checkpoint``: it calls the region and records every call.

torch calls the *same* object for the forward and for the recompute (both
variants), so call 1 of a checkpointed run is the forward and later calls are
recomputations.  Each :class:`CallRecord` holds the state at entry (RNG streams,
globals the region reads, parameter versions), the context it computes in (grad mode,
autocast, default dtype), the side effects emitted during the call, the outputs (flattened, detached) and how the call ended: ``returned``,
``stopped`` (torch's early stop ended it) or ``raised``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from recheck.runtime.bits import bits_equal
from recheck.runtime.context import ComputeContext, current_context
from recheck.runtime.effects import Effect, EffectCapture
from recheck.runtime.reach import Reach
from recheck.runtime.trees import input_tensors, leaves
from recheck.runtime.fingerprints import MISSING, fingerprint, show_printed
from recheck.runtime.rng import rng_fingerprint, rng_states, rng_summary

__all__ = ["CallRecord", "Observer", "Probe"]

_STOP = getattr(torch.utils.checkpoint, "_StopRecomputationError", None)


@dataclass
class CallRecord:
    """One call of the region."""

    index: int
    entry: dict[tuple[str, str], Any]
    shown: dict[tuple[str, str], str]
    inputs_entry: dict[str, tuple[int, torch.Tensor]] = field(default_factory=dict)  # version, copy
    inputs_exit: dict[str, tuple[int, bool]] = field(default_factory=dict)  # version, same bytes
    effects: list[Effect] = field(default_factory=list)
    outputs: list[tuple[str, Any]] | None = None
    outcome: str = "running"
    error: BaseException | None = None
    context: ComputeContext | None = None


class Probe:
    """Reads the entry state of a call: RNG streams, globals read, parameter versions."""

    def __init__(self, reach: Reach, parameters: dict[str, torch.Tensor]) -> None:
        self.reach = reach
        self.parameters = parameters

    def read(self) -> tuple[dict[tuple[str, str], Any], dict[tuple[str, str], str]]:
        """Comparable values and their display texts, keyed by (kind, subject)."""
        values: dict[tuple[str, str], Any] = {}
        shown: dict[tuple[str, str], str] = {}
        for name, state in rng_states(self.reach.generators).items():
            values[("rng", name)] = rng_fingerprint(state)
            shown[("rng", name)] = rng_summary(state)
        for ref in list(self.reach.reads.values()):
            value = ref.namespace.get(ref.name, MISSING)
            key = ("global", ref.subject)
            values[key] = fingerprint(value)
            shown[key] = show_printed(value, values[key])
        for name, parameter in self.parameters.items():
            key = ("param_version", f"parameter `{name}`")
            values[key] = parameter._version
            shown[key] = f"version {parameter._version}"
        return values, shown


def _input_copies(args: tuple, kwargs: dict) -> dict[str, tuple[int, torch.Tensor]]:
    return {path: (t._version, t.detach().clone()) for path, t in input_tensors(args, kwargs)}


def _input_exits(args: tuple, kwargs: dict,
                 entry: dict[str, tuple[int, torch.Tensor]]) -> dict[str, tuple[int, bool]]:
    return {path: (t._version, path in entry and bits_equal(t, entry[path][1]))
            for path, t in input_tensors(args, kwargs)}


def _detached(value: Any) -> Any:
    return value.detach() if isinstance(value, torch.Tensor) else value


class Observer:
    """Wraps the region; ``passthrough`` lets the user see the output of the plain run.

    ``after_first(args, kwargs)`` runs when the first call (the forward) returns.
    """

    def __init__(self, fn: Callable[..., Any], probe: Probe, *, passthrough: bool = False,
                 track_inputs: bool = False,
                 after_first: Callable[[tuple, dict], None] | None = None) -> None:
        self.fn = fn
        self.probe = probe
        self.passthrough = passthrough
        self.track_inputs = track_inputs
        self.after_first = after_first
        self.calls: list[CallRecord] = []

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        entry, shown = self.probe.read()
        record = CallRecord(index=len(self.calls) + 1, entry=entry, shown=shown, context=current_context())
        self.calls.append(record)
        if self.track_inputs and record.index == 1:
            record.inputs_entry = _input_copies(args, kwargs)
        capture = EffectCapture(passthrough=self.passthrough and record.index == 1)
        try:
            with capture:
                result = self.fn(*args, **kwargs)
        except BaseException as exc:
            stopped = _STOP is not None and isinstance(exc, _STOP)
            record.outcome = "stopped" if stopped else "raised"
            # torch's early stop is not kept: its traceback holds the frames of the recompute,
            # this one's among them, whose locals hold the record (a reference cycle that would
            # keep every tensor of the check alive until the garbage collector ran)
            record.error = None if stopped else exc
            raise
        finally:
            record.effects = capture.effects
            if self.track_inputs and record.index == 1:
                record.inputs_exit = _input_exits(args, kwargs, record.inputs_entry)
        record.outcome = "returned"
        record.outputs = [(path, _detached(leaf)) for path, leaf in leaves(result)]
        if self.after_first is not None and record.index == 1:
            self.after_first(args, kwargs)
        return result
