"""The one walk over nested values: paths, limits, rebuilding."""

from __future__ import annotations

import collections
import dataclasses

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from recheck.runtime.trees import MAX_DEPTH, input_tensors, leaves, map_tensors, tensors

Pair = collections.namedtuple("Pair", "a b")


@dataclasses.dataclass
class Out:
    loss: torch.Tensor
    logits: tuple


def test_one_path_syntax_for_every_container():
    t = torch.zeros(1)
    value = {"h": Pair(t, [t, ()]), "out": Out(t, (t,))}
    assert [p for p, _ in leaves(value)] == [
        "output['h'].a", "output['h'].b[0]", "output['h'].b[1]", "output['out'].loss", "output['out'].logits[0]"]


def test_inputs_are_named_by_argument():
    x, m = torch.zeros(2), torch.ones(2)
    assert [p for p, _ in input_tensors((x, [x]), {"mask": m})] == ["args[0]", "args[1][0]", "kwargs['mask']"]


def test_walking_stops_at_the_depth_limit():
    deep: object = torch.zeros(1)
    for _ in range(MAX_DEPTH + 2):
        deep = [deep]
    (path, leaf), = leaves(deep)
    assert isinstance(leaf, list) and path.count("[") == MAX_DEPTH


def test_map_tensors_rebuilds_tuples_lists_namedtuples_and_dicts():
    t = torch.zeros(1)
    value = (Pair(t, [t]), collections.OrderedDict(k=t))
    seen = []
    rebuilt = map_tensors(lambda path, x: (seen.append(path), x + 1)[1], value, "args")
    assert isinstance(rebuilt[0], Pair) and isinstance(rebuilt[1], collections.OrderedDict)
    assert seen == ["args[0].a", "args[0].b[0]", "args[1]['k']"]
    assert all(x.item() == 1 for _, x in tensors(rebuilt, "args"))


_trees = st.recursive(
    st.one_of(st.integers(), st.text(max_size=3), st.builds(lambda n: torch.zeros(n), st.integers(0, 3))),
    lambda children: st.one_of(st.lists(children, max_size=4), st.tuples(children, children),
                               st.dictionaries(st.text(max_size=2), children, max_size=3)),
    max_leaves=12)


@settings(max_examples=150, deadline=None)
@given(_trees)
def test_every_tensor_is_found_once_under_a_unique_path(value):
    found = tensors(value, "output")
    paths = [p for p, _ in leaves(value)]
    assert len(paths) == len(set(paths))
    rebuilt = map_tensors(lambda path, x: x, value, "output")
    assert [p for p, _ in tensors(rebuilt, "output")] == [p for p, _ in found]


_ITEMS = st.one_of(st.none(), st.integers(), st.floats(allow_nan=False), st.text(max_size=3), st.booleans(),
                   st.builds(lambda n: torch.zeros(n), st.integers(0, 2)),
                   st.lists(st.builds(lambda: torch.ones(1)), max_size=2),
                   st.dictionaries(st.sampled_from("ab"), st.builds(lambda: torch.ones(1)), max_size=2),
                   st.builds(lambda: Pair(torch.ones(1), 3)))


@settings(max_examples=200, deadline=None)
@given(st.lists(_ITEMS, max_size=6), st.booleans())
def test_the_shortcut_for_flat_arguments_finds_what_the_walk_finds(items, as_kwargs):
    # a tuple of tensors and scalars is read without the walk; anything nested takes the walk
    value = tuple(items)
    walked = [(path, leaf) for path, leaf in leaves(value, "args") if isinstance(leaf, torch.Tensor)]
    found = tensors(value, "args")
    assert [p for p, _ in found] == [p for p, _ in walked]
    assert all(a is b for (_, a), (_, b) in zip(found, walked))
    kwargs = {f"k{i}": item for i, item in enumerate(items)} if as_kwargs else {}
    assert [p for p, _ in input_tensors(value, kwargs)] == [p for p, _ in walked] + [
        p for p, leaf in leaves(kwargs, "kwargs") if isinstance(leaf, torch.Tensor)]
