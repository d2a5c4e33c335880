"""Comparable views of Python values and RNG streams: fingerprints, display, RNG capture.

:func:`fingerprint` turns any value into a comparable structure: numbers by bits,
tensors by :func:`~recheck.checker.bits.digest`, containers by content and length.
:func:`rng_states` reads every RNG stream the checker tracks (torch's default CPU
generator, every initialized CUDA/XPU device, explicit ``torch.Generator`` objects,
Python ``random`` and numpy's global state); :class:`RngRecord` restores them.
These are re-exported by :mod:`recheck.checker.state`.
"""

from __future__ import annotations

import logging
import random
import sys
import zlib
from dataclasses import dataclass
from typing import Any, Iterator

import torch

from recheck.checker.bits import digest, float_bits

__all__ = ["MISSING", "Observed", "RngRecord", "fingerprint", "rng_fingerprint", "rng_states",
           "rng_summary", "show"]

_MAX_ITEMS = 4096
_LOGGERS = (logging.Logger, logging.LoggerAdapter)
_MAX_DEPTH = 3


def show(value: Any, limit: int = 80) -> str:
    """``repr`` truncated to ``limit`` characters (tensors as ``float32[4] on cpu``)."""
    if isinstance(value, torch.Tensor):
        from recheck.checker.bits import describe_tensor

        return describe_tensor(value)
    try:
        text = repr(value)
    except Exception:
        text = f"<{type(value).__name__} object>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def fingerprint(value: Any, depth: int = _MAX_DEPTH) -> Any:
    """A hashable, comparable summary of ``value`` that changes when its content does.

    Floats compare by bit pattern (``-0.0`` and NaN payloads count); tensors by
    metadata and :func:`digest`; tuples, lists, dicts and sets by length and content
    (up to ``_MAX_ITEMS`` items and three levels); objects of user classes by their
    ``__dict__`` one level deep; modules, functions, generators (whose streams are
    compared as RNG state) and other objects by identity.

    A logger (transformers' modules all read theirs) is compared by what decides what a
    call emits: identity, level, ``disabled``, ``propagate`` and its handlers.  Its
    ``__dict__`` would reach its lookup cache (filled by the first call at each level) and
    the manager's registry of every logger in the process (grown by any import, torch's
    own during the first backward), which change without changing the region.
    """
    if value is None or isinstance(value, (bool, int, str, bytes)):
        return (type(value).__name__, value)
    if isinstance(value, float):
        return ("float", float_bits(value))
    if isinstance(value, complex):
        return ("complex", float_bits(value.real), float_bits(value.imag))
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), str(value.dtype), str(value.device),
                value.requires_grad, digest(value))
    if isinstance(value, torch.Generator):
        return ("generator", id(value))  # its stream is compared as ``rng``
    if isinstance(value, _LOGGERS):
        logger = value.logger if isinstance(value, logging.LoggerAdapter) else value
        return ("logger", id(value), id(logger), logger.level, logger.disabled, logger.propagate,
                tuple(map(id, logger.handlers)))
    if depth <= 0 or isinstance(value, (torch.nn.Module, type)) or callable(value):
        return ("id", type(value).__name__, id(value))
    if isinstance(value, (list, tuple)):
        items = tuple(fingerprint(v, depth - 1) for v in value[:_MAX_ITEMS])
        return (type(value).__name__, len(value), items)
    if isinstance(value, dict):
        items = tuple((fingerprint(k, 1), fingerprint(v, depth - 1))
                      for k, v in list(value.items())[:_MAX_ITEMS])
        return (type(value).__name__, len(value), items)
    if isinstance(value, (set, frozenset)):
        items = frozenset(fingerprint(v, depth - 1) for v in list(value)[:_MAX_ITEMS])
        return (type(value).__name__, len(value), items)
    if type(value).__module__ == "numpy" and hasattr(value, "tobytes"):
        return ("ndarray", getattr(value, "shape", ()), str(getattr(value, "dtype", "")),
                value.tobytes())
    attrs = getattr(value, "__dict__", None)
    if isinstance(attrs, dict) and type(value).__module__ not in ("builtins",):
        items = tuple((k, fingerprint(v, depth - 1)) for k, v in list(attrs.items())[:_MAX_ITEMS])
        return ("object", type(value).__qualname__, id(value), items)
    return ("id", type(value).__name__, id(value))


@dataclass
class Observed:
    """One piece of state as seen after a run: ``value`` is a tensor copy or a fingerprint."""

    kind: str
    subject: str
    value: Any
    shown: str = ""


# -- RNG ----------------------------------------------------------------------------------------


def _initialized_accelerators() -> Iterator[tuple[str, Any]]:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        yield "cuda", torch.cuda
    xpu = getattr(torch, "xpu", None)
    if xpu is not None and getattr(xpu, "is_available", lambda: False)() and getattr(
        xpu, "is_initialized", lambda: False
    )():
        yield "xpu", xpu


def rng_fingerprint(state: Any) -> Any:
    """An exact comparable form of an RNG state (tensor bytes, Python or numpy state)."""
    if isinstance(state, torch.Tensor):
        return ("tensor", _state_bytes(state))
    if isinstance(state, tuple):
        try:
            hash(state)  # Python random: a tuple of ints is exact as it is
            return state
        except TypeError:  # holds an array (numpy)
            return tuple(rng_fingerprint(item) for item in state)
    if hasattr(state, "tobytes"):
        return ("ndarray", state.tobytes())
    return state


def _state_bytes(state: torch.Tensor) -> bytes:
    """An RNG state tensor's bytes (a few kB, on the host): exact and cheap to compare."""
    flat = state.detach().cpu().contiguous().reshape(-1)
    try:
        return bytes(flat.view(torch.uint8).numpy())
    except (RuntimeError, TypeError):  # torch built without numpy
        return bytes(flat.view(torch.uint8).tolist())


def rng_states(generators: dict[str, torch.Generator] | None = None) -> dict[str, Any]:
    """Current state of every RNG the check tracks, keyed by its display name."""
    states: dict[str, Any] = {"cpu RNG": torch.get_rng_state()}
    for kind, module in _initialized_accelerators():
        for index in range(module.device_count()):
            states[f"{kind}:{index} RNG"] = module.get_rng_state(index)
    for name, generator in (generators or {}).items():
        states[f"generator `{name}`"] = generator.get_state()
    states["Python random"] = random.getstate()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        states["numpy global RNG"] = numpy.random.get_state()
    return states


def _set_rng_state(name: str, state: Any, generators: dict[str, torch.Generator]) -> None:
    if name == "cpu RNG":
        torch.set_rng_state(state)
    elif name == "Python random":
        random.setstate(state)
    elif name == "numpy global RNG":
        sys.modules["numpy"].random.set_state(state)
    elif name.startswith("generator `"):
        generators[name[len("generator `"):-1]].set_state(state)
    else:
        kind, index = name.split(" ")[0].split(":")
        getattr(torch, kind).set_rng_state(state, int(index))


class RngRecord:
    """Every tracked RNG stream; ``generators`` maps display names to explicit Generators."""

    def __init__(self, generators: dict[str, torch.Generator]) -> None:
        self.generators = dict(generators)
        self.states = rng_states(self.generators)

    def add_generator(self, name: str, generator: torch.Generator) -> None:
        """Also track ``generator`` (its state now is the one restore puts back)."""
        if all(g is not generator for g in self.generators.values()):
            self.generators[name] = generator
            self.states[f"generator `{name}`"] = generator.get_state()

    def changed_streams(self) -> set[str]:
        """Names of the streams whose state differs from the captured one."""
        changed = set()
        for name, state in rng_states(self.generators).items():
            if name not in self.states or rng_fingerprint(state) != rng_fingerprint(self.states[name]):
                changed.add(name)
        return changed

    def restore(self) -> None:
        for name, state in self.states.items():
            if name.startswith(("cuda:", "xpu:")) and not any(
                name.startswith(kind) for kind, _ in _initialized_accelerators()
            ):
                continue
            _set_rng_state(name, state, self.generators)

    def observe(self) -> Iterator[Observed]:
        for name, state in rng_states(self.generators).items():
            yield Observed("rng", name, rng_fingerprint(state), rng_summary(state))


def rng_summary(state: Any) -> str:
    """A short description of an RNG state (a Mersenne Twister position, or a CRC-32)."""
    if isinstance(state, torch.Tensor):
        return f"state digest {zlib.crc32(_state_bytes(state)):08x}"
    if isinstance(state, tuple) and len(state) >= 2 and isinstance(state[1], tuple):
        return f"position {state[1][-1]}"  # Python random: the Mersenne Twister index
    if isinstance(state, tuple) and len(state) >= 3:
        return f"position {state[2]}"  # numpy legacy state
    return show(state)


class _Missing:
    def __repr__(self) -> str:
        return "<absent>"


#: Stands for a key that a namespace does not hold.
MISSING = _Missing()
