"""The public face of the checker: :func:`check` and :func:`assert_recompute_equal`."""

from __future__ import annotations

from typing import Any, Callable

from recheck.runtime.bits import Tolerance
from recheck.checker.compare import Context
from recheck.checker.message import configuration_text, title
from recheck.checker.run import CheckOptions, RegionError, RunResult, Runner
from recheck.checker.verdict import judge
from recheck.findings import Invocation, RecomputeMismatch, Report
from recheck.runtime.naming import region_name
from recheck.runtime.trees import leaves

__all__ = ["assert_recompute_equal", "check"]


def _tolerance(atol: float | None, rtol: float | None, max_ulp: int | None) -> Tolerance | None:
    if atol is None and rtol is None and max_ulp is None:
        return None
    if max_ulp is not None and (atol is not None or rtol is not None):
        raise ValueError("pass either max_ulp or atol/rtol, not both")
    try:
        return Tolerance(atol=float(atol or 0.0), rtol=float(rtol or 0.0),
                         max_ulp=None if max_ulp is None else int(max_ulp))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"invalid tolerance: {exc}") from None


def _validate(plain: RunResult) -> None:
    import torch

    tensors = [v for _, v in leaves(plain.outputs) if isinstance(v, torch.Tensor)]
    if not tensors:
        raise RegionError(
            f"the region returned no tensor (got {type(plain.outputs).__name__}); "
            "recheck compares what checkpoint recomputes, so the region must return a tensor")
    if not any(t.requires_grad for t in tensors):
        raise RegionError(
            "no output of the region requires grad, so checkpoint would never recompute it; "
            "pass an input with requires_grad=True or use a module with parameters")


def check(fn: Callable[..., Any], *args: Any, use_reentrant: bool = False,
          preserve_rng_state: bool = True, early_stop: bool = True, grad_outputs: Any = None,
          atol: float | None = None, rtol: float | None = None, max_ulp: int | None = None,
          **kwargs: Any) -> Report:
    """Check that checkpointing ``fn(*args, **kwargs)`` recomputes exactly what it computed.

    Runs the region plainly and under ``torch.utils.checkpoint.checkpoint`` with the
    given configuration, compares outputs, gradients, saved tensors, RNG streams,
    buffers, Python state, globals and side effects bit for bit, and restores all of
    it afterwards.  Returns a :class:`~recheck.findings.Report` (``report.ok`` when
    nothing differs).  An exception raised by the region's plain run propagates
    unchanged after the state is restored.  ``atol``/``rtol`` or ``max_ulp`` relax
    floating-point comparisons (default: exact bits).
    """
    __tracebackhide__ = True
    if not callable(fn):
        raise TypeError(f"recheck.check() needs a callable region, got {type(fn).__name__}")
    for name, flag in (("use_reentrant", use_reentrant), ("preserve_rng_state", preserve_rng_state),
                       ("early_stop", early_stop)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be True or False, got {flag!r}")
    options = CheckOptions(use_reentrant=use_reentrant, preserve_rng_state=preserve_rng_state,
                           early_stop=early_stop, grad_outputs=grad_outputs,
                           tolerance=_tolerance(atol, rtol, max_ulp))
    region = region_name(fn)
    runner = Runner(fn, args, kwargs, options)
    replay = None
    try:
        plain = runner.execute("plain")
        if plain.forward_error is not None:
            raise plain.forward_error
        if plain.backward_error is not None:
            raise plain.backward_error
        _validate(plain)
        runner.restore()
        user = runner.execute("user")
        runner.restore()
        replay = runner.replay(user)
    finally:
        runner.restore()
    ctx = Context(region=region, invocation=Invocation(index=1, of=1), tolerance=options.tolerance,
                  use_reentrant=use_reentrant, preserve_rng_state=preserve_rng_state)
    written = frozenset(ref.subject for ref in runner.reach.writes.values())
    findings = judge(ctx, plain, user, replay, runner.buffer_storages(), written)
    notes = []
    if not use_reentrant and user.saved is None:
        notes.append("this torch has no determinism-check registry: saved tensors were "
                     "compared by shape, dtype and device only")
    if replay is not None and replay.stand_in:
        notes.append("early stop ended the recompute; the full replay would have started from "
                     "the plain forward's exact state, so the plain forward's record stands for it")
    elif replay is not None:
        notes.append("early stop ended the recompute; a full replay observed the rest")
    stats = {"runs": 3 if replay is not None and not replay.stand_in else 2,
             "saved_tensors_compared": user.saved.compared if user.saved else 0,
             "modules": len(runner.reach.modules)}
    config = configuration_text(use_reentrant, preserve_rng_state, early_stop, options.tolerance)
    return Report(findings, title=title(region, config), notes=notes, stats=stats)


def assert_recompute_equal(fn: Callable[..., Any], *args: Any, **options: Any) -> None:
    """Like :func:`check`, but raise :class:`~recheck.findings.RecomputeMismatch` on a finding.

    Takes the same arguments and options as :func:`check`; returns None when the
    recomputation matches.  Under pytest the traceback points at the caller's line.
    """
    __tracebackhide__ = True
    report = check(fn, *args, **options)
    if not report.ok:
        raise RecomputeMismatch(report)
