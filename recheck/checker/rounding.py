"""Rounding or hazard: the one judgement of a value that differs between two runs of one computation.

Two runs that compute the same value in another order (reentrant checkpointing sums a shared weight's
gradient contributions otherwise, a hand-written backward uses another formula) differ in last bits.
Such a difference shrinks with the precision and a hazard's does not, so both runs are made again in
float64: a difference at most :data:`ROUNDING_BOUND` of the largest value of its kind there is rounding.
Where the computation cannot run in float64 (an op rejects it, the code casts to a narrower dtype on
purpose, FSDP2's fixed dtypes), a difference within :data:`SIZE_BOUND` ulp of the largest value of its
kind, in its own dtype, is rounding, and the note names what stopped the rerun.  Rounding is a note with
its size, never a finding and never hidden.

``check_step``'s twin (:mod:`recheck.checker.twin`) and the Function audit
(:mod:`recheck.checker.functions`) both judge through :func:`judge`.
"""

from __future__ import annotations

import functools
import math
import os
import sys
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, TypeVar

import torch

from recheck.findings import Finding, one_line
from recheck.runtime.bits import local_tensor
from recheck.runtime.naming import relative

__all__ = ["ROUNDING_BOUND", "SIZE_BOUND", "NotFloat64", "Values", "in_float64", "judge", "largest"]

#: In the float64 rerun, a difference at most this fraction of the largest value of its kind (the
#: largest gradient, parameter, output ...) is rounding: rounding stays near 1e-16 there, hazards 1e-3 and more.
ROUNDING_BOUND = 2.0**-40
#: Where the computation cannot be rerun in float64: a difference within this many ulp of the largest
#: value of its kind (in the value's own dtype) is rounding.  Accumulation order moves a sum by a few ulp
#: of its largest term; a hazard of 1e-3 is 8000 float32 ulp.
SIZE_BOUND = 16.0

T = TypeVar("T")


class NotFloat64(Exception):
    """A float64 rerun saw its computation give a narrower floating-point result; the message says where."""


def largest(tensors: Iterable[Any]) -> float:
    """The largest finite magnitude among the floating-point tensors (a sharded tensor's local shard:
    an operation on the DTensor would be a collective)."""
    local = [local_tensor(t) for t in tensors if isinstance(t, torch.Tensor)]
    values = [t.detach().abs().max().item() for t in local if t is not None and t.numel() and t.is_floating_point()]
    return max((v for v in values if math.isfinite(v)), default=0.0)


@dataclass
class Values:
    """The values behind findings in one precision: ``pair(finding)`` gives the two runs' tensors (None
    where the finding is not about a computed value), ``measure()`` the largest magnitude of each kind."""

    pair: Callable[[Finding], tuple[torch.Tensor, torch.Tensor] | None]
    measure: Callable[[], Mapping[str, float]]

    @functools.cached_property
    def scales(self) -> Mapping[str, float]:
        """The largest magnitude of each kind, measured once a finding is judged."""
        return self.measure()

    def difference(self, finding: Finding) -> tuple[float, torch.dtype] | None:
        """The greatest absolute difference behind ``finding`` and the dtype it was computed in."""
        pair = self.pair(finding)
        if pair is None:
            return None
        x, y = pair
        if x.shape != y.shape or x.dtype != y.dtype or not x.is_floating_point():
            return None
        delta = (x.detach().double() - y.detach().double()).abs()
        if not bool(torch.isfinite(delta).all()):
            return None
        return float(delta.max()) if delta.numel() else 0.0, x.dtype


class _Narrowing(torch.overrides.TorchFunctionMode):
    """Watches a float64 rerun for the first call of the user's code (not torch's or recheck's) that
    turns float64 input into a narrower floating-point result (an MoE router's ``hidden.float()``):
    past it, the computation rounds as before and the rerun cannot tell rounding from a hazard."""

    first: str | None = None

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        result = func(*args, **(kwargs or {}))
        if self.first is None and isinstance(result, torch.Tensor) and result.is_floating_point() \
                and result.dtype != torch.float64 \
                and any(isinstance(a, torch.Tensor) and a.dtype == torch.float64 for a in args):
            frame = sys._getframe(1)
            while frame is not None and frame.f_code.co_filename.startswith(_INSIDE[:1]):
                frame = frame.f_back  # type: ignore[assignment]
            if frame is not None and not frame.f_code.co_filename.startswith(_INSIDE):
                name = str(getattr(func, "__qualname__", None) or getattr(func, "__name__", None) or func)
                self.first = (f"{name.replace('TensorBase.', 'Tensor.')} computes in "
                              f"{str(result.dtype).removeprefix('torch.')} at "
                              f"{relative(frame.f_code.co_filename)}:{frame.f_lineno}")
        return result


#: torch's and recheck's own folders: their frames are passed over where the user's code is named
_INSIDE = tuple(os.path.dirname(str(m.__file__)) + os.sep for m in (torch, sys.modules["recheck"]))


def _raised_at(error: BaseException) -> str:
    """An error, with the innermost frame of the user's code it came through."""
    frames = [f for f in traceback.extract_tb(error.__traceback__) if not f.filename.startswith(_INSIDE)]
    where = f" in {frames[-1].name} at {relative(frames[-1].filename)}:{frames[-1].lineno}" if frames else ""
    return f"{type(error).__name__}{where}: {one_line(str(error), 200)}"


def in_float64(rerun: Callable[[], T]) -> tuple[T | None, str | None]:
    """``rerun()``'s result, or None and what stopped it from computing in float64: the first call that
    narrowed float64, or the error it raised."""
    narrowing = _Narrowing()
    try:
        with narrowing:
            result = rerun()
    except NotFloat64 as exc:
        return None, narrowing.first or str(exc)
    except Exception as exc:  # noqa: BLE001 - the rerun is an analysis: its failure is reported
        return None, f"the rerun raised {_raised_at(exc)}"
    return (None, narrowing.first) if narrowing.first is not None else (result, None)


def judge(findings: list[Finding], own: Values, wide: Values | None, stopped: str | None, *,
          reference: str, why: str) -> tuple[list[Finding], list[str]]:
    """The findings that stay (a hazard, or nothing to size) and the note on those that are rounding.

    Each finding is judged on its own: against ``wide`` (the float64 rerun of both runs) where it ran,
    by its size in ``own`` where ``stopped`` says why it did not.  ``reference`` names what the values
    differ from, ``why`` what makes the rounding (the end of the note).
    """
    kept: list[Finding] = []
    rounding: list[tuple[str, str, float, float]] = []  # subject, dtype, ulp in it, in float64 (nan: not rerun)
    sized = False
    for finding in findings:
        size = own.difference(finding)
        if size is None or size[0] <= 0:
            kept.append(finding)
            continue
        sized = True
        scale = own.scales.get(finding.kind, 0.0)
        ulps = size[0] / (torch.finfo(size[1]).eps * scale) if scale else math.inf
        if stopped is not None or wide is None:
            ulps64 = math.nan
            rounded = ulps <= SIZE_BOUND
        else:
            size64, scale64 = wide.difference(finding), wide.scales.get(finding.kind, 0.0)
            rounded = size64 is not None and bool(scale64) and size64[0] / scale64 <= ROUNDING_BOUND
            ulps64 = size64[0] / (torch.finfo(torch.float64).eps * scale64) if rounded and size64 else math.nan
        if rounded:
            rounding.append((str(finding.subject), str(size[1]).removeprefix("torch."), ulps, ulps64))
        else:
            kept.append(finding)
    if not rounding:
        return kept, ([f"the differences could not be rerun in float64 ({stopped}); those larger than "
                       f"{SIZE_BOUND:g} ulp of the largest value of their kind are shown as findings"]
                      if stopped is not None and sized else [])
    shown = ", ".join(s for s, *_ in rounding[:4]) + (f" and {len(rounding) - 4} more" if len(rounding) > 4 else "")
    dtypes = "/".join(sorted({r[1] for r in rounding}))
    size_text = f"at most {max(r[2] for r in rounding):.2g} ulp of the largest value of their kind in {dtypes}"
    if stopped is not None:
        how = (f"{size_text}, judged by size (up to {SIZE_BOUND:g} ulp is rounding) as they could not be rerun "
               f"in float64 ({stopped})")
    else:
        how = (f"{size_text}, and {max(r[3] for r in rounding):.2g} ulp in float64 when both runs are rerun in "
               f"float64 (a hazard stays above {ROUNDING_BOUND / torch.finfo(torch.float64).eps:.3g} ulp there)")
    return kept, [f"{len(rounding)} value(s) differ from {reference} only by rounding ({shown}): {how}: {why}"]
