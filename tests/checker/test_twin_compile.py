"""``check_step`` on compiled steps: the step as written against an eager twin.

A compiled step runs graphs compiled once, under whatever ``torch._functorch.config`` said then;
below ``activation_memory_budget = 1.0`` AOTAutograd's partitioner may recompute a dropout in
backward with fresh randomness on CPU (pytorch#190758), a checkpoint nobody wrote.  The twin runs
the same code eagerly (``torch.compiler.set_stance("force_eager")``) with every checkpoint
bypassed, so neither the compiler's recomputation nor a budget the step sets itself can hide in
the twin, and the compiled graphs are left as they were.

The models compile with ``aot_eager`` (AOTAutograd and its partitioner, no code generation),
which matches eager bit for bit where nothing is recomputed; one slow test compiles with
inductor, whose fused kernels round otherwise.  Each model gets a backend object of its own:
Dynamo shares graphs between instances of one module class compiled with the same backend.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch._functorch.config as functorch_config
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

import recheck


class Block(nn.Module):
    def __init__(self, p: float = 0.5) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 64), nn.Linear(64, 16)
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.dropout(F.gelu(self.fc1(x)), self.p, self.training))


class Net(nn.Module):
    """Two blocks, the first checkpointed (non-reentrant)."""

    def __init__(self, p: float = 0.5) -> None:
        super().__init__()
        self.first, self.second = Block(p), Block(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(checkpoint(self.first, x, use_reentrant=False))


def _backend(name: str = "aot_eager"):
    """A backend object of the model's own, delegating to ``name``."""
    from torch._dynamo.backends.registry import lookup_backend

    compiler = lookup_backend(name)

    def backend(gm, example_inputs):
        return compiler(gm, example_inputs)

    return backend


def _compiled_step(*, p: float = 0.5, budget: float = 1.0, in_step: bool = False, backend: str = "aot_eager"):
    """A compiled forward and backward of :class:`Net`, compiled under ``budget`` at its first call
    (``in_step``: the step sets the budget itself, around every call)."""
    torch.manual_seed(0)
    model = Net(p)
    compiled = torch.compile(model, backend=_backend(backend))
    x = torch.randn(8, 16)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def run() -> torch.Tensor:
        optimizer.zero_grad()
        loss = compiled(x).pow(2).mean()
        loss.backward()
        optimizer.step()
        return loss.detach()

    def step() -> torch.Tensor:
        if in_step:
            with functorch_config.patch(activation_memory_budget=budget):
                return run()
        return run()

    if not in_step:
        with functorch_config.patch(activation_memory_budget=budget):
            compiled(x)  # compiled here, under the budget; the config is put back after
    return step, model


def _check(step):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return recheck.check_step(step)


def test_a_compiler_that_recomputes_dropout_is_found_against_the_eager_twin():
    step, _ = _compiled_step(budget=0.5)
    report = _check(step)
    assert not report.ok and report.by_kind("gradient"), str(report)
    assert any('set_stance("force_eager")' in n for n in report.notes), report.notes


def test_a_step_that_sets_the_memory_budget_itself_is_found_too():
    step, _ = _compiled_step(budget=0.5, in_step=True)
    report = _check(step)
    assert not report.ok and report.by_kind("gradient"), str(report)


def test_a_clean_compiled_step_with_dropout_in_a_checkpoint_has_no_finding():
    step, _ = _compiled_step(budget=1.0)
    report = _check(step)
    assert report.ok, str(report)
    assert not any("made no checkpoint call recheck could bypass" in n for n in report.notes), report.notes


def test_a_compiled_function_that_calls_checkpoint_is_bypassed_in_its_eager_twin():
    torch.manual_seed(0)
    block = Block(0.5)
    x = torch.randn(8, 16, requires_grad=True)

    @torch.compile(backend=_backend())
    def forward(inputs: torch.Tensor) -> torch.Tensor:
        return checkpoint(block, inputs, use_reentrant=False).tanh()

    def step() -> None:
        block.zero_grad()
        forward(x).sum().backward()

    report = _check(step)
    assert report.ok, str(report)
    assert not any("made no checkpoint call recheck could bypass" in n for n in report.notes), report.notes


def test_checking_a_compiled_step_leaves_its_compiled_graphs_as_they_were():
    step, model = _compiled_step(budget=0.5)

    def gradients() -> list[torch.Tensor]:
        state = {k: v.clone() for k, v in model.state_dict().items()}
        rng = torch.get_rng_state()
        step()
        grads = [p.grad.clone() for p in model.parameters()]
        model.load_state_dict(state)
        torch.set_rng_state(rng)
        return grads

    before = gradients()
    _check(step)
    after = gradients()
    assert all(torch.equal(a, b) for a, b in zip(before, after))


def test_without_set_stance_the_twin_says_it_ran_the_compiled_code(monkeypatch):
    step, _ = _compiled_step(budget=1.0)
    monkeypatch.delattr(torch.compiler, "set_stance")
    report = _check(step)
    assert any("torch.compiler.set_stance" in n and "not compared" in n for n in report.notes), report.notes


@pytest.mark.slow
def test_inductor_rounding_is_a_note_with_its_size():
    step, _ = _compiled_step(p=0.0, backend="inductor")
    report = _check(step)
    assert report.ok, str(report)
    (note,) = [n for n in report.notes if "only by rounding" in n]
    assert "ulp" in note and "compiled" in note, note


@pytest.mark.slow
def test_inductor_random_numbers_are_named_and_fallback_random_checks_them():
    import torch._inductor.config as inductor_config

    step, _ = _compiled_step(p=0.5, backend="inductor")
    report = _check(step)
    assert any("fallback_random = True" in n and "not compared" in n for n in report.notes), report.notes
    assert report.ok, str(report)  # refused, not 18 differences inductor's own random numbers make
    with inductor_config.patch(fallback_random=True):
        step, _ = _compiled_step(p=0.5, backend="inductor")
    assert _check(step).ok
