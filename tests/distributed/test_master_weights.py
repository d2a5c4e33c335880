"""``check_step`` refuses an optimizer that keeps tensors of its own outside ``param_groups`` and
``state`` (a mixed-precision or ZeRO-like wrapper's fp32 master copies): its snapshot could not
put them back, and the check would leave training several steps ahead."""

from __future__ import annotations

import pytest
import torch

import recheck


class MasterWeightSGD(torch.optim.Optimizer):
    """SGD that updates fp32 master copies kept in its own list and copies them into the
    (lower-precision) model parameters, as DeepSpeed's and apex's FP16_Optimizer do."""

    def __init__(self, params, lr: float = 0.1) -> None:
        super().__init__(params, {"lr": lr})
        self.fp32_masters = [p.detach().float().clone() for g in self.param_groups for p in g["params"]]

    @torch.no_grad()
    def step(self, closure=None):  # noqa: ARG002 - torch's signature
        params = [p for g in self.param_groups for p in g["params"]]
        for master, p in zip(self.fp32_masters, params):
            if p.grad is not None:
                master.sub_(p.grad.float(), alpha=self.param_groups[0]["lr"])
                p.copy_(master.to(p.dtype))


def _checkpointed() -> torch.nn.Module:
    torch.manual_seed(0)
    linear = torch.nn.Linear(8, 8).to(torch.bfloat16)

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = linear

        def forward(self, x):
            return torch.utils.checkpoint.checkpoint(lambda y: torch.tanh(self.linear(y)), x, use_reentrant=False)

    return Model()


def test_an_optimizer_keeping_master_copies_of_its_own_is_refused_naming_them_and_nothing_changes():
    model = _checkpointed()
    optimizer = MasterWeightSGD(model.parameters())
    data = torch.randn(4, 8, dtype=torch.bfloat16)

    def step():
        model(data).float().pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()

    step()
    params = [p.detach().clone() for p in model.parameters()]
    masters = [m.clone() for m in optimizer.fp32_masters]
    with pytest.raises(RuntimeError, match=r"MasterWeightSGD\.fp32_masters"):
        recheck.check_step(step)
    assert all(torch.equal(a, b) for a, b in zip(params, model.parameters()))
    assert all(torch.equal(a, b) for a, b in zip(masters, optimizer.fp32_masters))


def test_a_plain_torch_optimizer_is_not_refused():
    model = _checkpointed().float()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    data = torch.randn(4, 8)

    def step():
        model(data).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()

    step()
    assert recheck.check_step(step).ok


class WrappingOptimizer(torch.optim.Optimizer):
    """An optimizer over the model's parameters whose step is an inner optimizer's, which keeps
    the moments in its own state (as ZeroRedundancyOptimizer does with its local shard)."""

    def __init__(self, params) -> None:
        params = list(params)
        super().__init__(params, {})
        self.inner = torch.optim.Adam(params, lr=0.1)

    def step(self, closure=None):  # noqa: ARG002 - torch's signature
        self.inner.step()


def test_an_optimizer_wrapping_another_whose_state_it_does_not_show_is_refused():
    model = _checkpointed().float()
    optimizer = WrappingOptimizer(model.parameters())
    data = torch.randn(4, 8)

    def step():
        model(data).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()

    step()
    moments = [v.clone() for st in optimizer.inner.state.values() for v in st.values()]
    with pytest.raises(RuntimeError, match=r"WrappingOptimizer\.inner"):
        recheck.check_step(step)
    assert all(torch.equal(a, b) for a, b in zip(moments, (v for st in optimizer.inner.state.values()
                                                           for v in st.values())))


def test_a_flat_buffer_the_parameters_are_views_of_is_not_refused():
    model = _checkpointed().float()
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    offset = 0
    for p in model.parameters():
        p.data = flat[offset:offset + p.numel()].view_as(p)
        offset += p.numel()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    optimizer.flat = flat  # a bucket view, as ZeroRedundancyOptimizer(parameters_as_bucket_view=True) keeps
    data = torch.randn(4, 8)

    def step():
        model(data).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()

    assert recheck.check_step(step).ok


class ZeroLikeOptimizer:
    """What DeepSpeed's ZeRO optimizers are: no torch optimizer, but one wrapped over fp32
    master partitions, with gradient partitions and a loss scale of its own."""

    def __init__(self, params) -> None:
        self.params = list(params)
        self.masters = [p.detach().float().clone().requires_grad_() for p in self.params]
        self.optimizer = torch.optim.Adam(self.masters, lr=0.1)
        self.averaged_gradients = [torch.zeros_like(m) for m in self.masters]
        self.loss_scale = 1.0

    @torch.no_grad()
    def step(self) -> None:
        for master, param, grad in zip(self.masters, self.params, self.averaged_gradients):
            grad.copy_(param.grad.float())
            master.grad = grad
            param.grad = None
        self.optimizer.step()
        for master, param in zip(self.masters, self.params):
            param.copy_(master.to(param.dtype))


class Engine(torch.nn.Module):
    """A training engine as DeepSpeed's is: the module, and the optimizer it steps itself."""

    def __init__(self, module: torch.nn.Module) -> None:
        super().__init__()
        self.module = module
        self.optimizer = ZeroLikeOptimizer(module.parameters())

    def forward(self, x):
        return self.module(x)


def test_an_engine_keeping_an_optimizer_wrapper_is_refused_naming_it_and_training_is_unchanged():
    engine = Engine(_checkpointed())
    data = torch.randn(4, 8, dtype=torch.bfloat16)

    def step():
        engine(data).float().pow(2).mean().backward()
        engine.optimizer.step()

    step()
    held = [engine.optimizer.masters, engine.optimizer.averaged_gradients, list(engine.parameters()),
            [v for st in engine.optimizer.optimizer.state.values() for v in st.values()]]
    before = [[t.detach().clone() for t in tensors] for tensors in held]
    with pytest.raises(RuntimeError, match=r"Engine\.optimizer, a ZeroLikeOptimizer wrapping a torch optimizer "
                                           r"with averaged_gradients"):
        recheck.check_step(step)
    assert all(torch.equal(a, b) for kept, tensors in zip(before, held) for a, b in zip(kept, tensors))
