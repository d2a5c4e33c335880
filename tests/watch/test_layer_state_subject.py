"""A self-checkpointing layer's own attribute is ``self.<name>``, however the layer checkpoints itself.

transformers 5.16's layers checkpoint ``partial(super().__call__, **kwargs)``: the layer is the
bound ``self`` of the partial's method, not its first argument as in ``partial(forward, self)``.
The reach took the layer for a module found through the partial and a counter the layer keeps
was reported as ``attribute `partial.calls```, though the region names the layer's own forward.
"""

from __future__ import annotations

import pytest
import torch

import recheck
from gradient_checkpointing_layers import Decoder, ForwardLayer, PartialCallLayer


class CountingPartialCall(PartialCallLayer):
    calls = 0

    def forward(self, hidden_states: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        self.calls += 1
        return super().forward(hidden_states, scale)


class CountingForward(ForwardLayer):
    calls = 0

    def forward(self, hidden_states: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        self.calls += 1
        return super().forward(hidden_states, scale)


@pytest.mark.parametrize("layer_class", [CountingPartialCall, CountingForward])
@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
def test_a_layer_s_counter_is_its_own_attribute(layer_class, reentrant):
    model = Decoder(layer_class, reentrant=reentrant).train()
    x = torch.randn(2, 8, requires_grad=True)
    with recheck.watch(raise_on_finding=False) as w:
        model(x).sum().backward()
    counted = [f for f in w.report if f.kind == "state"]
    assert len(counted) == 2 and all("attribute `self.calls` updated again" in f.message
                                     and f.region.startswith(f"{layer_class.__name__}.forward (") for f in counted), \
        str(w.report)
