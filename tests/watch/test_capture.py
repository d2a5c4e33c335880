"""watcher/capture.py: the layouts cached per reach follow every change of the modules they describe."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from recheck.runtime.reach import GlobalRef, Reach
from recheck.watcher.capture import module_state, parameter_versions


def _reach(model: nn.Module) -> Reach:
    reach = Reach()
    reach.add_module("", model)
    return reach


def _versions(reach: Reach) -> dict[str, int]:
    return {key[1]: version for key, version in parameter_versions(reach).items()}


def test_parameter_versions_follow_a_parameter_registered_replaced_or_bumped_later():
    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    reach = _reach(model)
    assert set(_versions(reach)) == {"0.weight", "0.bias"}
    model[1].register_parameter("slope", nn.Parameter(torch.ones(1)))  # an empty dict fills
    assert set(_versions(reach)) == {"0.weight", "0.bias", "1.slope"}
    with torch.no_grad():
        model[0].weight.add_(1)
    assert _versions(reach)["0.weight"] == model[0].weight._version
    model[0].bias = nn.Parameter(torch.zeros(2))  # the same name, another tensor
    assert _versions(reach)["0.bias"] == model[0].bias._version
    model[0].bias = None
    assert "0.bias" not in _versions(reach)
    del model[0]._parameters["bias"]
    model[0].register_parameter("gain", nn.Parameter(torch.ones(2)))  # as many names as before
    assert set(_versions(reach)) == {"0.weight", "0.gain", "1.slope"}


def test_moved_parameters_in_the_same_layout_and_in_a_grown_one():
    model = nn.Sequential(nn.Linear(2, 2))
    reach = _reach(model)
    before, then = parameter_versions(reach), model[0].bias._version
    assert before.moved(parameter_versions(reach)) == []
    with torch.no_grad():
        model[0].bias.add_(1)
    now = parameter_versions(reach)
    assert now.layout is before.layout
    assert before.moved(now) == [("0.bias", then, then + 1)]
    model.append(nn.Linear(2, 2))  # a module found later: the reach's layout grows
    reach.add_module("1", model[1])
    grown = parameter_versions(reach)
    assert grown.layout is not before.layout
    assert before.moved(grown) == [("0.bias", then, then + 1)]  # names in both only: the new ones have no "then"
    model[0].bias = None  # a slot emptied: nothing to compare it with
    assert before.moved(parameter_versions(reach)) == []


def test_module_state_follows_a_buffer_rebound():
    model = nn.BatchNorm1d(2)
    reach = _reach(model)
    pairs = tuple(reach.modules.values())
    key = next(k for k in module_state(pairs, "digest", reach=reach) if "running_mean" in k[1])
    before = module_state(pairs, "digest", reach=reach)[key]
    model.running_mean = torch.ones(2)  # another tensor in the same slot
    assert not before.same(module_state(pairs, "digest", reach=reach)[key])


def test_a_buffer_name_replaced_by_another_is_seen_by_every_reading():
    model = nn.BatchNorm1d(2)
    reach = _reach(model)
    pairs = tuple(reach.modules.values())

    def buffers() -> set[str]:
        return {k[1] for k in module_state(pairs, "digest", reach=reach) if k[0] == "buffer"}

    assert len(buffers()) == 3
    del model._buffers["num_batches_tracked"]
    model.register_buffer("calls", torch.zeros(1))  # as many buffers as before, another name
    assert [b for b in buffers() if "calls" in b] and not [b for b in buffers() if "num_batches" in b]


def test_module_state_with_a_reach_sees_attributes_that_appear_change_and_go():
    model = nn.Linear(2, 2)
    reach = _reach(model)
    pairs = tuple(reach.modules.values())

    def attributes() -> dict[str, object]:
        return {k[1]: v[1] for k, v in module_state(pairs, "digest", reach=reach).items() if k[0] == "attribute"}

    assert attributes()["attribute `self.in_features`"] == 2
    model.calls = 1
    assert attributes()["attribute `self.calls`"] == 1
    model.calls = 2
    assert attributes()["attribute `self.calls`"] == 2
    del model.calls
    model.other = 3  # as many names as before, another one
    state = attributes()
    assert "attribute `self.calls`" not in state and state["attribute `self.other`"] == 3


def test_module_state_tells_a_bool_from_an_int_and_reads_floats_by_bits():
    model = nn.Linear(2, 2)
    reach = _reach(model)
    pairs = tuple(reach.modules.values())
    key = ("attribute", "attribute `self.flag`")
    model.flag = True
    first = module_state(pairs, "digest", reach=reach)[key]
    model.flag = 1
    assert module_state(pairs, "digest", reach=reach)[key][0] != first[0]
    model.flag = 0.0
    zero = module_state(pairs, "digest", reach=reach)[key]
    model.flag = -0.0
    assert module_state(pairs, "digest", reach=reach)[key][0] != zero[0]



def test_module_state_reads_a_tuple_of_ints_as_it_is_and_any_other_tuple_item_by_item():
    model = nn.Conv2d(1, 1, 3)
    reach = _reach(model)
    pairs = tuple(reach.modules.values())
    key = ("attribute", "attribute `self.stride`")

    def stride() -> object:
        return module_state(pairs, "digest", reach=reach)[key][0]

    first = stride()
    assert stride() == first
    model.stride = (1, 1)  # another tuple, the same ints
    assert stride() == first
    model.stride = (1, 2)
    assert stride() != first
    model.stride = (1, 1.0)  # equal to (1, 1) by value, not by bits
    assert stride() != first
    model.stride = ("tuple", (1, 1))  # shaped like the print of (1, 1): still told apart
    assert stride() != first
    held = [1]
    model.stride = (1, held)  # a tuple holding a list: printed at every read, never taken again
    grown = stride()
    held.append(2)
    assert stride() != grown
    model.stride = same = (1, 1)
    assert stride() == first and stride() is stride()  # the same tuple: its entry taken again
    model.stride = (1, held)
    assert stride() != first
    model.stride = same
    assert stride() == first


def test_a_layout_grows_with_the_modules_a_forward_finds():
    model = nn.Sequential(nn.Linear(2, 2))
    reach = _reach(model)
    assert set(_versions(reach)) == {"0.weight", "0.bias"}
    found = nn.BatchNorm1d(2)  # a module that ran without being reachable statically
    reach.add_module("found", found)
    assert list(_versions(reach)) == ["0.weight", "0.bias", "found.weight", "found.bias"]  # in layout order
    found.weight = None  # a parameter slot left empty is not a parameter
    assert set(_versions(reach)) == {"0.weight", "0.bias", "found.bias"}


def test_subtrees_are_walked_as_module_modules_walks_them():
    from recheck.watcher.capture import _preorder

    shared = nn.Linear(1, 1)
    model = nn.Sequential(nn.Sequential(shared, nn.ReLU()), shared, nn.ModuleList([nn.Tanh(), shared]))
    model.add_module("empty", None)
    assert [id(m) for m in _preorder([model], {})] == [id(m) for m in model.modules()]
    # root after root, a subtree already walked left out: as buffer_versions walks a forward
    walked = {id(shared): None}
    assert [id(m) for m in _preorder([model[0], model], walked)] == [
        id(m) for m in (model[0], model[0][1], model, model[2], model[2][0])]


def _names(model: nn.Module, modules: list[nn.Module]) -> list[str]:
    names = {id(m): n for n, m in model.named_modules(remove_duplicate=False)}
    return [names[id(m)] for m in modules]


def test_a_kept_subtree_is_walked_again_when_a_child_is_added_replaced_or_removed():
    from recheck.watcher.capture import _preorder, _walk, with_submodules

    model = nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.ReLU(), nn.Tanh()))
    reach = _reach(model)
    expected = [m for m in model.modules()]
    assert _preorder([model], {}) == expected
    assert _preorder([model], {}) == expected  # kept
    model[1].append(nn.Sigmoid())  # a grandchild added
    assert _names(model, _preorder([model], {})) == ["", "0", "1", "1.0", "1.1", "1.2"]
    model[1][0] = nn.GELU()  # replaced by another module
    assert _preorder([model], {})[3] is model[1][0]
    model[1]._modules["1"] = None  # removed, its slot left empty
    assert _names(model, _preorder([model], {})) == ["", "0", "1", "1.0", "1.2"]
    # the same answer as a walk, also past modules already walked
    walked = {id(model[1]): None}
    assert _preorder([model], dict(walked)) == _walk([model], dict(walked))
    assert [m for _, m in with_submodules(reach, [model])] == _preorder([model], {})


def test_a_shared_submodule_is_walked_once():
    from recheck.watcher.capture import _preorder

    shared = nn.Linear(2, 2)
    model = nn.ModuleDict({"a": nn.Sequential(shared), "b": nn.Sequential(shared)})
    walked: dict[int, None] = {}
    first = _preorder([model["a"]], walked)
    second = _preorder([model["b"]], walked)
    assert first == [model["a"], shared] and second == [model["b"]]
    assert _preorder([model], {}) == list(model.modules())


def test_equal_states_whose_values_compare_badly_are_compared_one_by_one():
    import numpy

    from recheck.watcher.records import _all_equal

    before = {("attribute", "self.items"): (("list", 1, ("x",)), [numpy.zeros(3)])}
    after = {("attribute", "self.items"): (("list", 1, ("x",)), [numpy.zeros(3)])}
    assert _all_equal(before, before)
    assert not _all_equal(before, after)  # numpy's == is not a bool: the slow comparison decides
    assert not _all_equal(before, {})


def test_a_kept_subtree_keeps_no_module_alive():
    import gc
    import weakref

    from recheck.watcher import capture

    model = nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.ReLU()))
    assert capture._preorder([model], {}) == list(model.modules())
    gone = [weakref.ref(m) for m in model.modules()]
    del model
    gc.collect()
    assert all(ref() is None for ref in gone)
    # a new module that happens to get a dead root's id is walked as itself
    for _ in range(50):
        other = nn.Sequential(nn.Tanh())
        assert capture._preorder([other], {}) == list(other.modules())


def test_a_kept_layout_reads_the_dicts_as_they_are_and_keeps_no_module_alive():
    import gc
    import weakref

    from recheck.runtime.reach import reach_of

    class Layer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = nn.BatchNorm1d(2)
            self.lin = nn.Linear(2, 2)

        def forward(self, x):
            return self.lin(self.norm(x))

    layer = Layer()

    def read(reach):
        pairs = tuple(reach.modules.values())
        return parameter_versions(reach).layout, module_state(pairs, "digest", reach=reach)

    again = reach_of(layer, {})
    layout, state = read(again)
    layout_again, state_again = read(again)
    assert state_again.keys() == state.keys()
    # read against the dicts as they are: a buffer rebound is seen through a kept layout
    layer.norm.running_mean = torch.ones(2)
    key = next(k for k in state if "running_mean" in k[1])
    assert not state[key].same(module_state(tuple(again.modules.values()), "digest", reach=again)[key])
    gone = weakref.ref(layer)
    del layer, again, layout, layout_again
    gc.collect()
    assert gone() is None


def test_module_state_is_the_same_only_while_every_slot_holds_the_same_object_or_an_equal_print():
    model = nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.25))
    reach = _reach(model)
    pairs = tuple(reach.modules.values())

    def state():
        return module_state(pairs, "digest", reach=reach)

    first = state()
    assert first.same(state()) and first == state() and dict(first) == dict(state())
    model[1].p = 0.25 * 1.0  # an equal float, another object: compared by its print, still the same
    assert dict(first) == dict(state())
    model[1].p = -0.0
    zero = state()
    model[1].p = 0.0  # equal by ==, another sign bit
    assert not zero.same(state()) and dict(zero) != dict(state())
    model[1].calls = [1]
    listed = state()
    model[1].calls.append(2)  # the same list, grown in place: its printed entry differs
    assert not listed.same(state())
    assert listed[("attribute", "attribute `1.calls`")][1] == [1]  # the value as it was read
    model[1].calls = (1, 2)  # a slot that held a list holds a tuple now
    assert not listed.same(state())


def test_module_state_keeps_no_buffer_tensor_and_reads_as_a_mapping():
    model = nn.BatchNorm1d(2)
    reach = _reach(model)
    pairs = tuple(reach.modules.values())
    state = module_state(pairs, "digest", reach=reach)
    assert not any(isinstance(value, torch.Tensor) for value in state.raw)
    keys = {key for key in state if key[0] == "buffer"}
    assert keys == {("buffer", f"buffer `{name}`") for name in ("running_mean", "running_var", "num_batches_tracked")}
    assert len(state) == len(dict(state)) and set(state.keys()) == set(dict(state))
    with torch.no_grad():
        model.running_mean.add_(1)  # in place: the same tensor, other bytes
    assert not state.same(module_state(pairs, "digest", reach=reach))


def test_the_versions_of_a_scope_are_compared_with_the_whole_reach_by_name():
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2), nn.Linear(2, 2))
    reach = _reach(model)
    before = parameter_versions(reach)
    scope = (reach.modules[id(model[1])],)  # ("1", model[1])
    now = parameter_versions(reach, scope)
    assert [key[1] for key, _ in now.items()] == ["1.weight", "1.bias"]
    assert before.moved(now) == []
    with torch.no_grad():
        model[0].weight.add_(1)  # outside the scope: none of its business
        model[1].bias.add_(1)
    then = before.versions[list(before.layout.keys).index(("param_version", "1.bias"))]
    assert before.moved(parameter_versions(reach, scope)) == [("1.bias", then, then + 1)]
    model[1].extra = nn.Parameter(torch.ones(1))  # a slot the forward's layout lacks: not compared
    assert before.moved(parameter_versions(reach, scope)) == [("1.bias", then, then + 1)]
    assert parameter_versions(reach, ()).items() == [] and before.moved(parameter_versions(reach, ())) == []


def test_the_own_attributes_of_a_module_named_directly_are_slots_of_the_same_layout():
    ran = nn.Linear(2, 2)
    owner = nn.Sequential(nn.BatchNorm1d(2))  # named by the callable, its forward not run
    owner.calls = 0
    reach = Reach()
    reach.add_module("ran", ran)
    reach.add_module("owner", owner)
    pairs, own = (reach.modules[id(ran)],), (reach.modules[id(owner)],)

    def state():
        return module_state(pairs, "digest", reach=reach, attributes_of=own)

    first = state()
    assert ("attribute", "attribute `owner.calls`") in first
    assert not any(key[0] == "buffer" for key in first)  # its own attributes only, not its child's buffers
    assert first.same(state()) and first.flat is state().flat
    owner.calls += 1
    assert not first.same(state())
    assert dict(state())[("attribute", "attribute `owner.calls`")] == (1, 1)
    owner.label = "new"  # a name that appears
    assert ("attribute", "attribute `owner.label`") in state()


_CHANGES = ("float", "same float", "int", "flag", "list grown", "tuple", "buffer in place", "buffer rebound",
            "buffer none", "attribute added", "attribute removed", "global written")


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(_CHANGES), max_size=4), st.lists(st.sampled_from(_CHANGES), max_size=4))
def test_the_entries_two_states_may_differ_by_are_the_entries_that_differ(first, second):
    """``ModuleState.differing`` leaves out only entries that are equal: after any changes, every
    key whose entry differs, appeared or went is in its dicts, with the entries :meth:`entries`
    gives, in the same order, whether the two states have one layout or two; ``same`` never
    calls two states equal whose entries differ."""
    model = nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.25), nn.BatchNorm1d(2))
    model[1].calls = [1]
    reach = _reach(model)
    pairs = tuple(reach.modules.values())
    namespace = {"total": 0}
    written = [GlobalRef(namespace, "tests", "total")]

    def change(what: str) -> None:
        dropout, norm = model[1], model[2]
        if what == "float":
            dropout.p = dropout.p + 0.125
        elif what == "same float":
            dropout.p = dropout.p * 1.0
        elif what == "int":
            model[0].in_features += 1
        elif what == "flag":
            dropout.inplace = not dropout.inplace
        elif what == "list grown":  # in place (a tuple is rebound to a list)
            if type(dropout.calls) is list:
                dropout.calls.append(2)
            else:
                dropout.calls = [*dropout.calls, 2]
        elif what == "tuple":
            dropout.calls = (1, 2)
        elif what == "buffer in place":
            with torch.no_grad():
                norm.running_var.add_(1)
        elif what == "buffer rebound":
            norm.running_var = norm.running_var.clone()
        elif what == "buffer none":
            norm.running_mean = None
        elif what == "attribute added":
            dropout.extra = 3
        elif what == "attribute removed":
            dropout.__dict__.pop("extra", None)
        else:
            namespace["total"] += 1

    def state():
        return module_state(pairs, "digest", written, reach=reach)

    for what in first:
        change(what)
    before = state()
    for what in second:
        change(what)
    after = state()
    differing = before.differing(after)  # of one layout, or two (an attribute added or removed)
    assert differing is not None
    mine, theirs = differing
    full_before, full_after = before.entries(), after.entries()
    assert mine == {key: full_before[key] for key in mine} and theirs == {key: full_after[key] for key in theirs}
    assert list(mine) == [key for key in full_before if key in mine]
    assert list(theirs) == [key for key in full_after if key in theirs]
    for key in full_before.keys() | full_after.keys():
        then, now = full_before.get(key), full_after.get(key)
        if then is None or now is None or (then[0] != now[0] if type(then) is tuple else not then.same(now)):
            assert key in (mine if then is not None else theirs) and key in (theirs if now is not None else mine)
    assert not before.same(after) or full_before == full_after  # (False: compared one by one)


class _Held:
    """A plain object of a user's class, as a config or registry a layer holds."""


class _Hostile:
    """A value whose ``repr`` and attribute lookups raise: a finding must still be worded."""

    def __repr__(self) -> str:
        raise RuntimeError("no repr")

    def __getattr__(self, name: str):
        raise RuntimeError("no attributes")


_PLAIN = st.one_of(st.integers(), st.floats(allow_nan=True), st.text(max_size=5), st.none(), st.booleans())
_VALUES = st.recursive(
    st.one_of(_PLAIN, st.builds(lambda n: torch.zeros(n), st.integers(0, 3)), st.builds(_Hostile)),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.tuples(inner, inner),
                            st.dictionaries(st.one_of(st.text(max_size=3), st.integers(-2, 2)), inner, max_size=4)),
    max_leaves=8)


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(st.sampled_from("abcd"), _VALUES, max_size=4), st.data())
def test_an_object_changed_in_place_is_worded_by_the_fields_whose_prints_differ(fields, data):
    """``shown_change`` on any object changed in place never raises, names only fields whose
    shallow prints differ, and names each of them (the ones shown and the count of the rest)."""
    from recheck.runtime.fingerprints import shallow
    from recheck.watcher.capture import _changed_fields, shown_change

    held = _Held()
    held.__dict__.update(fields)
    then = (shallow(held), held)
    for name in data.draw(st.lists(st.sampled_from("abcde"), max_size=3)):
        value = held.__dict__.get(name)
        how = data.draw(st.sampled_from(("set", "delete", "append", "put", "bump")))
        if how == "set":
            held.__dict__[name] = data.draw(_VALUES)
        elif how == "delete":
            held.__dict__.pop(name, None)
        elif how == "append" and isinstance(value, list):
            value.append(data.draw(_VALUES))
        elif how == "put" and isinstance(value, dict):
            value[data.draw(st.text(max_size=3))] = data.draw(_VALUES)
        elif how == "bump" and isinstance(value, torch.Tensor):
            value.add_(1)
    now = (shallow(held), held)
    was_text, now_text = shown_change(then, now)
    assert isinstance(was_text, str) and isinstance(now_text, str)
    old, new = dict(then[0][2]), dict(now[0][2])
    differing = [key for key in dict.fromkeys([*old, *new]) if old.get(key, "<gone>") != new.get(key, "<gone>")]
    assert [key for key, *_ in _changed_fields(then, now)] == differing
