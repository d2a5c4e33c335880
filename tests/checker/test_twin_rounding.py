"""``check_step`` tells rounding from a hazard finding by finding (plain torch fixtures).

Reentrant checkpointing sums the gradient contributions of a tensor several regions read in
another order than the plain engine does: last bits move, which is no hazard.  The float64 rerun
that tells this apart must run both twins with the same dtype state, judge each finding on its
own, and where the step cannot run in float64 at all, fall back to the size of the difference.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

import recheck

DIM = 16


class CrossLayer(nn.Module):
    """A decoder layer that reads the encoder's output twice (keys and values), with dropout."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v = nn.Linear(DIM, DIM), nn.Linear(DIM, DIM), nn.Linear(DIM, DIM)
        self.dropout = nn.Dropout(0.1)

    def forward(self, hidden: torch.Tensor, encoded: torch.Tensor) -> torch.Tensor:
        weights = F.softmax(self.q(hidden) @ self.k(encoded).transpose(-1, -2) * DIM ** -0.5, dim=-1)
        return hidden + self.dropout(weights @ self.v(encoded))


class Decoder(nn.Module):
    """BART's decoder loop: LayerDrop draws ``torch.rand([])`` per layer, each layer checkpointed
    reentrantly (RNG preserved): the only difference from the plain step is accumulation order."""

    def __init__(self, layers: int = 4, layerdrop: float = 0.3) -> None:
        super().__init__()
        self.encoder = nn.Linear(DIM, DIM)
        self.layers = nn.ModuleList(CrossLayer() for _ in range(layers))
        self.layerdrop = layerdrop

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        encoded = torch.tanh(self.encoder(x))
        hidden = x
        for layer in self.layers:
            if self.training and torch.rand([]) < self.layerdrop:
                continue
            hidden = checkpoint(layer, hidden, encoded, use_reentrant=True)
        return hidden


def _step(model: nn.Module, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    data = torch.randn(2, 8, DIM, generator=generator)

    def step() -> torch.Tensor:
        loss = model(data).pow(2).mean()
        loss.backward()
        return loss.detach()

    return step


def _check(step) -> recheck.Report:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return recheck.check_step(step)


def _rounding_note(report: recheck.Report) -> str:
    (note,) = [n for n in report.notes if "only by rounding" in n]
    return note


def test_layerdrop_draws_the_same_in_both_float64_twins_so_accumulation_order_is_a_note():
    torch.manual_seed(0)
    model = Decoder().train()
    report = _check(_step(model))
    assert report.ok, str(report)
    assert "ulp" in _rounding_note(report)


class NumpyReseeding(nn.Module):
    """A layer that reseeds numpy from its own stream each call (a data-augmentation habit): the
    recompute reseeds again, a genuine ``rng`` finding that has nothing to do with the values."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        np.random.seed(np.random.randint(2**31))
        return torch.tanh(self.linear(x))


class ReseedingDecoder(Decoder):
    def __init__(self) -> None:
        super().__init__(layerdrop=0.0)
        self.reseeding = NumpyReseeding()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(checkpoint(self.reseeding, x, use_reentrant=False))


def test_a_cause_unrelated_to_the_values_leaves_the_rounding_of_the_others_a_note():
    torch.manual_seed(0)
    np.random.seed(0)
    report = _check(_step(ReseedingDecoder().train()))
    assert {f.kind for f in report.findings} == {"rng"}, str(report)
    assert all("numpy" in str(f.subject) for f in report.findings), str(report)
    assert "ulp" in _rounding_note(report)


class Router(nn.Module):
    """An MoE router that computes its logits in float32 on purpose (``hidden.float()``)."""

    def __init__(self, experts: int = 4) -> None:
        super().__init__()
        self.gate = nn.Linear(DIM, experts, bias=False)
        self.experts = nn.ModuleList(nn.Linear(DIM, DIM) for _ in range(experts))

    def forward(self, hidden: torch.Tensor, encoded: torch.Tensor) -> torch.Tensor:
        logits = F.linear(hidden.float() + encoded, self.gate.weight.float())
        weights = F.softmax(logits, dim=-1).to(hidden.dtype)
        mixed = sum(weights[..., i:i + 1] * expert(hidden + encoded.to(hidden.dtype))
                    for i, expert in enumerate(self.experts))
        return hidden + mixed


class RoutedDecoder(Decoder):
    """Every layer routes on the encoder's output, which is kept in float32 for the routers."""

    def __init__(self) -> None:
        super().__init__(layers=3, layerdrop=0.0)
        self.layers = nn.ModuleList(Router() for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        encoded = torch.tanh(self.encoder(x)).float()
        hidden = x
        for layer in self.layers:
            hidden = checkpoint(layer, hidden, encoded, use_reentrant=True)
        return hidden


def test_a_step_that_casts_to_float32_on_purpose_is_judged_by_the_size_of_its_difference():
    torch.manual_seed(0)
    report = _check(_step(RoutedDecoder().train()))
    assert report.ok, str(report)
    note = _rounding_note(report)
    assert "ulp" in note and "float32" in note and "size" in note, note
    assert "Tensor.float" in note and "test_twin_rounding.py" in note, note


def fused_gate(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """A kernel that takes float32 only, as grouped-GEMM and fused router kernels do."""
    if hidden.dtype != torch.float32:
        raise RuntimeError(f"Expected mat_a to be Float32, got {hidden.dtype}")
    return F.linear(hidden, weight)


class KernelRouter(Router):
    def forward(self, hidden: torch.Tensor, encoded: torch.Tensor) -> torch.Tensor:
        weights = F.softmax(fused_gate(hidden + encoded, self.gate.weight), dim=-1)
        return hidden + sum(weights[..., i:i + 1] * expert(hidden + encoded) for i, expert in enumerate(self.experts))


def test_an_op_that_rejects_float64_is_named_and_the_difference_judged_by_its_size():
    torch.manual_seed(0)
    model = RoutedDecoder()
    model.layers = nn.ModuleList(KernelRouter() for _ in range(3))
    report = _check(_step(model.train()))
    assert report.ok, str(report)
    note = _rounding_note(report)
    assert "Expected mat_a to be Float32" in note and "fused_gate" in note and "ulp" in note, note


@pytest.mark.slow
def test_a_hazard_is_still_a_finding_when_the_step_cannot_run_in_float64():
    torch.manual_seed(0)
    model = RoutedDecoder()
    model.layers = nn.ModuleList(KernelRouter() for _ in range(3))
    for layer in model.layers:
        layer.experts[0].register_forward_hook(lambda module, args, out: out * (1.0 + 1e-3 * torch.is_grad_enabled()))
    report = _check(_step(model.train()))
    assert not report.ok, str(report)


#: read inside :class:`ScaledLayer`'s region; the step below changes it between forward and backward
SCALE = 1.0


class ScaledLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.linear(x) * SCALE)


def test_values_a_found_cause_explains_are_not_rerun_in_float64(capsys):
    torch.manual_seed(0)
    model = ScaledLayer()
    data = torch.randn(4, DIM)

    def step() -> torch.Tensor:
        global SCALE
        print("step runs with", torch.get_default_dtype())  # the snapshot puts a list back, not the output
        loss = checkpoint(model, data, use_reentrant=False).pow(2).mean()
        SCALE = 2.0  # the recompute reads another scale: the watch names the global as the cause
        try:
            loss.backward()
        finally:
            SCALE = 1.0
        return loss.detach()

    report = _check(step)
    assert "global" in {f.kind for f in report.findings}, str(report)
    assert report.by_kind("gradient") or "consequence" in str(report), str(report)
    runs = capsys.readouterr().out.splitlines()
    assert runs and "torch.float64" not in str(runs), runs


def test_the_float64_rerun_puts_gradients_and_dtypes_back():
    torch.manual_seed(0)
    model = Decoder().train()
    step = _step(model)
    for p in model.parameters():  # gradients present before the check: the rerun starts from them in float64
        p.grad = torch.randn_like(p)
    before = {name: (p.detach().clone(), p.grad.clone()) for name, p in model.named_parameters()}
    report = _check(step)
    assert "ulp" in _rounding_note(report)
    assert not any("put back" in n or "could not" in n for n in report.notes), report.notes
    for name, p in model.named_parameters():
        value, grad = before[name]
        assert p.dtype == p.grad.dtype == torch.float32, name
        assert torch.equal(p, value) and torch.equal(p.grad, grad), name
    assert torch.get_default_dtype() == torch.float32


def test_sizing_a_difference_warns_nothing_into_the_users_run():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        report = recheck.check(model, torch.randn(3, 4), use_reentrant=True)  # an output that needs no grad
    assert report.by_kind("output"), str(report)
    assert not [w for w in seen if "recheck" in w.filename], [str(w.message) for w in seen]


def test_a_torch_generator_explains_values_whatever_its_name_and_a_host_stream_does_not():
    """Whether an RNG finding explains the twins' value differences (so no float64 rerun is made)
    is read from its subject's parts: a torch generator named like numpy's is torch's."""
    from recheck.checker.twin import _value_causes
    from recheck.findings import Finding, Subject

    def rng(subject: Subject) -> Finding:
        return Finding(kind="rng", message=f"{subject} differs", subject=subject)

    torch_streams = [rng(Subject("RNG instance", "self.numpy_gen", owner="generator")),
                     rng(Subject("device RNG", owner="cpu"))]
    host_streams = [rng(Subject("RNG instance", "self.rng", owner="random.Random")),
                    rng(Subject("RNG instance", "self.state", owner="numpy RandomState")),
                    rng(Subject("host RNG", "Python random")), rng(Subject("host RNG", "numpy global RNG"))]
    assert _value_causes(torch_streams + host_streams, []) == torch_streams
