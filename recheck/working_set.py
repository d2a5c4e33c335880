"""The working-set lab: a teaching toy about cache capacity, separate from the checker.

An LRU cache of ``capacity`` lines serves a request stream in which request ``i`` reads
address ``(i * stride) mod 16`` of a 16-line memory, so the stream's working set is
``16 / gcd(stride, 16)`` lines.  :meth:`WorkingSetLab.reset` empties the cache and replays
the first 16 requests, so a freshly reset lab already shows 16 requests;
:meth:`WorkingSetLab.step` serves one more request at a time.

When the working set fits (``capacity >= working_set``) every request after the first
pass hits; when it does not, LRU evicts each line just before it is needed again and
nothing hits.  That cliff is the point of the lab.

A step serves at most :data:`MAX_STEPS` requests: the lab prints one line for each and
keeps them until then, and since 16 is a multiple of every working set, the stream after a
reset repeats every ``working_set`` (at most 16) requests; more would show nothing new and
only grow memory without bound (``--steps 100000000`` once ran until the kernel killed it).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from math import gcd

__all__ = ["MAX_STEPS", "MEMORY_LINES", "NOT_MODELLED", "Access", "LabError", "WorkingSetLab"]

MEMORY_LINES = 16
#: The most requests one step serves (the stream repeats every 16 or fewer; see above).
MAX_STEPS = 10_000

NOT_MODELLED = (
    "This lab models only an LRU cache serving a strided request stream. It does not "
    "rematerialize activations, preserve RNG state, trace autograd or represent "
    "saved-tensor lifetimes; recheck's checker and cost report measure those on real code."
)


class LabError(ValueError):
    """A lab setting or command is invalid; the message says which and why."""


def parse_capacity(value: object) -> int:
    number = _parse_int(value, "capacity")
    if number < 1:
        raise LabError(f"capacity must be at least 1 line, got {number}")
    return number


def parse_stride(value: object) -> int:
    number = _parse_int(value, "stride")
    if number < 0:
        raise LabError(f"stride must be 0 or more, got {number}")
    return number


def parse_count(value: object, what: str) -> int:
    number = _parse_int(value, what)
    if number < 0:
        raise LabError(f"{what} must be 0 or more, got {number}")
    return number


def parse_steps(value: object, what: str) -> int:
    """A count of requests to serve: 0 to :data:`MAX_STEPS`."""
    number = parse_count(value, what)
    if number > MAX_STEPS:
        raise LabError(f"{what} must be at most {MAX_STEPS}, got {_shown(number)}: after the reset the request "
                       f"stream repeats every {MEMORY_LINES} requests or fewer, so more steps show nothing new "
                       f"(each is printed and kept until the step ends)")
    return number


def _parse_int(value: object, what: str) -> int:
    if isinstance(value, bool):
        raise LabError(f"{what} must be a whole number, got {value!r}")
    if isinstance(value, int):
        return value
    try:
        return int(str(value).strip(), 10)
    except ValueError:
        raise LabError(f"{what} must be a whole number, got {_shown(str(value))}") from None


def _shown(value: object, limit: int = 40) -> str:
    """``value`` for a message, its middle elided past ``limit`` characters (a 5,000-digit
    argument is not echoed whole)."""
    text = repr(value) if isinstance(value, str) else str(value)
    if len(text) <= limit:
        return text
    length = len(value) if isinstance(value, str) else len(text)
    return f"{text[:limit // 2]}...{text[-limit // 2:]} ({length} characters)"


@dataclass(frozen=True)
class Access:
    """One served request: its index, the address it read and whether it hit."""

    index: int
    address: int
    hit: bool


@dataclass
class WorkingSetLab:
    capacity: int
    stride: int
    requests: int = 0
    hits: int = 0
    cache: OrderedDict = field(default_factory=OrderedDict)  # address -> None, LRU first

    def __post_init__(self) -> None:
        self.capacity = parse_capacity(self.capacity)
        self.stride = parse_stride(self.stride)
        self.reset()

    @property
    def misses(self) -> int:
        return self.requests - self.hits

    @property
    def working_set(self) -> int:
        """Distinct lines the stream touches: ``16 / gcd(stride, 16)``."""
        return MEMORY_LINES // gcd(self.stride, MEMORY_LINES)

    def address(self, index: int) -> int:
        return (index * self.stride) % MEMORY_LINES

    def reset(self) -> list[Access]:
        """Empty the cache and replay the first 16 requests."""
        self.cache.clear()
        self.requests = self.hits = 0
        return self.step(MEMORY_LINES)

    def step(self, count: int = 1) -> list[Access]:
        """Serve ``count`` more requests; return what each did."""
        served = []
        for _ in range(parse_steps(count, "step count")):
            address = self.address(self.requests)
            hit = address in self.cache
            if hit:
                self.cache.move_to_end(address)
                self.hits += 1
            else:
                self.cache[address] = None
                if len(self.cache) > self.capacity:
                    self.cache.popitem(last=False)
            served.append(Access(self.requests, address, hit))
            self.requests += 1
        return served

    def describe_setup(self) -> str:
        fits = "fits" if self.capacity >= self.working_set else "does not fit"
        return (
            f"{MEMORY_LINES}-line memory; request i reads address (i * {self.stride}) mod {MEMORY_LINES}; "
            f"working set {self.working_set} lines (16 / gcd({self.stride}, 16)); "
            f"LRU cache of {self.capacity} lines: the working set {fits}"
        )

    def describe_state(self) -> str:
        content = ", ".join(str(a) for a in self.cache) or "empty"
        return (
            f"cache (least to most recently used): [{content}]\n"
            f"{self.requests} requests, {self.hits} hits, {self.misses} misses"
        )


def describe_accesses(accesses: list[Access]) -> str:
    return "\n".join(
        f"request {a.index} reads address {a.address}: {'hit' if a.hit else 'miss'}" for a in accesses
    )
