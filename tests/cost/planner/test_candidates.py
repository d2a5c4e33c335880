"""Candidates are found by running the step: the repeated units a checkpointed loop goes over, and
the step's other checkpoint calls."""

from __future__ import annotations

import functools

import pytest
import torch
from torch.utils.checkpoint import checkpoint

from recheck.cost.planner.candidates import NoRepeatedUnit, find_candidates
from recheck.runtime.steps import discover_state


def candidates_of(step):
    state = discover_state(step)
    return find_candidates(step, state, state.snapshot())


def described(found):
    return [(c.name, c.kind, c.written, c.outer.name if c.outer else None) for c in found.items]


def test_the_demo_has_its_blocks_and_mlp_layers_as_units_and_tanh_as_a_region(small_demo):
    found = candidates_of(small_demo[0])
    assert [(c.name, c.kind) for c in found.items] == [
        ("blocks.0", "unit"), ("blocks.1", "unit"), ("blocks.2", "unit"),
        ("_VariableFunctionsClass.tanh at fixtures/models/cost_demo.py:104", "region"),
        ("mlp.0", "unit"), ("mlp.1", "unit")]
    assert all(c.written for c in found.items)
    assert found.root is small_demo[1] and found.root_name == "ModuleDict"
    assert {k.qualname for k in found.unit_keys} == {"Block.forward", "MLPLayer.forward"}
    assert found.units[0].variants == ("none", "full", "selective")
    assert found.regions[0].variants == ("none", "full")


def test_every_layer_of_the_loop_is_a_unit_also_those_the_step_does_not_checkpoint(gpt):
    step, _, _ = gpt.make_step(layers=4, dim=16, context=8, vocab=32, strategy="loop", every=2)
    found = candidates_of(step)
    assert described(found) == [("h.0", "unit", True, None), ("h.1", "unit", False, None),
                                ("h.2", "unit", True, None), ("h.3", "unit", False, None)]


def test_a_checkpoint_wrapper_leaves_the_wrapped_block_as_the_unit(gpt):
    step, _, _ = gpt.make_step(layers=4, dim=16, context=8, vocab=32, strategy="wrapper", every=2)
    found = candidates_of(step)
    assert [c.name for c in found.items] == ["h.0._checkpoint_wrapped_module", "h.1",
                                             "h.2._checkpoint_wrapped_module", "h.3"]


def test_a_region_over_several_layers_is_an_outer_region_with_its_layers_inside(gpt):
    # checkpoint_sequential: 6 layers in 3 segments, the last one run without checkpoint
    step, _, _ = gpt.make_step(layers=6, dim=16, context=8, vocab=32, strategy="segments", segments=3)
    found = candidates_of(step)
    outer, *units = found.items
    # a segment is named by the class of the layers it runs
    assert outer.kind == "outer" and outer.name.startswith("block.forward")
    assert [(u.name, u.outer is outer) for u in units] == [
        ("h.0", True), ("h.1", True), ("h.2", True), ("h.3", True), ("h.4", False), ("h.5", False)]
    assert units[0].variants == ("none", "full", "selective", "inside")
    assert outer.inner == units[:4]


class decoder_layer(torch.nn.Module):
    """transformers 5's shape: the layer checkpoints ``partial(forward, self)`` inside its own forward."""

    def __init__(self) -> None:
        super().__init__()
        self.mlp = torch.nn.Linear(8, 8)
        self.norm = torch.nn.LayerNorm(8)
        self.gradient_checkpointing = True

    def _forward(self, x):
        return x + self.mlp(self.norm(x))

    def forward(self, x):
        if self.gradient_checkpointing and self.training:
            return checkpoint(functools.partial(decoder_layer._forward, self), x, use_reentrant=False)
        return self._forward(x)


def test_a_layer_that_checkpoints_itself_inside_its_forward_is_the_unit():
    torch.manual_seed(0)
    model = torch.nn.ModuleDict({"layers": torch.nn.ModuleList(decoder_layer() for _ in range(3))})

    def step():
        h = torch.randn(2, 8)
        for layer in model["layers"]:
            h = layer(h)
        h.sum().backward()

    found = candidates_of(step)
    assert described(found) == [(f"layers.{i}", "unit", True, None) for i in range(3)]


def test_a_layer_run_twice_in_a_step_is_left_out_with_a_note():
    torch.manual_seed(0)
    blocks = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(3))

    def step():
        h = torch.randn(2, 4, requires_grad=True)
        for layer in [*blocks, blocks[0]]:  # blocks[0] again: a shared layer
            h = checkpoint(layer, h, use_reentrant=False)
        h.sum().backward()

    found = candidates_of(step)
    assert [c.name for c in found.units] == ["1", "2"]
    assert found.notes == ["0 runs 2 times in a step (a shared module): it is left out of the plan"]


def test_a_step_without_a_checkpoint_or_a_repeated_block_says_why():
    torch.manual_seed(0)
    blocks = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(3))

    def step():
        h = torch.randn(2, 4)
        for layer in blocks:
            h = layer(h)
        h.sum().backward()

    with pytest.raises(NoRepeatedUnit, match="makes no checkpoint call and its forward runs no repeated block.*"
                                             "the step's ModuleList runs 3 Linear"):
        candidates_of(step)


def test_a_single_checkpointed_module_is_no_repeated_unit():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 4))
    head = torch.nn.Linear(4, 1)

    def step():
        checkpoint(head, net(torch.randn(2, 4)), use_reentrant=False).sum().backward()

    with pytest.raises(NoRepeatedUnit, match="no repeated unit: the step's checkpoint regions .Linear.forward"):
        candidates_of(step)
