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


def test_collect_first_leaves_no_old_garbage_for_the_block(collector_on):
    class Node:
        pass

    for _ in range(100):  # cycles only the collector frees
        a, b = Node(), Node()
        a.other, b.other = b, a
    del a, b
    with collector_paused(collect_first=True):
        assert gc.collect() == 0  # the block has nothing left over from before it
