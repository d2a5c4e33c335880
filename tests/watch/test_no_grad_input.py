"""A reentrant checkpoint none of whose inputs requires grad, behind a frozen embedding.

Torch only warns ("None of the inputs have requires_grad=True. Gradients will be None"); the
region's trainable parameters (LoRA adapters) never get a gradient.  ``watch()`` and
``check_step()`` name that cause, kind ``input_grad`` (RC112), and point the missing gradients
at it.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import recheck
from recheck.findings import parts_of


class LoraBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.base = nn.Linear(8, 8)
        self.base.requires_grad_(False)
        self.lora_a = nn.Linear(8, 2, bias=False)
        self.lora_b = nn.Linear(2, 8, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + self.lora_b(self.lora_a(x))


class Model(nn.Module):
    def __init__(self, reentrant: bool, hooked: bool = False) -> None:
        super().__init__()
        self.reentrant = reentrant
        self.embed = nn.Embedding(32, 8)
        self.embed.requires_grad_(False)
        if hooked:  # what transformers' enable_input_require_grads does
            self.embed.register_forward_hook(lambda module, args, output: output.requires_grad_(True))
        self.block = LoraBlock()
        self.head = nn.Linear(8, 2)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        hidden = checkpoint(self.block, self.embed(ids), use_reentrant=self.reentrant)
        return self.head(hidden)


def _step(model: Model):
    ids = torch.randint(0, 32, (4, 3), generator=torch.Generator().manual_seed(0))

    def step() -> None:
        model.zero_grad(set_to_none=True)
        model(ids).pow(2).sum().backward()

    return step


def _watched(model: Model) -> recheck.Report:
    with warnings.catch_warnings(), recheck.watch(raise_on_finding=False) as watched:
        warnings.simplefilter("ignore")  # torch's own "None of the inputs have requires_grad=True"
        _step(model)()
    return watched.report


def test_watch_names_the_input_that_needs_no_grad_as_the_cause():
    torch.manual_seed(0)
    report = _watched(Model(reentrant=True))
    (cause,) = report.by_kind("input_grad")
    assert cause.code == "RC112" and not cause.latent, str(report)
    assert "no tensor input of this reentrant checkpoint requires grad" in cause.message
    subject = parts_of(cause.subject)
    assert subject.what == "parameter"
    assert {f"{subject.owner}.{subject.name}", *subject.more} == {"lora_a.weight", "lora_b.weight"}
    missing = report.by_kind("gradient")
    assert {parts_of(f.subject).name for f in missing} == {"lora_a.weight", "lora_b.weight"}, str(report)
    assert all(f.code == "RC112" and "likely cause: no tensor input" in (f.hint or "") for f in missing)


@pytest.mark.parametrize("options", [{"reentrant": False}, {"reentrant": True, "hooked": True}])
def test_no_cause_where_the_input_requires_grad_or_the_checkpoint_keeps_the_graph(options):
    torch.manual_seed(0)
    report = _watched(Model(**options))
    assert "input_grad" not in report.kinds and "gradient" not in report.kinds, str(report)


def test_check_step_names_the_cause_of_the_missing_gradients():
    torch.manual_seed(0)
    model = Model(reentrant=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = recheck.check_step(_step(model), modules=[model])
    assert "input_grad" in report.kinds, str(report)
    lost = [f for f in report.by_kind("gradient") if "lora" in str(f.subject)]
    assert lost and all(f.code == "RC112" for f in lost), str(report)
