"""``runtime.steps``: a restored training loop is, printed, the loop as it was (check_step compares it)."""

from __future__ import annotations

import torch

import recheck
from recheck.runtime.steps import discover_state

torch.manual_seed(0)
MODEL = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.Linear(8, 2))
#: a module-global optimizer, as training scripts write it: check_step reaches it as a global
OPTIMIZER = torch.optim.AdamW(MODEL.parameters(), lr=1e-3)
DATA = torch.randn(3, 4)


def step():
    out = torch.utils.checkpoint.checkpoint(MODEL, DATA, use_reentrant=False)
    out.pow(2).mean().backward()
    OPTIMIZER.step()
    OPTIMIZER.zero_grad(set_to_none=True)


step()  # Adam's state exists, as past a training loop's first step


def test_restored_optimizer_keeps_its_param_groups_key_order_and_shared_objects():
    before = [list(group) for group in OPTIMIZER.param_groups]
    betas = OPTIMIZER.param_groups[0]["betas"]
    restore = discover_state(step).loop_snapshot()
    step()
    restore()
    assert [list(group) for group in OPTIMIZER.param_groups] == before  # load_state_dict puts "params" last
    assert OPTIMIZER.param_groups[0]["betas"] is betas  # the tuple ``defaults`` holds too


def test_check_step_of_a_step_with_a_module_global_adamw_finds_nothing():
    # the optimizer printed as a global differed between the first run (the original object)
    # and the second (restored): key order and the betas tuple's identity
    report = recheck.check_step(step)
    assert report.ok, str(report)


def test_a_restored_optimizer_holds_its_own_objects_with_the_bytes_and_versions_they_had():
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    fresh = torch.nn.Parameter(torch.zeros(3))

    def step():
        model(DATA).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()
    groups, group, state = optimizer.param_groups, optimizer.param_groups[0], optimizer.state
    entries = {id(p): entry for p, entry in state.items()}
    tensors = [(t, t._version, t.clone()) for entry in state.values() for t in entry.values()]
    loaded = []
    optimizer.register_load_state_dict_pre_hook(lambda opt, sd: loaded.append(sd))
    restore = discover_state(step).loop_snapshot()
    step()
    optimizer.add_param_group({"params": [fresh]})  # a group, and then state, a run made
    fresh.grad = torch.ones(3)
    optimizer.step()
    restore()
    # the same list, group and state objects (whoever holds one, a scheduler or a captured CUDA
    # graph of a capturable Adam, holds the optimizer's own), no load_state_dict hook run
    assert optimizer.param_groups is groups and groups == [group] and optimizer.state is state
    assert list(state) == list(model.parameters()) and all(state[p] is entries[id(p)] for p in state)
    assert all(now is then for now, (then, _, _) in zip(
        [t for entry in state.values() for t in entry.values()], tensors))
    assert all(t._version == version and torch.equal(t, copy) for t, version, copy in tensors)
    assert not loaded


def test_a_restored_optimizer_state_that_holds_lists_gets_their_content_back():
    weight = torch.nn.Parameter(torch.randn(3))
    optimizer = torch.optim.LBFGS([weight], history_size=3, max_iter=2)

    def closure():
        optimizer.zero_grad()
        loss = (weight - 1).square().sum()
        loss.backward()
        return loss

    optimizer.step(closure)
    history = optimizer.state[weight]["old_dirs"]
    before = [t.clone() for t in history]
    restore = discover_state(lambda: optimizer.step(closure), optimizers=[optimizer]).loop_snapshot()
    with torch.no_grad():
        optimizer.step(closure)  # appends to the lists it keeps
    restore()
    restored = optimizer.state[weight]["old_dirs"]
    assert len(restored) == len(before) and all(torch.equal(a, b) for a, b in zip(restored, before))


class _Wrapped(torch.optim.Optimizer):
    """An optimizer that answers ``state`` and ``param_groups`` from the one it wraps (as
    ZeroRedundancyOptimizer-like wrappers do): put back through its ``load_state_dict``."""

    def __init__(self, inner: torch.optim.Optimizer) -> None:  # noqa: D107 - no super().__init__
        self.inner = inner
        self.defaults = inner.defaults
        self._optimizer_step_pre_hooks, self._optimizer_step_post_hooks = {}, {}
        self._optimizer_state_dict_pre_hooks, self._optimizer_state_dict_post_hooks = {}, {}
        self._optimizer_load_state_dict_pre_hooks, self._optimizer_load_state_dict_post_hooks = {}, {}

    state = property(lambda self: self.inner.state)
    param_groups = property(lambda self: list(self.inner.param_groups))  # a new list at each read

    def step(self, closure=None):  # noqa: ANN001, ANN201
        return self.inner.step(closure)

    def load_state_dict(self, state_dict):  # noqa: ANN001, ANN201
        self.inner.load_state_dict(state_dict)

    def state_dict(self):  # noqa: ANN201
        return self.inner.state_dict()


def test_an_optimizer_that_wraps_another_is_put_back_through_its_state_dict():
    model = torch.nn.Linear(4, 2)
    optimizer = _Wrapped(torch.optim.AdamW(model.parameters(), lr=1e-3))

    def step():
        model(DATA).square().mean().backward()
        optimizer.step()
        optimizer.inner.zero_grad(set_to_none=True)

    step()
    before = [t.clone() for entry in optimizer.state.values() for t in entry.values()]
    restore = discover_state(step, optimizers=[optimizer]).loop_snapshot()
    step()
    restore()
    after = [t for entry in optimizer.state.values() for t in entry.values()]
    assert len(after) == len(before) and all(torch.equal(a, b) for a, b in zip(after, before))
