"""recheck.collector: the cyclic collector off inside the block, as it was after it."""

from __future__ import annotations

import gc

import pytest

from recheck.collector import collector_paused


@pytest.fixture
def collector_on():
    was = gc.isenabled()
    gc.enable()
    yield
    (gc.enable if was else gc.disable)()


def test_off_inside_and_on_again_after(collector_on):
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_on_again_after_a_raise(collector_on):
    with pytest.raises(KeyError), collector_paused():
        raise KeyError("x")
    assert gc.isenabled()


def test_a_collector_turned_off_by_the_caller_stays_off(collector_on):
    gc.disable()
    with collector_paused():
        pass
    assert not gc.isenabled()


def test_collect_first_collects_before_the_collector_goes_off(collector_on, monkeypatch):
    seen = []
    real = gc.collect
    monkeypatch.setattr(gc, "collect", lambda *a: seen.append(gc.isenabled()) or real(*a))
    with collector_paused(collect_first=True):
        assert seen == [True]  # collected once, while the collector was still on
    with collector_paused():
        assert seen == [True]  # not asked: not collected
