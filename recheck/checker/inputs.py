"""The region's inputs for one run, and the upstream gradient its outputs receive.

:func:`prepare_inputs` gives every run fresh leaves for inputs that require grad;
:func:`arguments_print` summarises the arguments' structure and non-tensor values;
:func:`make_upstream` builds the fixed, seeded upstream gradient both runs share.
"""

from __future__ import annotations

from typing import Any

import torch

from recheck.checker.values import fingerprint

__all__ = ["RegionError", "arguments_print", "make_upstream", "prepare_inputs"]


class RegionError(ValueError):
    """The region cannot be checked as given (no tensor output, nothing requires grad)."""


def prepare_inputs(args: tuple, kwargs: dict) -> tuple[tuple, dict, dict[str, torch.Tensor]]:
    """Fresh leaves for inputs that require grad, so user tensors keep their ``.grad``."""
    leaves: dict[str, torch.Tensor] = {}

    def convert(value: Any, path: str) -> Any:
        if isinstance(value, torch.Tensor):
            if not value.requires_grad:
                return value
            leaf = value.detach().requires_grad_(True)
            leaves[path] = leaf
            return leaf if value.is_leaf else leaf.clone()
        if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
            return type(value)(convert(v, f"{path}[{i}]") for i, v in enumerate(value))
        if isinstance(value, dict):
            return type(value)((k, convert(v, f"{path}[{k!r}]")) for k, v in value.items())
        return value

    fresh_args = tuple(convert(a, f"args[{i}]") for i, a in enumerate(args))
    fresh_kwargs = {k: convert(v, f"kwargs[{k!r}]") for k, v in kwargs.items()}
    return fresh_args, fresh_kwargs, leaves


def arguments_print(args: tuple, kwargs: dict) -> Any:
    """The arguments' structure and non-tensor values; tensors by identity (bytes apart)."""
    def walk(value: Any, depth: int) -> Any:
        if isinstance(value, torch.Tensor):
            return ("tensor", id(value))
        if depth > 0 and isinstance(value, (list, tuple)):
            return (type(value).__name__, tuple(walk(v, depth - 1) for v in value))
        if depth > 0 and isinstance(value, dict):
            return ("dict", tuple((fingerprint(k, 1), walk(v, depth - 1)) for k, v in value.items()))
        return fingerprint(value)

    return walk(args, 4), walk(kwargs, 4)


def make_upstream(leaves: dict[str, Any], given: Any) -> list[tuple[str, torch.Tensor]]:
    """The upstream gradient of each output that requires grad: ``given``, or seeded noise."""
    wanted = [(p, t) for p, t in leaves.items() if isinstance(t, torch.Tensor)
              and t.requires_grad and (t.is_floating_point() or t.is_complex())]
    if given is not None:
        given_list = [given] if isinstance(given, torch.Tensor) else list(given)
        if len(given_list) != len(wanted):
            raise RegionError(f"grad_outputs has {len(given_list)} tensor(s) but the region "
                              f"returns {len(wanted)} output(s) that require grad")
        return [(p, g) for (p, _), g in zip(wanted, given_list)]
    upstream = []
    for index, (path, tensor) in enumerate(wanted):
        generator = torch.Generator().manual_seed(0x5EED + index)
        base = torch.randn(tensor.shape, generator=generator,
                           dtype=torch.complex128 if tensor.is_complex() else torch.float64)
        upstream.append((path, base.to(dtype=tensor.dtype, device=tensor.device)))
    return upstream
