"""The public face of the checker: :func:`check` and :func:`assert_recompute_equal`."""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from recheck.collector import collector_paused
from recheck.checker.twin import given_upstream
from recheck.findings import RecomputeMismatch, Report

__all__ = ["assert_recompute_equal", "assert_step_equal", "check", "check_step"]


def check(fn: Callable[..., Any], /, *args: Any, kwargs: Mapping[str, Any] | None = None,
          use_reentrant: bool = False, preserve_rng_state: bool = True, early_stop: bool = True,
          grad_outputs: Any = None, atol: float | None = None, rtol: float | None = None,
          max_ulp: int | None = None) -> Report:
    """Check that checkpointing ``fn(*args, **kwargs)`` recomputes exactly what it computed.

    A twin check (:func:`check_step`) of the step ``checkpoint(fn, *args, **kwargs)`` with the
    given configuration, then backward with the upstream gradient: run as written inside
    :func:`recheck.watch`, which compares each recompute with its forward (saved tensors, RNG
    streams, globals, parameters, context, side effects), and with the checkpoint bypassed,
    whose outputs, gradients, buffers and Python state it is compared with, bit for bit.  Where
    early stop ended the recompute, a full replay shows what it left out (*latent*).  All of it
    is restored afterwards: a check leaves no trace, also when it raises.

    Args:
        fn: the region: an ``nn.Module`` or any callable (closure, bound method,
            ``functools.partial``, lambda).
        *args: its positional arguments (tensors, nested tuples/lists/dicts of them, ...).
        kwargs: its keyword arguments.  They are kept apart from the options below, so a
            misspelt option is a ``TypeError``, never a keyword the region silently gets.
        use_reentrant, preserve_rng_state, early_stop: the checkpoint configuration checked.
        grad_outputs: the upstream gradient of each output that requires grad (default:
            seeded random tensors, the same in every run): a tensor, or a sequence of one
            tensor per such output, each of that output's shape.
        atol, rtol: a tolerance for floating-point values, given together (as
            ``torch.testing.assert_close`` requires); integer state stays exact.
        max_ulp: a tolerance in units in the last place, instead of ``atol``/``rtol``.

    Returns:
        A :class:`~recheck.findings.Report`; ``report.ok`` when nothing differs.

    Raises:
        TypeError, ValueError: for a bad option, before the region runs.
        RegionError: when the region cannot be checked (no tensor output, nothing requires grad,
            a ``grad_outputs`` whose count or shapes do not fit the outputs: known once the
            plain forward returned, before any backward runs; a ``ValueError``).
        Exception: whatever the region's plain run raises, after the state is restored.

    Example:
        >>> report = recheck.check(block, x, kwargs={"mask": mask})   # doctest: +SKIP
        >>> assert report.ok, report                                   # doctest: +SKIP
    """
    __tracebackhide__ = True
    if not callable(fn):
        raise TypeError(f"recheck.check() needs a callable region, got {type(fn).__name__}")
    for name, flag in (("use_reentrant", use_reentrant), ("preserve_rng_state", preserve_rng_state),
                       ("early_stop", early_stop)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be True or False, got {flag!r}")
    given_upstream(grad_outputs)  # a TypeError now; its shapes are checked against the outputs, before any backward
    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise TypeError(f"recheck.check(): kwargs must be a mapping of the region's keyword arguments, "
                        f"got {type(kwargs).__name__}")
    from recheck.checker.twin import check_region_report
    from recheck.watcher.dispatch import DISPATCHER
    from recheck.watcher.options import WatchOptions

    options = WatchOptions.of(atol=atol, rtol=rtol, max_ulp=max_ulp, where="recheck.check")
    with DISPATCHER.taken_over("recheck.check()"), collector_paused():  # as in check_step
        return check_region_report(fn, args, dict(kwargs or {}), use_reentrant=use_reentrant,
                                   preserve_rng_state=preserve_rng_state, early_stop=early_stop,
                                   grad_outputs=grad_outputs, watch_options=options.as_kwargs(),
                                   tolerance=options.tolerance)


def assert_recompute_equal(fn: Callable[..., Any], /, *args: Any, **options: Any) -> None:
    """Like :func:`check`, but raise :class:`~recheck.findings.RecomputeMismatch` on a finding.

    Takes the same arguments and options as :func:`check` (the region's keyword arguments
    in ``kwargs=``); returns None when the recomputation matches.  Under pytest the
    traceback points at the caller's line.

    Raises:
        RecomputeMismatch: with the full report, when anything differs.
    """
    __tracebackhide__ = True
    report = check(fn, *args, **options)
    if not report.ok:
        raise RecomputeMismatch(report)


def check_step(step: Callable[[], Any], /, *, repeats: int = 1, early_stop: bool | None = None,
               store: str | None = None, atol: float | None = None, rtol: float | None = None,
               max_ulp: int | None = None, checkpoint_functions: Sequence[str] | None = None,
               modules: Sequence[Any] = (), optimizers: Sequence[Any] = ()) -> Report:
    """Check a whole training step against its uncheckpointed twin, bit for bit.

    Snapshots everything the step can touch (parameters, gradients, buffers, module
    attributes, optimizer, scheduler and scaler state, every RNG stream, the globals and plain
    objects it reaches), runs the step **as written** inside :func:`recheck.watch`, restores,
    runs it with **every checkpoint bypassed**, restores, and compares the two end states bit
    for bit.  A difference that is only rounding (gradients summed in another order) is a note
    with its size (:mod:`recheck.checker.rounding`).  The check leaves no trace; Python's cyclic
    garbage collector is paused while it runs, as ``timeit`` pauses it.

    Args:
        step: a zero-argument callable: forward, backward and optionally the optimizer step
            (the contract of ``recheck cost FILE.py:STEP``).
        repeats: runs of the step as written, its noise floor: a difference from the twin within
            what those runs differ by (non-deterministic kernels) is a note, not a finding.  At
            least 2 where parameters are on an accelerator and deterministic algorithms are off.
        early_stop, store: the options of the :func:`recheck.watch` around the step as written.
        atol, rtol: a tolerance for floating-point values, given together (as
            ``torch.testing.assert_close`` requires); max_ulp instead, in units in the last place.
        checkpoint_functions: dotted names of the project's own checkpoint functions (the
            ``checkpoint-functions`` key of ``[tool.recheck]``): watched and bypassed like torch's.
            DeepSpeed's, Megatron's and fairscale's are known already, and a hand-written
            checkpoint nothing names is still seen: a module that runs again during backward
            is compared with its own forward.
        modules, optimizers: state the step uses that cannot be found from it (its closure,
            globals, bound objects and ``functools.partial`` arguments are searched).

    Returns:
        A :class:`~recheck.findings.Report`: the watch's findings and the twins' differences
        (``gradient``, ``state``, ``buffer``, ``rng``, ``output`` ... "from the uncheckpointed step").
        Where the step as written raises (torch's ``CheckpointError``, an error raised during a
        recompute) and its twin without checkpoints completes, the report holds a ``recompute``
        finding "the step fails only when checkpointed", naming the region, the invocation, the
        error, the first saved tensor that differed and the cause the watch saw (a mode or a
        hook in force at forward only, a global, grad mode, autocast, a flag).

    Raises:
        TypeError, ValueError: for a bad option, before the step runs.
        RuntimeError: inside ``measure()``, or inside a checkpointed region's forward or recompute.
            Inside a ``watch()`` block (a test ``pytest --recheck`` watches) it runs: the block's
            interception is set aside for its length, and the block notes that the step was
            checked by it.
        Exception: whatever the step raises where it also fails with every checkpoint bypassed
            (not a checkpointing hazard; a note on the error says so), after the state is restored.

    Example:
        >>> report = recheck.check_step(train_step)     # doctest: +SKIP
        >>> assert report.ok, report                      # doctest: +SKIP
    """
    __tracebackhide__ = True
    if not callable(step):
        raise TypeError(f"recheck.check_step() needs a zero-argument callable step, got {type(step).__name__}")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"recheck.check_step(): repeats must be a whole number of 1 or more, got {repeats!r}")
    from recheck.checker.twin import check_step_report
    from recheck.checker.functions import FunctionCalls, audit_functions
    from recheck.runtime.steps import given_objects
    from recheck.watcher.dispatch import DISPATCHER
    from recheck.watcher.options import WatchOptions

    modules = given_objects(modules, "modules", "recheck.check_step()")
    optimizers = given_objects(optimizers, "optimizers", "recheck.check_step()")

    options = WatchOptions.of(early_stop=early_stop, store=store, atol=atol, rtol=rtol, max_ulp=max_ulp,
                              checkpoint_functions=checkpoint_functions, where="recheck.check_step")
    # no cyclic collection while the step and its twin run (on again after, if it was on): the
    # snapshots' records survive into the oldest generation, whose collection walks every object
    with DISPATCHER.taken_over("recheck.check_step()"), collector_paused(), FunctionCalls() as functions:
        report = check_step_report(step, repeats=repeats, tolerance=options.tolerance,
                                   watch_options=options.as_kwargs(), modules=modules, optimizers=optimizers)
    report.extend(audit_functions(functions))  # each custom autograd.Function the step ran (never raises)
    return report


def assert_step_equal(step: Callable[[], Any], /, **options: Any) -> None:
    """Like :func:`check_step`, but raise :class:`~recheck.findings.RecomputeMismatch` on a finding.

    Raises:
        RecomputeMismatch: with the full report, when anything differs.
    """
    __tracebackhide__ = True
    report = check_step(step, **options)
    if not report.ok:
        raise RecomputeMismatch(report)
