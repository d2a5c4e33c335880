"""The region's inputs for a run of check()'s step and the upstream gradient every run shares."""

from __future__ import annotations

import pytest
import torch

from recheck.checker.twin import RegionError, make_upstream, prepare_inputs


def _outputs(*tensors: torch.Tensor) -> dict[str, torch.Tensor]:
    return {f"output[{i}]": t for i, t in enumerate(tensors)}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64,
                                   torch.complex64, torch.complex128])
def test_upstream_has_the_output_dtype_and_is_the_same_every_time(dtype: torch.dtype) -> None:
    out = torch.zeros(3, 5, dtype=dtype, requires_grad=True)
    first, again = make_upstream(_outputs(out), None), make_upstream(_outputs(out), None)
    (path, grad), = first
    assert path == "output[0]" and grad.dtype == dtype and grad.shape == out.shape
    assert torch.equal(grad.view(torch.uint8) if grad.is_complex() else grad, again[0][1].view(torch.uint8)
                       if grad.is_complex() else again[0][1])
    assert grad.abs().max() > 0  # noise, not zeros


def test_each_output_gets_its_own_noise() -> None:
    a, b = (torch.zeros(64, requires_grad=True) for _ in range(2))
    (_, ga), (_, gb) = make_upstream(_outputs(a, b), None)
    assert not torch.equal(ga, gb)


def test_only_outputs_that_take_a_gradient_get_one() -> None:
    kept = torch.zeros(4, requires_grad=True)
    upstream = make_upstream({"a": torch.zeros(4), "b": kept, "c": torch.zeros(4, dtype=torch.long), "d": 3},
                             None)
    assert [path for path, _ in upstream] == ["b"]


def test_given_upstream_is_used_as_is_and_counted() -> None:
    out = torch.zeros(2, requires_grad=True)
    given = torch.ones(2)
    assert make_upstream(_outputs(out), given)[0][1] is given
    with pytest.raises(RegionError, match="grad_outputs has 2 tensor"):
        make_upstream(_outputs(out), [given, given])


def test_prepare_inputs_gives_fresh_leaves_and_leaves_the_user_tensor_alone() -> None:
    x = torch.randn(3, requires_grad=True)
    frozen = torch.randn(3)
    args, kwargs, fresh = prepare_inputs((x, [frozen]), {"y": x * 2})
    assert args[0] is not x and args[0].is_leaf and args[0].requires_grad
    assert args[1][0] is frozen  # no grad wanted: passed through
    assert set(fresh) == {"args[0]", "kwargs['y']"}
    assert not kwargs["y"].is_leaf  # a non-leaf input stays a non-leaf (a clone of a fresh leaf)
    args[0].sum().backward()
    assert x.grad is None
