"""runtime/reach.py: what a region's code reaches, and the cache that keeps it while it holds."""

from __future__ import annotations

import operator

import torch
from torch import nn

from recheck.runtime.reach import reach_of, static_reach

SCALE = torch.ones(2)


def _region(x):
    return x * SCALE


def test_a_reach_is_kept_while_the_region_reaches_the_same_objects():
    first = reach_of(_region, {})
    assert reach_of(_region, {}) is first
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
    block = nn.Linear(2, 2)
    cached = reach_of(_region, {})
    grown = cached.copy()
    grown.add_module("extra", block)
    grown.tensors["t"] = torch.zeros(1)
    assert id(block) in grown.modules and id(block) not in cached.modules
    assert "t" not in cached.tensors
    assert reach_of(_region, {}) is cached


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


def test_a_reach_dropped_between_blocks_is_revived_without_walking_the_code_again(monkeypatch):
    import gc

    import recheck.runtime.reach as reach_module

    block = _Block()
    first = reach_of(block, {})
    names = {key: name for key, (name, _) in first.modules.items()}
    del first
    gc.collect()
    walks = []
    monkeypatch.setattr(reach_module, "static_reach", lambda *a: walks.append(a) or static_reach(*a))
    again = reach_of(block, {})
    assert walks == []
    assert {key: name for key, (name, _) in again.modules.items()} == names
    assert all(module is dict(block.named_modules())[name] for name, module in again.modules.values())
    assert any(t is SCALE for t in again.tensors.values())
    assert reach_of(block, {}) is again  # alive: the same object


def test_a_partial_whose_call_tensors_died_is_revived_without_them(monkeypatch):
    """transformers checkpoints ``partial(layer.__call__, **kwargs)``: the call's tensors die with the step."""
    import functools
    import gc

    import recheck.runtime.reach as reach_module

    block = _Block()

    def first_reach():
        mask = torch.ones(2)
        return reach_of(functools.partial(block.__call__, mask=mask), {})

    names = {key: name for key, (name, _) in first_reach().modules.items()}
    gc.collect()
    walks = []
    monkeypatch.setattr(reach_module, "static_reach", lambda *a: walks.append(a) or static_reach(*a))
    again = reach_of(functools.partial(block.__call__, mask=torch.zeros(2)), {})
    assert walks == []
    assert {key: name for key, (name, _) in again.modules.items()} == names


def test_a_revived_reach_starts_from_what_was_derived_from_the_first():
    import gc

    block = _Block()
    first = reach_of(block, {})
    first.derived["layer above"] = "worked out"
    del first
    gc.collect()
    assert reach_of(block, {}).derived == {"layer above": "worked out"}
    assert reach_of(_Block(), {}).derived == {}  # another block: its own


def test_a_dormant_reach_revives_objects_without_asking_them_anything():
    import gc

    from recheck.runtime.reach import Reach, _Dormant

    class Touchy:  # a cache whose == raises (a numpy array's is not a bool)
        def __eq__(self, other):
            raise AssertionError("asked for ==")

        __hash__ = object.__hash__

    block, cache, gone = _Block(), Touchy(), Touchy()
    reach = Reach()
    reach.add_module("", block)
    reach.objects.update({"cache": cache, "gone": gone})
    dormant = _Dormant.of(reach)
    assert dormant is not None
    names = dict(reach.modules)
    del reach, gone
    gc.collect()
    revived = dormant.revive()
    assert list(revived.objects) == ["cache"]
    assert revived.objects["cache"] is cache
    assert {key: (name, module) for key, (name, module) in revived.modules.items()} == names


TABLE = {"relu": nn.ReLU, "gelu": (nn.GELU, {"approximate": "tanh"})}


def _tabled(x):
    return x * len(TABLE)


def test_a_reach_holds_while_a_global_table_holds_the_same_objects_two_levels_down():
    reach = static_reach(_tabled, (), {})
    assert reach.still_bound()
    gelu = TABLE["gelu"]
    TABLE["gelu"] = (nn.GELU, gelu[1])  # a new tuple of the same objects: another place
    try:
        assert not reach.still_bound()
    finally:
        TABLE["gelu"] = gelu
    assert reach.still_bound()
    TABLE["relu"] = nn.SiLU  # another object at a place the reach walked
    try:
        assert not reach.still_bound()
    finally:
        TABLE["relu"] = nn.ReLU
    gelu[1]["approximate"] = "none"  # three levels down: not what the reach walks into
    try:
        assert reach.still_bound()
    finally:
        gelu[1]["approximate"] = "tanh"


def _tabled_twice(x):
    return _tabled(x) + len(TABLE)  # the table read here and in the function it calls


def test_a_global_two_functions_of_the_region_read_is_taken_once():
    reach = static_reach(_tabled_twice, (), {})
    assert [name for _, name, _ in reach.bound] == ["TABLE"]
    TABLE["relu"] = nn.SiLU
    try:
        assert not reach.still_bound()
    finally:
        TABLE["relu"] = nn.ReLU
    assert reach.still_bound()


def test_a_block_reads_a_global_its_layers_regions_take_once_and_each_block_reads_it_again():
    from recheck.runtime import reach as reach_module
    from recheck.runtime.reach import ReachCache

    def tabled(layer):  # noqa: ANN001 - one code, a layer each: two reaches that read one table
        return lambda x: layer(x) * len(TABLE)

    regions = [tabled(nn.Linear(2, 2)), tabled(nn.Linear(2, 2))]
    first = ReachCache()
    reaches = [reach_of(region, first) for region in regions]  # walked: nothing read yet
    assert reaches[0] is not reaches[1] and not first.bound
    read = []
    real = reach_module._identities

    def counted(value, depth=2):  # noqa: ANN001, ANN202
        if value is TABLE:
            read.append(value)
        return real(value, depth)

    reach_module._identities = counted
    try:
        second = ReachCache()
        assert [reach_of(region, second) for region in regions] == reaches  # revived: the table read once
        assert len(read) == 1 and list(second.bound) == [(id(globals()), "TABLE")]
        TABLE["relu"] = nn.SiLU  # rebound between blocks: the next block walks anew
        try:
            third = ReachCache()
            assert all(reach_of(region, third) is not old for region, old in zip(regions, reaches))
        finally:
            TABLE["relu"] = nn.ReLU
    finally:
        reach_module._identities = real


def test_what_a_reach_found_while_its_block_ran_is_revived_with_it_in_the_next_block():
    import gc

    from recheck.runtime.reach import put_to_sleep

    block, found = _Block(), nn.ReLU()  # ``found``: a module the region ran that its code does not name
    cache: dict = {}
    first = reach_of(block, cache)
    first.add_module("found", found)
    put_to_sleep(cache)  # the block ends
    names = {key: name for key, (name, _) in first.modules.items()}
    cache.clear()
    del first
    gc.collect()
    again = reach_of(block, {})  # the next block
    assert id(found) in again.modules
    assert {key: name for key, (name, _) in again.modules.items()} == names


def test_a_reach_that_did_not_grow_is_revived_as_it_was_and_memory_stays_flat():
    """Blocks that find nothing new leave the kept reach as it was: each next block revives the
    same modules, and a thousand such blocks take no more memory than the first few."""
    import gc
    import tracemalloc

    from recheck.runtime.reach import put_to_sleep

    block = _Block()
    cache: dict = {}
    first = reach_of(block, cache)
    names = {key: name for key, (name, _) in first.modules.items()}
    put_to_sleep(cache)  # the block ends, its reach did not grow
    del first, cache

    def one_block() -> dict:
        cache: dict = {}
        reach = reach_of(block, cache)
        put_to_sleep(cache)
        return {key: name for key, (name, _) in reach.modules.items()}

    assert one_block() == names  # the next block finds what the first one did
    for _ in range(50):
        one_block()
    gc.collect()
    tracemalloc.start()
    try:
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(1000):
            assert one_block() == names
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 64 * 1024, grown  # whole process: nothing piles up per block


def _segment(blocks: list, start: int, end: int):
    """A region of timm's ``checkpoint_seq``: a closure over the model's blocks and one segment."""

    def forward(x):
        for index in range(start, end):
            x = blocks[index](x)
        return x

    return forward


def test_regions_of_the_same_modules_revive_the_same_pairs_each_in_a_dict_of_its_own():
    """One segment per region, every region reaching every block: a block revives each region's
    reach with the (name, module) pairs made once for all of them, while each reach may grow alone."""
    import gc
    import weakref

    blocks = [_Block(), _Block(), _Block()]
    first, second = reach_of(_segment(blocks, 0, 1), {}), reach_of(_segment(blocks, 1, 3), {})
    names = {key: name for key, (name, _) in first.modules.items()}
    assert {key: name for key, (name, _) in second.modules.items()} == names
    del first, second
    gc.collect()
    cache: dict = {}
    first, second = reach_of(_segment(blocks, 0, 1), cache), reach_of(_segment(blocks, 1, 3), cache)
    assert first is not second and first.modules is not second.modules
    assert {key: name for key, (name, _) in first.modules.items()} == names
    assert all(map(operator.is_, first.modules.values(), second.modules.values()))  # the very same pairs
    first.add_module("found", nn.Linear(1, 1))  # a module found by running the first region only
    assert len(first.modules) == len(second.modules) + 1
    # the next block: made anew once the reaches of this one are gone
    pairs = list(second.modules.values())
    del first, second, cache
    gc.collect()
    again = reach_of(_segment(blocks, 1, 3), {})
    assert {key: name for key, (name, _) in again.modules.items()} == names
    assert not any(map(operator.is_, again.modules.values(), pairs))
    # a block that died is left out, and the pairs keep no module alive
    del again, pairs
    gc.collect()
    gone = weakref.ref(blocks[2])
    blocks[2] = nn.Identity()  # the closure's list now holds another module there
    gc.collect()
    assert gone() is None


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
