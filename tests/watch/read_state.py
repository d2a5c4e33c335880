"""State that changes between a region's forward and its recompute, in the style of real code.

Each model comes with a variant whose region reads (or keeps changing) the state, which
must stay a finding:

- ``MoEGate``: a router that counts its calls (a capacity schedule reads the count). The fix
  a real MoE library merged hands ``checkpoint`` a ``context_fn`` whose recompute context puts
  the count back to what the forward started from and restores the forward's afterwards
  (``restoring_context``); without it the recompute counts once more.
- ``LitModel``: a LightningModule-like class that checkpoints one of its methods. The trainer
  sets ``self._current_fx_name`` between forward and backward, and a version flag of a
  module-level cache (``_METRICS_AVAILABLE``, evaluated on first use) is read only by
  ``log``, a method the region never calls. ``ReadingLitModel``'s region reads the hook name.
- ``classification_head.py`` (beside this file) is the transformers head; ``ReadingLayer``
  here is its decoder layer made to read ``config.problem_type``.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from classification_head import DecoderLayer


class MoEGate(nn.Module):
    def __init__(self, width: int = 8, experts: int = 4) -> None:
        super().__init__()
        self.proj = nn.Linear(width, experts)
        self.step = 0

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        self.step += 1
        capacity = 1.0 + 0.0 * min(self.step, 100)  # a schedule that reads the count
        return torch.softmax(self.proj(hidden) * capacity, dim=-1)


def restoring_context(gate: MoEGate) -> Any:
    """A ``context_fn``: the recompute runs from the count its forward started from, and the
    forward's count is put back when the recompute ends."""
    started: dict[str, int] = {}

    @contextlib.contextmanager
    def forward_context() -> Iterator[None]:
        started["step"] = gate.step
        yield

    @contextlib.contextmanager
    def recompute_context() -> Iterator[None]:
        left = gate.step
        gate.step = started["step"]
        try:
            yield
        finally:
            gate.step = left

    return lambda: (forward_context(), recompute_context())


def gate_step(gate: MoEGate, restore: bool) -> None:
    hidden = torch.randn(4, 8, requires_grad=True)
    extra = {"context_fn": restoring_context(gate)} if restore else {}
    checkpoint(gate, hidden, use_reentrant=False, **extra).sum().backward()


class _RequirementCache:
    """A package-version flag that looks itself up on first use (lightning's ``RequirementCache``)."""

    def __init__(self, requirement: str) -> None:
        self.requirement = requirement
        self.available: bool | None = None

    def __bool__(self) -> bool:
        if self.available is None:
            self.available = True
        return self.available


_METRICS_AVAILABLE = _RequirementCache("torchmetrics>=0.9.1")


class LitModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8))
        self._current_fx_name: str | None = None
        self.logged: dict[str, float] = {}

    def log(self, name: str, value: torch.Tensor) -> None:
        if self._current_fx_name is not None and _METRICS_AVAILABLE:
            self.logged[f"{self._current_fx_name}/{name}"] = float(value.detach())

    def block_forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x)

    def training_step(self, x: torch.Tensor) -> torch.Tensor:
        loss = checkpoint(self.block_forward, x, use_reentrant=False).pow(2).mean()
        self.log("loss", loss)
        return loss


class ReadingLitModel(LitModel):
    """The region reads the hook name: it computes otherwise at the recompute."""

    def block_forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.block(x)
        return out * 2 if self._current_fx_name == "backward" else out


def lightning_step(model: LitModel) -> None:
    """What the trainer does around one step: the hook name changes before backward."""
    model._current_fx_name = "training_step"
    loss = model.training_step(torch.randn(4, 8, requires_grad=True))
    model._current_fx_name = "backward"
    loss.backward()


class ReadingLayer(DecoderLayer):
    """A decoder layer whose forward reads ``config.problem_type`` (a regression head scales)."""

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        out = super().forward(hidden_states)
        return out * 0.5 if self.config.problem_type == "regression" else out


class KVCarrier:
    """A holder the attention layers share: the last key and value computed (read by a cache
    outside the region). ``accumulate`` adds to what it holds, so a recompute writes other bytes."""

    def __init__(self, accumulate: bool = False) -> None:
        self.accumulate = accumulate
        self.key: torch.Tensor | None = None
        self.value: torch.Tensor | None = None


class CarrierAttention(nn.Module):
    def __init__(self, carrier: KVCarrier, width: int = 8) -> None:
        super().__init__()
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)
        self.carrier = carrier

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        carrier = self.carrier
        if carrier.accumulate and carrier.key is not None:
            carrier.key, carrier.value = carrier.key + k.detach(), carrier.value + v.detach()
        else:
            carrier.key, carrier.value = k.detach(), v.detach()
        return self.out(torch.softmax(q @ k.transpose(-1, -2), dim=-1) @ v)
