"""A check leaves no trace in what a region's modules and arguments hold (issue 40, item 11).

Fixtures in the style of real code: a helper object a module holds and counts in, a class
attribute a module bumps, ``random.Random``, ``numpy.random.RandomState`` and
``numpy.random.Generator`` instances a module draws from, an argument that holds some of them.
After ``check()`` and after ``check_step()`` each is as it was before, and the report still names
what differed between the runs.  What cannot be put back (an iterator's position) is named in the
report's notes.
"""

from __future__ import annotations

import itertools
import random
import re
import warnings
from typing import Any, Callable

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import recheck


class Counter:
    def __init__(self) -> None:
        self.n = 0


class Stats:
    """A tracker holding a helper of its own (two levels below the module)."""

    def __init__(self) -> None:
        self.inner = Counter()
        self.seen: list[int] = []


class CountingBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.counter = Counter()
        self.stats = Stats()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.counter.n += 1
        self.stats.inner.n += 2
        self.stats.seen.append(self.counter.n)
        return self.lin(x)


class BumpingBlock(nn.Module):
    calls = 0

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        type(self).calls += 1
        return self.lin(x)


class BaseBlock(nn.Module):
    registry: dict[str, int] = {}
    total = 0


class InheritedBump(BaseBlock):
    """Bumps a class attribute it inherits: the first bump creates it on the subclass."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        type(self).total += 1
        BaseBlock.registry[f"call{len(BaseBlock.registry)}"] = 1
        return self.lin(x)


class PythonRandomBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.rng = random.Random(0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x * self.rng.random())


class RandomStateBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.rng = np.random.RandomState(0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x * float(self.rng.standard_normal()))


class GeneratorBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.rng = np.random.default_rng(0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x * float(self.rng.standard_normal()))


class TickingBlock(nn.Module):
    """Holds an iterator it advances: its position cannot be read back or put back."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.ticks = itertools.count()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        next(self.ticks)
        return self.lin(x)


def _held(module: nn.Module) -> Any:
    """What each fixture's region changes, read independently of recheck."""
    if isinstance(module, CountingBlock):
        return module.counter.n, module.stats.inner.n, list(module.stats.seen), sorted(vars(module.counter))
    if isinstance(module, BumpingBlock):
        return type(module).calls, sorted(vars(type(module)))
    if isinstance(module, InheritedBump):
        return ("total" in vars(InheritedBump), BaseBlock.total, dict(BaseBlock.registry))
    if isinstance(module, PythonRandomBlock):
        return module.rng.getstate()
    if isinstance(module, RandomStateBlock):
        name, key, pos, has_gauss, gauss = module.rng.get_state()
        return name, key.tobytes(), pos, has_gauss, gauss
    if isinstance(module, GeneratorBlock):
        return repr(module.rng.bit_generator.state)
    raise AssertionError(type(module))


#: fixture class -> (the finding's kind, a pattern its subject matches: the module is ``self`` in a
#: check, ``module`` in a step, the name the step's closure gives it)
CASES: dict[type, tuple[str, str]] = {
    CountingBlock: ("state", r"attribute `(self|module)\.counter`"),
    BumpingBlock: ("state", r"class attribute `BumpingBlock\.calls`"),
    InheritedBump: ("state", r"class attribute `InheritedBump\.total`"),
    PythonRandomBlock: ("rng", r"random\.Random `(self|module)\.rng`"),
    RandomStateBlock: ("rng", r"numpy RandomState `(self|module)\.rng`"),
    GeneratorBlock: ("rng", r"numpy Generator `(self|module)\.rng`"),
}


def _names(report: recheck.Report) -> list[str]:
    return [f"{f.kind}: {f.subject}" for f in report]


def _has(report: recheck.Report, kind: str, subject: str) -> bool:
    return any(f.kind == kind and re.fullmatch(subject, f.subject) for f in report)


def _step_of(module: nn.Module, x: torch.Tensor) -> Callable[[], None]:
    def step() -> None:
        checkpoint(module, x, use_reentrant=False).sum().backward()
    return step


def _check_step(step: Callable[[], Any]) -> recheck.Report:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return recheck.check_step(step)


@pytest.mark.parametrize("options", [{}, {"early_stop": False}, {"use_reentrant": True}],
                         ids=["early-stop", "full", "reentrant"])
@pytest.mark.parametrize("block", list(CASES), ids=lambda c: c.__name__)
def test_check_puts_back_what_the_modules_hold_and_reports_it(block: type, options: dict) -> None:
    torch.manual_seed(0)
    module = block()
    x = torch.randn(2, 4, requires_grad=True)
    before = _held(module)
    report = recheck.check(module, x, **options)
    assert _held(module) == before
    kind, subject = CASES[block]
    assert _has(report, kind, subject), _names(report)
    assert not any("cannot be put back" in note for note in report.notes), report.notes


@pytest.mark.parametrize("block", list(CASES), ids=lambda c: c.__name__)
def test_check_step_puts_back_what_the_modules_hold_and_reports_it(block: type) -> None:
    torch.manual_seed(0)
    module = block()
    x = torch.randn(2, 4, requires_grad=True)
    before = _held(module)
    report = _check_step(_step_of(module, x))
    assert _held(module) == before
    kind, subject = CASES[block]
    assert _has(report, kind, subject), _names(report)
    assert not any("cannot be put back" in note for note in report.notes), report.notes


class Tracker:
    """An argument holding a helper and an RNG of its own."""

    def __init__(self) -> None:
        self.stats = Stats()
        self.rng = random.Random(1)
        self.rs = np.random.RandomState(1)


def _tracked(tracker: Tracker) -> Any:
    return (tracker.stats.inner.n, list(tracker.stats.seen), tracker.rng.getstate(),
            tracker.rs.get_state()[2], tracker.rs.get_state()[1].tobytes())


def test_check_puts_back_what_an_argument_holds() -> None:
    lin = nn.Linear(4, 4)

    def region(x: torch.Tensor, tracker: Tracker) -> torch.Tensor:
        tracker.stats.inner.n += 1
        tracker.stats.seen.append(1)
        return lin(x * tracker.rng.random() * float(tracker.rs.uniform()))

    tracker = Tracker()
    x = torch.randn(2, 4, requires_grad=True)
    before = _tracked(tracker)
    report = recheck.check(region, x, tracker)
    assert _tracked(tracker) == before
    assert _has(report, "rng", r"random\.Random `args\[1\]\.rng`"), _names(report)
    assert _has(report, "rng", r"numpy RandomState `args\[1\]\.rs`"), _names(report)


def test_check_step_puts_back_what_a_closure_holds() -> None:
    lin = nn.Linear(4, 4)
    tracker = Tracker()
    x = torch.randn(2, 4, requires_grad=True)

    def region(x: torch.Tensor) -> torch.Tensor:
        tracker.stats.inner.n += 1
        tracker.stats.seen.append(1)
        return lin(x * tracker.rng.random() * float(tracker.rs.uniform()))

    def step() -> None:
        checkpoint(region, x, use_reentrant=False).sum().backward()

    before = _tracked(tracker)
    report = _check_step(step)
    assert _tracked(tracker) == before
    assert _has(report, "rng", r"random\.Random `tracker\.rng`"), _names(report)


@pytest.mark.parametrize("face", ["check", "check_step"])
def test_what_cannot_be_put_back_is_named_in_the_report(face: str) -> None:
    module = TickingBlock()
    x = torch.randn(2, 4, requires_grad=True)
    report = recheck.check(module, x) if face == "check" else _check_step(_step_of(module, x))
    named = [note for note in report.notes if "cannot be put back" in note]
    assert len(named) == 1, report.notes
    assert re.search(r"`(self|module)\.ticks`", named[0]) and "itertools.count" in named[0], named


class Slotted:
    """A helper with ``__slots__`` that refuses attribute writes from outside its own methods."""

    __slots__ = ("n", "__hidden")

    def __init__(self) -> None:
        object.__setattr__(self, "n", 0)
        object.__setattr__(self, "_Slotted__hidden", [])

    def bump(self) -> None:
        object.__setattr__(self, "n", self.n + 1)
        self.__hidden.append(self.n)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("read-only")


class SlottedBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.slotted = Slotted()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.slotted.bump()
        return self.lin(x)


@pytest.mark.parametrize("face", ["check", "check_step"])
def test_a_slotted_helper_is_put_back_through_its_slots(face: str) -> None:
    module = SlottedBlock()
    x = torch.randn(2, 4, requires_grad=True)
    report = recheck.check(module, x) if face == "check" else _check_step(_step_of(module, x))
    assert (module.slotted.n, module.slotted._Slotted__hidden) == (0, [])
    assert _has(report, "state", r"attribute `(self|module)\.slotted\.n`"), _names(report)
    assert not report.notes or not any("cannot be put back" in note for note in report.notes), report.notes


class StuckRandom(random.Random):
    """An RNG whose state can be read and not written back."""

    def setstate(self, state: Any) -> None:
        raise RuntimeError("this generator's state is read-only")


class StuckBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.rng = StuckRandom(0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x * self.rng.random())


@pytest.mark.parametrize("face", ["check", "check_step"])
def test_a_restore_that_fails_is_named_not_raised(face: str) -> None:
    module = StuckBlock()
    x = torch.randn(2, 4, requires_grad=True)
    report = recheck.check(module, x) if face == "check" else _check_step(_step_of(module, x))
    named = [note for note in report.notes if "cannot be put back" in note]
    assert len(named) == 1 and re.search(r"random\.Random `(self|module)\.rng`", named[0]), report.notes
    assert "read-only" in named[0]
