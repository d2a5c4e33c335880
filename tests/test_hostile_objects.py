"""Objects whose own code raises when recheck looks into them: every face still runs the program
and verifies what it can; nothing of theirs is raised into the program, and what cannot be
looked into is named.

Real code holds such objects: a strict proxy whose ``__getattribute__`` forwards everything, a
config mapping names in Python, a lazy dict or list whose overridden methods load on access,
an object whose ``__dict__`` is a property.  Observing a value must not run its code: recheck
reads an object's own ``__dict__``, a container's items through the built-in type's methods and
a value's type with ``type()``, and where even that fails it names the value in a note.
"""

from __future__ import annotations

import functools

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import recheck


class Boom(RuntimeError):
    pass


def _raise(*_args, **_kwargs):
    raise Boom("the object's own code raised")


class _Plain:
    def __init__(self) -> None:
        object.__setattr__(self, "scale", 2.0)


class StrictProxy(_Plain):
    """Answers ``__dict__`` and ``__class__`` with an error, everything else as usual."""

    def __getattribute__(self, name):
        if name in ("__dict__", "__class__"):
            _raise()
        return object.__getattribute__(self, name)


class LazyAttributes(_Plain):
    __getattr__ = _raise


class Unhashable(_Plain):
    __eq__ = _raise
    __hash__ = _raise  # type: ignore[assignment]


class NoRepr(_Plain):
    __repr__ = _raise


class NoLength(_Plain):
    __len__ = _raise
    __iter__ = _raise
    __bool__ = _raise


class DictProperty(_Plain):
    __dict__ = property(_raise)  # type: ignore[assignment]


class ClassProperty(_Plain):
    __class__ = property(_raise)  # type: ignore[assignment]


class Slotted:
    __slots__ = ("scale",)

    def __init__(self) -> None:
        object.__setattr__(self, "scale", 2.0)

    def __getattribute__(self, name):
        if name == "scale":
            return object.__getattribute__(self, name)
        _raise()


class LazyDict(dict):
    """A dict whose own methods load on access (and here, fail)."""

    items = keys = values = __iter__ = __len__ = __getitem__ = _raise  # type: ignore[assignment]


class LazyList(list):
    __iter__ = __len__ = __getitem__ = _raise  # type: ignore[assignment]


class _Holder:
    def __init__(self, held) -> None:
        self.held, self.scale = held, 2.0


def _make(kind):
    if kind is LazyDict:
        table = LazyDict()
        dict.__setitem__(table, "scale", 2.0)
        return _Holder(table)
    if kind is LazyList:
        return _Holder(LazyList([1, 2]))
    return kind()


KINDS = [StrictProxy, LazyAttributes, Unhashable, NoRepr, NoLength, DictProperty, ClassProperty, Slotted,
         LazyDict, LazyList]
HELD = None  # a global the region reads


def _scale(value) -> float:
    return object.__getattribute__(value, "scale")


class Layer(nn.Module):
    def __init__(self, held) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.__dict__["held"] = held  # (not through nn.Module.__setattr__, which asks it for its class)

    def forward(self, x):
        return self.fc(x) * _scale(HELD) * _scale(self.held)


@pytest.fixture(params=KINDS, ids=lambda kind: kind.__name__)
def layer(request, monkeypatch):
    monkeypatch.setitem(globals(), "HELD", _make(request.param))
    torch.manual_seed(0)
    return Layer(_make(request.param))


def test_watch_verifies_a_region_that_reaches_them(layer):
    x = torch.randn(2, 4, requires_grad=True)
    with recheck.watch(raise_on_finding=False) as w:
        checkpoint(layer, x, use_reentrant=False).sum().backward()
    assert w.report.stats["verified"] == 1 and not w.report, str(w.report)


def test_check_and_check_step_run_and_name_what_they_cannot_put_back(layer):
    x = torch.randn(2, 4, requires_grad=True)
    report = recheck.check(layer, x)
    assert report.ok, str(report)
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)

    def step():
        optimizer.zero_grad()
        checkpoint(layer, x, use_reentrant=False).sum().backward()
        optimizer.step()

    report = recheck.check_step(step)
    assert report.ok, str(report)
    unreadable = [note for note in report.notes if "cannot be put back" in note]
    # only an object whose attributes cannot be read at all is left as it is, and said so
    assert bool(unreadable) == (type(layer.__dict__["held"]) is DictProperty), report.notes


def test_a_lazy_dict_changed_before_backward_is_still_seen_through_dicts_own_methods():
    table = LazyDict()
    dict.__setitem__(table, "scale", 2.0)

    class Scaled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc, self.table = nn.Linear(4, 4), table

        def forward(self, x):
            return self.fc(x) * dict.__getitem__(self.table, "scale")

    layer, x = Scaled(), torch.randn(2, 4, requires_grad=True)
    with recheck.watch(raise_on_finding=False) as w:
        y = checkpoint(layer, x, use_reentrant=False)
        dict.__setitem__(table, "scale", 3.0)
        y.sum().backward()
    (finding,) = [f for f in w.report if "table" in f.subject]
    assert finding.code == "RC101" and "{'scale': 2.0} -> {'scale': 3.0}" in finding.message, str(w.report)


class BrokenPartial(functools.partial):
    """A partial whose arguments cannot even be listed: the walk cannot look inside at all."""

    args = property(_raise)  # type: ignore[assignment]


SCALE = BrokenPartial(float, 2.0)


def test_a_value_the_walk_cannot_look_into_is_named_by_every_face():
    layer = nn.Linear(4, 4)

    def region(x):
        return layer(x) * SCALE()

    x = torch.randn(2, 4, requires_grad=True)
    with recheck.watch(raise_on_finding=False) as w:
        checkpoint(region, x, use_reentrant=False).sum().backward()
    assert w.report.stats["verified"] == 1
    assert any("could not look into `SCALE`" in note and "Boom" in note for note in w.report.notes), w.report.notes
    report = recheck.check(region, x)
    assert any("`SCALE` cannot be put back: looking into it raised Boom" in note for note in report.notes), report.notes
