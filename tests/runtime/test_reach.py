"""runtime/reach.py: what a region's code reaches, and the cache that keeps it while it holds."""

from __future__ import annotations

import random

import numpy as np
import torch
from torch import nn

from recheck.runtime.reach import reach_of, static_reach

SCALE = torch.ones(2)


def _region(x):
    return x * SCALE


def test_a_reach_is_found_once_a_block_while_the_region_reaches_the_same_objects():
    cache: dict = {}  # a block's
    first = reach_of(_region, cache)
    assert reach_of(_region, cache) is first
    assert any(t is SCALE for t in first.tensors.values())


def test_a_global_rebound_makes_a_new_reach():
    global SCALE
    first = reach_of(_region, {})
    old, SCALE = SCALE, torch.zeros(2)
    try:
        second = reach_of(_region, {})
        assert second is not first and any(t is SCALE for t in second.tensors.values())
    finally:
        SCALE = old


def test_a_copy_grows_without_changing_the_cached_reach():
    block, cache = nn.Linear(2, 2), {}
    cached = reach_of(_region, cache)
    grown = cached.copy()
    grown.add_module("extra", block)
    grown.tensors["t"] = torch.zeros(1)
    assert id(block) in grown.modules and id(block) not in cached.modules
    assert "t" not in cached.tensors
    assert reach_of(_region, cache) is cached


def test_check_steps_twin_leaves_the_cached_reach_as_it_was():
    from recheck.checker.twin import Twin

    model = nn.Linear(2, 2)

    def step():
        model(torch.ones(1, 2)).sum().backward()

    before = dict(reach_of(step, {}).modules)
    Twin(step, modules=[nn.Linear(2, 2)])  # a module found only by discovery is added to its copy
    assert reach_of(step, {}).modules == before
    assert set(static_reach(step, (), {}).modules) == set(before)


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(2, 2)

    def forward(self, x):
        return self.lin(x) * SCALE


def test_the_kept_reach_keeps_no_module_alive():
    import gc
    import weakref

    block = _Block()
    reach_of(block, {})
    gone = weakref.ref(block)
    del block
    gc.collect()
    assert gone() is None


def test_a_watch_block_keeps_no_model_alive_after_it_ends_however_many_blocks_ran():
    """The reaches, layouts and prints a block keeps go with it: models watched in earlier blocks
    are freed as soon as their user drops them (a test suite watches each test in a block)."""
    import gc
    import weakref

    import recheck
    from torch.utils.checkpoint import checkpoint

    refs = []
    for _ in range(20):
        model = _Block()
        with recheck.watch(raise_on_finding=False):
            checkpoint(model, torch.ones(1, 2, requires_grad=True), use_reentrant=False).sum().backward()
        refs.append(weakref.ref(model))
        del model
    gc.collect()
    assert [ref() for ref in refs] == [None] * 20


def _segment(blocks: list, start: int, end: int):
    """A region of timm's ``checkpoint_seq``: a closure over the model's blocks and one segment."""

    def forward(x):
        for index in range(start, end):
            x = blocks[index](x)
        return x

    return forward


def test_cell_values_leave_out_an_empty_cell_and_keep_the_order():
    from recheck.runtime.reach import cell_values

    block = _Block()

    def outer(fill: bool):
        def region(x):
            return first(x), later, scale  # ``later`` is an empty cell unless outer assigned it

        first, scale = block, 2.0
        if fill:
            later = 1
        return region

    region = outer(False)
    names = region.__code__.co_freevars
    assert names == ("first", "later", "scale")
    assert cell_values(region) == [block, 2.0]  # first and scale; later is empty
    assert cell_values(outer(True)) == [block, 1, 2.0]
    blocks = [block]
    segment = _segment(blocks, 0, 1)
    assert cell_values(segment) == [cell.cell_contents for cell in segment.__closure__]  # all filled: as they are
    assert cell_values(len) == [] and cell_values(block) == [] and cell_values(lambda: 1) == []
    assert reach_of(region, {}).modules  # a region with an empty cell is reached all the same


def _noisy(x):
    return x * random.random()


class _NoisyBlock(nn.Module):
    def forward(self, x):
        return _helper_of_noisy(x)


def _helper_of_noisy(x):
    return x * float(np.random.rand())


def test_the_host_streams_named_by_code_walked_after_the_first_question_are_found_too():
    """Which of Python's and numpy's global streams a region reaches follows every function walked,
    one helper deep into the code it names, whenever it is asked: after its module grew too."""
    reach = static_reach(_noisy, (), {})
    assert reach.host_rng == {"Python random"}
    reach.add_module("block", _NoisyBlock())  # (a module found by running the region)
    assert reach.host_rng == {"Python random", "numpy global RNG"}
    assert reach.copy().host_rng == reach.host_rng
    assert static_reach(_region, (), {}).host_rng == set()
