"""The region's inputs for one run, and the upstream gradient its outputs receive.

:func:`prepare_inputs` gives every run fresh leaves for inputs that require grad;
:func:`arguments_print` summarises the arguments' structure and non-tensor values;
:func:`make_upstream` builds the fixed, seeded upstream gradient both runs share, or checks
the caller's ``grad_outputs`` against the outputs (:func:`given_upstream` checks its type first).
"""

from __future__ import annotations

from typing import Any

import torch

from recheck.runtime.fingerprints import fingerprint
from recheck.runtime.trees import leaves, map_tensors

__all__ = ["RegionError", "arguments_print", "given_upstream", "make_upstream", "prepare_inputs"]


class RegionError(ValueError):
    """The region cannot be checked as given (no tensor output, nothing requires grad)."""


def prepare_inputs(args: tuple, kwargs: dict) -> tuple[tuple, dict, dict[str, torch.Tensor]]:
    """Fresh leaves for inputs that require grad, so user tensors keep their ``.grad``."""
    fresh_leaves: dict[str, torch.Tensor] = {}

    def convert(path: str, value: torch.Tensor) -> torch.Tensor:
        if not value.requires_grad:
            return value
        leaf = value.detach().requires_grad_(True)
        fresh_leaves[path] = leaf
        return leaf if value.is_leaf else leaf.clone()

    fresh_args = tuple(map_tensors(convert, a, f"args[{i}]") for i, a in enumerate(args))
    fresh_kwargs = {k: map_tensors(convert, v, f"kwargs[{k!r}]") for k, v in kwargs.items()}
    return fresh_args, fresh_kwargs, fresh_leaves


def arguments_print(args: tuple, kwargs: dict) -> Any:
    """The arguments' structure and non-tensor values; tensors by identity (bytes apart)."""
    return tuple((path, ("tensor", id(leaf)) if isinstance(leaf, torch.Tensor) else fingerprint(leaf))
                 for path, leaf in leaves(tuple(args), "args") + leaves(dict(kwargs), "kwargs"))


def given_upstream(given: Any) -> list[torch.Tensor] | None:
    """``grad_outputs`` as a list of tensors (None: seeded noise), checked before anything runs.

    Raises:
        TypeError: naming the argument, or the element, that is not a tensor.
    """
    if given is None:
        return None
    if isinstance(given, torch.Tensor):
        return [given]
    if not isinstance(given, (list, tuple)):
        raise TypeError(f"grad_outputs must be a tensor or a sequence of tensors, got {type(given).__name__}")
    for index, item in enumerate(given):
        if not isinstance(item, torch.Tensor):
            raise TypeError(f"grad_outputs[{index}] must be a tensor, got {type(item).__name__}")
    return list(given)


def make_upstream(leaves: dict[str, Any], given: Any) -> list[tuple[str, torch.Tensor]]:
    """The upstream gradient of each output that requires grad: ``given``, or seeded noise.

    Raises:
        RegionError: when ``given`` does not fit the outputs (their count, or an output's
            shape, named with both shapes): the backward, and so the recompute, would not run.
    """
    wanted = [(p, t) for p, t in leaves.items() if isinstance(t, torch.Tensor)
              and t.requires_grad and (t.is_floating_point() or t.is_complex())]
    given_list = given_upstream(given)
    if given_list is not None:
        if len(given_list) != len(wanted):
            raise RegionError(f"grad_outputs has {len(given_list)} tensor(s) but the region "
                              f"returns {len(wanted)} output(s) that require grad")
        for index, ((path, output), grad) in enumerate(zip(wanted, given_list)):
            if grad.shape != output.shape:
                raise RegionError(f"grad_outputs[{index}] has shape {tuple(grad.shape)}, but the output "
                                  f"`{path}` it is the gradient of has shape {tuple(output.shape)}")
        return [(p, g) for (p, _), g in zip(wanted, given_list)]
    upstream = []
    for index, (path, tensor) in enumerate(wanted):
        generator = torch.Generator().manual_seed(0x5EED + index)
        base = torch.randn(tensor.shape, generator=generator, dtype=_drawn_dtype(tensor.dtype))
        upstream.append((path, base.to(dtype=tensor.dtype, device=tensor.device)))
    return upstream


def _drawn_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the upstream noise is drawn in: double precision only for double outputs.

    torch draws ``float32`` normals with a vectorized kernel, about six times as fast as
    ``float64`` ones (1.3 ms against 0.2 ms for an output of 64k elements on one core), and
    a ``float16``/``bfloat16`` output keeps no more of a double draw than of a single one.
    """
    if dtype.is_complex:
        return torch.complex128 if dtype == torch.complex128 else torch.complex64
    return torch.float64 if dtype == torch.float64 else torch.float32
