"""Decoder layers that checkpoint themselves, in plain torch, the two ways transformers releases do.

``PartialCallLayer`` is transformers 5.16's ``GradientCheckpointingLayer``: its ``__call__``
checkpoints ``partial(super().__call__, **kwargs)``, a bound ``nn.Module.__call__`` (torch's
``_wrapped_call_impl``) of the layer itself.  ``ForwardLayer`` checkpoints ``self.forward`` (5.24).
A region of either is the layer's ``forward``: named by the layer's class and that ``forward``'s
``file:line``, never ``Module._wrapped_call_impl`` or ``partial``.
"""

from __future__ import annotations

from functools import partial

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

#: read by every layer's forward (a test changes it between forward and backward)
SCALE = 1.0


class GradientCheckpointingLayer(nn.Module):
    gradient_checkpointing = False

    def __call__(self, *args, **kwargs):
        if self.gradient_checkpointing and self.training:
            return self._gradient_checkpointing_func(partial(super().__call__, **kwargs), *args)
        return super().__call__(*args, **kwargs)


class PartialCallLayer(GradientCheckpointingLayer):
    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.fc = nn.Linear(width, width)

    def forward(self, hidden_states: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        return torch.tanh(self.fc(hidden_states)) * scale * SCALE


class ForwardLayer(nn.Module):
    gradient_checkpointing = False

    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.fc = nn.Linear(width, width)

    def __call__(self, *args, **kwargs):
        if self.gradient_checkpointing and self.training:
            return self._gradient_checkpointing_func(self.forward, *args)
        return super().__call__(*args, **kwargs)

    def forward(self, hidden_states: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        return torch.tanh(self.fc(hidden_states)) * scale * SCALE


class Decoder(nn.Module):
    def __init__(self, layer_class: type[nn.Module], reentrant: bool = False) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layer_class() for _ in range(2))
        for layer in self.layers:
            layer.gradient_checkpointing = True
            layer._gradient_checkpointing_func = partial(checkpoint, use_reentrant=reentrant)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x
