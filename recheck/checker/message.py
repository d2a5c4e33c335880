"""The text of a check: region and configuration lines, per-state detail blocks, hints.

The first line of a failing report (``recheck: recomputation differs from the
original forward``) and the numbered entries come from :class:`recheck.findings.Report`;
this module writes what goes inside them (hints come from the rule registry,
:func:`recheck.catalogue.hint`), in the style of
``torch.testing.assert_close``: what the state is, how many elements differ, the first
differing index with both values and bit patterns, the greatest absolute difference.
"""

from __future__ import annotations

import inspect
import os
from typing import Any, Callable

__all__ = ["configuration_text", "region_name", "title", "value_detail"]

def _unwrap(fn: Any) -> Any:
    seen = 0
    while seen < 8:
        seen += 1
        if hasattr(fn, "func") and callable(getattr(fn, "func")) and hasattr(fn, "args"):
            fn = fn.func  # functools.partial
        elif inspect.ismethod(fn):
            fn = fn.__func__
        else:
            break
    return fn


def region_name(fn: Callable[..., Any], root: str | None = None) -> str:
    """``Qual.name (file:line)`` of the region's definition (a module: its ``forward``)."""
    import torch

    target = _unwrap(fn)
    label = getattr(target, "__qualname__", None) or type(target).__qualname__
    if isinstance(target, torch.nn.Module):
        label = type(target).__qualname__
        target = type(target).forward
    elif not inspect.isfunction(target) and callable(target) and not inspect.isbuiltin(target):
        label = type(target).__qualname__
        target = getattr(type(target), "__call__", target)
    code = getattr(target, "__code__", None)
    if code is None:
        return label
    path = code.co_filename
    base = root or os.getcwd()
    try:
        rel = os.path.relpath(path, base)
        path = path if rel.startswith("..") else rel
    except ValueError:  # another drive on Windows
        pass
    return f"{label} ({path}:{code.co_firstlineno})"


def configuration_text(use_reentrant: bool, preserve_rng_state: bool, early_stop: bool,
                       tolerance: Any = None) -> str:
    """``use_reentrant=False, preserve_rng_state=True, early_stop=True``."""
    text = f"use_reentrant={use_reentrant}, preserve_rng_state={preserve_rng_state}"
    if not use_reentrant:
        text += f", early_stop={early_stop}"
    if tolerance is not None:
        text += f", tolerance: {tolerance}"
    return text


def title(region: str, configuration: str) -> str:
    """The block under the first line: region, then configuration."""
    return f"region         {region}\nconfiguration  {configuration}"


def value_detail(original: str, recomputed: str, labels: tuple[str, str] = ("original", "recomputed")) -> str:
    """``original 3 != recomputed 4`` for non-tensor state."""
    return f"{labels[0]} {original} != {labels[1]} {recomputed}"
