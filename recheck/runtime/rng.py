"""Every random-number stream a region or a step can draw from: read, compare, put back.

:func:`rng_states` reads every stream recheck tracks (torch's default CPU generator, every
initialized CUDA/XPU device, explicit ``torch.Generator`` objects, Python ``random`` and
numpy's global state), keyed by the name findings use (``cpu RNG``, ``cuda:0 RNG``,
``generator `self.gen```, ``Python random``, ``numpy global RNG``); :func:`rng_fingerprint`
is the one exact comparable encoding of a state (tensor bytes; Python's tuple as it is;
numpy's arrays as bytes); :class:`RngRecord` restores them all.

RNG *instances* a region holds (``random.Random``, ``numpy.random.RandomState``, numpy's
``Generator`` and bit generators) are found by the snapshot where it finds other held state:
:func:`instance_kind` tells one, :func:`instance_state` and :func:`set_instance_state` read and
put back its state.
"""

from __future__ import annotations

import random
import sys
import zlib
from typing import Any, Iterator

import torch

from recheck.findings import Subject
from recheck.runtime.bits import host_memory
from recheck.runtime.fingerprints import Observed, show

__all__ = ["CPU_STREAM", "HOST_STREAMS", "RngRecord", "cpu_fingerprint", "instance_kind", "instance_state", "only_cpu",
           "rng_fingerprint", "rng_fingerprints", "rng_states", "rng_summary", "set_instance_state"]


def _initialized_accelerators() -> tuple[tuple[str, Any], ...]:
    """The accelerator modules whose RNG state exists (a tuple, usually empty: read four times a call)."""
    found: tuple[tuple[str, Any], ...] = ()
    for kind, module in _ACCELERATORS:
        # initialized implies available (is_available() asks the driver: four reads a call)
        if module.is_initialized():
            found += ((kind, module),)
    return found


def _accelerators() -> tuple[tuple[str, Any], ...]:
    """``(kind, module)`` of the accelerator backends this torch is built with (a backend it is
    not built with is never initialized, so it is not asked)."""
    found = []
    for kind, built in (("cuda", "_has_cuda"), ("xpu", "_has_xpu")):
        module = getattr(torch, kind, None)
        if getattr(module, "is_initialized", None) is not None and getattr(torch._C, built, True):
            found.append((kind, module))
    return tuple(found)


#: the accelerator backends of this torch build
_ACCELERATORS = _accelerators()


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
    if isinstance(state, dict):  # numpy's bit generators: {"bit_generator": ..., "state": {...}}
        return ("dict", tuple((key, rng_fingerprint(value)) for key, value in state.items()))
    if hasattr(state, "tobytes"):
        return ("ndarray", state.tobytes())
    return state


def _state_bytes(state: torch.Tensor) -> bytes:
    """An RNG state tensor's bytes (a few kB, on the host): exact and cheap to compare.

    Read through the storage's address, so numpy is not needed (and the storage stays
    resizable, which ``Tensor.numpy()`` would end).
    """
    if state.is_cpu and state.dtype is torch.uint8 and state.is_contiguous():
        flat = state  # what get_state() returns: read as it is (it is read four times a call)
    else:
        flat = state.detach().cpu().contiguous().view(torch.uint8).reshape(-1)
    return _host_bytes(flat)


def _host_bytes(flat: torch.Tensor) -> bytes:
    """The bytes of a contiguous ``uint8`` host tensor, read in place."""
    size = flat.numel()
    return host_memory(flat.data_ptr(), size).raw if size else b""


#: torch's default CPU generator, as findings and state keys name it (``cpu RNG``).
CPU_STREAM = Subject("device RNG", owner="cpu")
#: Python's and numpy's global streams.
PYTHON_STREAM, NUMPY_STREAM = Subject("host RNG", "Python random"), Subject("host RNG", "numpy global RNG")
#: The host streams a region's code may not reach at all (see ``Reach.host_rng``).
HOST_STREAMS = frozenset({PYTHON_STREAM, NUMPY_STREAM})


def rng_states(generators: dict[str, torch.Generator] | None = None,
               host: frozenset[str] = HOST_STREAMS) -> dict[str, Any]:
    """Current state of every RNG the check tracks, keyed by its display name.

    ``host`` narrows the host streams read (``"Python random"``, ``"numpy global RNG"``): each is
    read as a whole Mersenne Twister state (hundreds of words, copied into Python objects), far
    more than torch's streams cost, so ``watch()`` reads them only for regions whose code refers
    to them.  torch's own streams and explicit generators are always read.
    """
    return {CPU_STREAM: torch.default_generator.get_state(), **_other_states(generators, host)}


def _other_states(generators: dict[str, torch.Generator] | None, host: frozenset[str] | set[str]) -> dict[str, Any]:
    """:func:`rng_states` but torch's default CPU generator."""
    states: dict[str, Any] = {}
    for kind, module in _initialized_accelerators():
        for index in range(module.device_count()):
            states[Subject("device RNG", owner=f"{kind}:{index}")] = module.get_rng_state(index)
    for name, generator in (generators or {}).items():
        states[Subject("RNG instance", name, owner="generator")] = generator.get_state()
    if PYTHON_STREAM in host:
        states[PYTHON_STREAM] = random.getstate()
    numpy = sys.modules.get("numpy") if NUMPY_STREAM in host else None
    if numpy is not None:
        states[NUMPY_STREAM] = numpy.random.get_state()
    return states


def rng_fingerprints(generators: dict[str, torch.Generator] | None = None,
                     host: frozenset[str] | set[str] = HOST_STREAMS) -> dict[str, Any]:
    """``rng_fingerprint`` of every state :func:`rng_states` reads, by the same names.

    ``watch()`` reads these four times per invocation, so torch's default CPU generator (a
    ``uint8`` tensor of 5,056 bytes) is read without the general path.
    """
    prints: dict[str, Any] = {CPU_STREAM: cpu_fingerprint()}
    if not only_cpu(generators, host):
        for name, state in _other_states(generators, host).items():
            prints[name] = rng_fingerprint(state)
    return prints


def only_cpu(generators: dict[str, torch.Generator] | None, host: frozenset[str] | set[str]) -> bool:
    """Whether torch's default CPU generator is the only stream :func:`rng_fingerprints` reads
    with these ``generators`` and ``host`` streams: none of them, and no accelerator's state
    exists (a CUDA build of torch on a machine with no GPU in use has none to read)."""
    return not generators and not host and (not _ACCELERATORS or not _initialized_accelerators())


def cpu_fingerprint() -> tuple[str, bytes]:
    """:func:`rng_fingerprint` of torch's default CPU generator's state, without the general
    path: ``get_state()`` gives a contiguous ``uint8`` host tensor of 5,056 bytes, read in place."""
    return "tensor", _host_bytes(_DEFAULT_GENERATOR.get_state())  # (what _state_bytes reads it as)


_DEFAULT_GENERATOR = torch.default_generator


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
            self.states[Subject("RNG instance", name, owner="generator")] = generator.get_state()

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


def instance_kind(value: Any) -> str | None:
    """How findings name an RNG instance's kind (``random.Random``, ``numpy RandomState``,
    ``numpy Generator``, ``numpy BitGenerator``), or None for anything else.  numpy is asked only
    where it is imported already (an instance of its classes cannot exist otherwise)."""
    kind = type(value)  # (its type: ``isinstance`` would ask the value for its ``__class__``)
    if issubclass(kind, random.Random):  # (SystemRandom draws from the OS: no state of its own)
        return None if issubclass(kind, random.SystemRandom) else "random.Random"
    numpy = sys.modules.get("numpy")
    generators = getattr(numpy, "random", None) if numpy is not None else None
    if generators is None:
        return None
    for name_of, name in (("numpy RandomState", "RandomState"), ("numpy Generator", "Generator"),
                          ("numpy BitGenerator", "BitGenerator")):
        cls = getattr(generators, name, None)
        if isinstance(cls, type) and issubclass(kind, cls):
            return name_of
    return None


def instance_state(value: Any, kind: str) -> Any:
    """The state of the RNG instance ``value`` of :func:`instance_kind` ``kind`` (a new object:
    what a later draw changes is not it).  Raises what the instance raises where it has no
    state to read."""
    if kind == "random.Random":
        return value.getstate()
    if kind == "numpy RandomState":
        return value.get_state()
    if kind == "numpy Generator":
        return value.bit_generator.state
    return value.state


def set_instance_state(value: Any, kind: str, state: Any) -> None:
    """Put ``state`` (from :func:`instance_state`) back into the RNG instance ``value``."""
    if kind == "random.Random":
        value.setstate(state)
    elif kind == "numpy RandomState":
        value.set_state(state)
    elif kind == "numpy Generator":
        value.bit_generator.state = state
    else:
        value.state = state


def rng_summary(state: Any) -> str:
    """A short description of an RNG state (a Mersenne Twister position, or a CRC-32)."""
    if isinstance(state, torch.Tensor):
        return f"state digest {zlib.crc32(_state_bytes(state)):08x}"
    if isinstance(state, tuple) and len(state) >= 2 and isinstance(state[1], tuple):
        return f"position {state[1][-1]}"  # Python random: the Mersenne Twister index
    if isinstance(state, tuple) and len(state) >= 3:
        return f"position {state[2]}"  # numpy legacy state
    if isinstance(state, dict):  # numpy's bit generators
        return f"state digest {zlib.crc32(repr(rng_fingerprint(state)).encode()):08x}"
    return show(state)
