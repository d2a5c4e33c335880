"""The Function audit: a custom ``torch.autograd.Function``'s hand-written backward against autograd.

A Function whose ``backward`` recomputes part of its forward by hand, or writes into a leaf's
``.grad`` and returns it too, makes no checkpoint call: no twin can bypass it.  But what it must
compute is known: autograd's gradient of the same forward.  :func:`check_function` runs
``Fn.apply`` and backward from a seeded upstream gradient, then ``Fn.forward`` under autograd (a
stand-in ``ctx``), both on fresh copies, and compares the gradients bit for bit; where they differ,
:func:`~recheck.checker.rounding.judge` tells rounding from a hazard.  A forward autograd cannot
differentiate is "not audited", with the reason, never guessed.

:class:`FunctionCalls` keeps a copy of the first call's arguments of every Function outside torch
while a step runs; :func:`audit_functions` audits them.  RNG streams and the default dtype are put
back; the caller's tensors are never handed to the Function."""

from __future__ import annotations

import dataclasses
import functools
import inspect
from dataclasses import dataclass, field
from typing import Any, Iterable

import torch

from recheck.checker.compare import Context, compare_grads
from recheck.checker.rounding import NotFloat64, Values, in_float64, judge, largest
from recheck.findings import Report, could_not, error_line
from recheck.runtime.bits import bits_equal
from recheck.runtime.naming import grad_subject, region_name
from recheck.runtime.rng import RngRecord

__all__ = ["FunctionCall", "FunctionCalls", "audit_functions", "check_function"]

_HINT = ("a hand-written backward must return autograd's gradient of its forward: check what it recomputes "
         "from saved tensors and whether it writes into an input's .grad (a straight-through or reversed "
         "gradient differs by design)")


class NotAudited(Exception):
    """Autograd cannot differentiate the Function's forward as it runs; the message says why."""


@dataclass
class FunctionCall:
    """One call of a Function: its class and its arguments (tensors as detached copies)."""

    function: type[torch.autograd.Function]
    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, function: type[torch.autograd.Function], args: Iterable[Any], kwargs: dict[str, Any]) -> FunctionCall:
        """A call whose tensors are copied now (later in-place writes do not reach the copies)."""
        return cls(function, tuple(_copy(a) for a in args), {k: _copy(v) for k, v in kwargs.items()})


def _copy(value: Any, grad: bool | None = None, float64: bool = False) -> Any:
    """A tensor as a fresh leaf of the same values (``grad``: whether it requires grad, else as
    ``value`` does); anything else as it is."""
    if not isinstance(value, torch.Tensor):
        return value
    with torch.no_grad():
        copy = value.detach().clone()
        if float64 and copy.is_floating_point():
            copy = copy.to(torch.float64)
    wanted = value.requires_grad if grad is None else grad
    return copy.requires_grad_(wanted and (copy.is_floating_point() or copy.is_complex()))


def _setup_context_style(function: type) -> bool:
    """Whether ``forward`` takes no ``ctx`` (the Function overrides ``setup_context``)."""
    owner = next(c for c in function.__mro__ if "setup_context" in vars(c))
    return not owner.__module__.startswith("torch.")


class _Ctx:
    """Stands for ``ctx`` while ``Fn.forward`` runs under autograd: it keeps what forward saves
    and refuses what autograd cannot follow (an input marked dirty, a non-tensor saved)."""

    def __init__(self, needs_input_grad: tuple[bool, ...]) -> None:
        self.needs_input_grad = needs_input_grad
        self.saved_tensors: tuple[Any, ...] = ()
        self.non_differentiable: list[torch.Tensor] = []

    def save_for_backward(self, *tensors: Any) -> None:
        for value in tensors:
            if value is not None and not isinstance(value, torch.Tensor):
                raise NotAudited(f"its forward saves a {type(value).__name__} with ctx.save_for_backward")
        self.saved_tensors = tensors

    save_for_forward = save_for_backward

    def mark_dirty(self, *tensors: Any) -> None:
        raise NotAudited("its forward writes into an input in place (ctx.mark_dirty)")

    def mark_non_differentiable(self, *tensors: Any) -> None:
        if not all(isinstance(t, torch.Tensor) for t in tensors):
            raise NotAudited("its forward marks a non-tensor as non-differentiable")
        self.non_differentiable += tensors

    def set_materialize_grads(self, value: bool) -> None:
        pass


def _names(call: FunctionCall) -> list[tuple[str, Any]]:
    """``(name, key)`` of every tensor argument: its parameter's name in ``forward`` where the
    signature tells it (``weight``), else its path (``args[1]``); ``key`` is an index or a keyword."""
    try:
        parameters = list(inspect.signature(call.function.forward).parameters.values())
    except (TypeError, ValueError):
        parameters = []
    if not _setup_context_style(call.function):
        parameters = parameters[1:]
    positional = [p.name for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    named = [(positional[i] if i < len(positional) else f"args[{i}]", i)
             for i, a in enumerate(call.args) if isinstance(a, torch.Tensor)]
    return named + [(k, k) for k, v in call.kwargs.items() if isinstance(v, torch.Tensor)]


def _differentiated(call: FunctionCall) -> list[tuple[str, Any]]:
    """The tensor arguments audited: those that required grad at the call, or, where none did
    (a call under ``no_grad``, a direct check of plain tensors), every floating-point one."""
    def value(key: Any) -> torch.Tensor:
        return call.args[key] if isinstance(key, int) else call.kwargs[key]

    floating = [(n, k) for n, k in _names(call) if value(k).is_floating_point()]
    return [(n, k) for n, k in floating if value(k).requires_grad] or floating


def _tensors(output: Any) -> list[Any]:
    return list(output) if isinstance(output, tuple) else [output]


def _run(call: FunctionCall, keys: list[tuple[str, Any]], rng: RngRecord, by_hand: bool, float64: bool,
         upstream: list[torch.Tensor] | None,
         wrote: list[str]) -> tuple[list[Any], list[torch.Tensor], dict[str, Any]]:
    """One run of the Function from fresh copies: its outputs, the upstream gradient (seeded on
    the first run) and each audited argument's gradient (None where it has none); ``wrote``
    gets the arguments whose ``.grad`` the hand-written backward wrote itself."""
    wanted = {k for _, k in keys}
    args = [_copy(a, i in wanted, float64) for i, a in enumerate(call.args)]
    kwargs = {k: _copy(v, k in wanted, float64) for k, v in call.kwargs.items()}
    leaves = [args[k] if isinstance(k, int) else kwargs[k] for _, k in keys]
    rng.restore()  # both forwards draw the same random numbers
    if by_hand:
        outputs = _tensors(call.function.apply(*args, **kwargs))
        differentiable = [o for o in outputs if isinstance(o, torch.Tensor) and o.requires_grad]
    else:
        ctx = _Ctx(tuple(isinstance(a, torch.Tensor) and a.requires_grad for a in args))
        versions = [t._version for t in leaves]
        style = _setup_context_style(call.function)
        with torch.enable_grad():
            output = (call.function.forward(*args, **kwargs) if style
                      else call.function.forward(ctx, *args, **kwargs))
        if style:  # what it marks (non-differentiable outputs) it marks here
            call.function.setup_context(ctx, tuple(args), output)
        outputs = _tensors(output)
        if versions != [t._version for t in leaves]:
            raise NotAudited("its forward writes into an input in place")
        skipped = {id(t) for t in ctx.non_differentiable}
        differentiable = [o for o in outputs if isinstance(o, torch.Tensor) and id(o) not in skipped
                          and (o.is_floating_point() or o.is_complex())]
    if not differentiable:
        raise NotAudited("none of its outputs requires grad")
    if upstream is None:
        generator = torch.Generator().manual_seed(0)
        upstream = [torch.randn(o.shape, generator=generator, dtype=o.dtype if o.is_complex() else torch.float64)
                    .to(dtype=o.dtype, device=o.device) for o in differentiable]
    grads = [g.to(torch.float64) if float64 and g.is_floating_point() else g for g in upstream]
    if len(grads) != len(differentiable):
        raise NotAudited(f"its forward gives {len(differentiable)} differentiable outputs under autograd, "
                         f"{len(grads)} as it runs")
    if by_hand:
        # a tensor hook runs before the returned gradient is accumulated: a .grad there was written by backward
        def seen(name: str, leaf: torch.Tensor, grad: torch.Tensor) -> None:
            if leaf.grad is not None:
                wrote.append(name)

        hooks = [leaf.register_hook(functools.partial(seen, n, leaf)) for (n, _), leaf in zip(keys, leaves)]
        try:
            torch.autograd.backward(differentiable, grads, inputs=leaves)
        finally:
            for hook in hooks:
                hook.remove()
        found = [leaf.grad for leaf in leaves]
    else:
        for index, output in enumerate(differentiable):
            if output.grad_fn is None:
                raise NotAudited(f"its output {index} has no autograd path from the inputs (its forward detaches, "
                                 "runs under no_grad or calls ops autograd cannot differentiate)")
        try:
            found = list(torch.autograd.grad(differentiable, leaves, grads, allow_unused=True))
        except RuntimeError as exc:
            raise NotAudited(f"autograd cannot differentiate its forward ({error_line(exc)})") from exc
    return outputs, upstream, {name: grad for (name, _), grad in zip(keys, found)}


def _both(call: FunctionCall, keys: list[tuple[str, Any]], rng: RngRecord,
          float64: bool, wrote: list[str] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """The gradients ``Fn.backward`` gives and the ones autograd gives through ``Fn.forward``."""
    default = torch.get_default_dtype()
    if float64:
        torch.set_default_dtype(torch.float64)  # tensors forward makes itself are float64 too
    try:
        outputs, upstream, hand = _attempt(f"{call.function.__qualname__}.apply raised {{}}", _run, call, keys, rng,
                                           True, float64, None, [] if wrote is None else wrote)
        again, _, auto = _attempt("its forward fails when run under autograd with a stand-in ctx ({})", _run, call,
                                  keys, rng, False, float64, upstream, [])
    finally:
        torch.set_default_dtype(default)
    for index, (a, b) in enumerate(zip(outputs, again)):
        if isinstance(a, torch.Tensor) and (not isinstance(b, torch.Tensor) or not bits_equal(a.detach(), b.detach())):
            raise NotAudited(f"its output {index} differs when its forward runs again under autograd")
    if float64 and any(isinstance(o, torch.Tensor) and o.is_floating_point() and o.dtype != torch.float64
                       for o in outputs):
        raise NotFloat64("its forward computes in another dtype than float64 when its inputs are float64")
    return hand, auto


def _attempt(failure: str, run: Any, *args: Any) -> Any:
    """``run(*args)``; its own failure is :class:`NotAudited`, ``failure`` naming the error."""
    try:
        return run(*args)
    except NotAudited:
        raise
    except Exception as exc:  # noqa: BLE001 - the Function's own failure: reported, never raised
        raise NotAudited(failure.format(error_line(exc))) from exc


def _audit(call: FunctionCall) -> Report:
    """The findings and notes of one Function call."""
    where = region_name(call.function.backward)
    ctx = Context(region=where, invocation=None, tolerance=None, use_reentrant=False, preserve_rng_state=None)
    keys = _differentiated(call)
    if not keys:
        return Report(notes=[f"{where}: not audited: no floating-point tensor argument"])
    rng = RngRecord({})
    wrote: list[str] = []
    try:
        hand, auto = _both(call, keys, rng, False, wrote)
    except NotAudited as exc:
        return Report(notes=[f"{where}: not audited: {exc}"])
    finally:
        rng.restore()
    notes, findings, compared = [], [], {}
    for name, _ in keys:
        h, a = hand[name], auto[name]
        if a is None and h is not None and bool(h.detach().ne(0).any()):
            notes.append(f"{where}: {grad_subject(name)} not audited: its forward has no autograd path from "
                         f"`{name}`, its backward gives it a gradient")
        elif h is None and a is not None and bool(a.detach().ne(0).any()):
            findings.append(ctx.finding("gradient", grad_subject(name), f"{grad_subject(name)} is None from "
                                        f"{where.split(' ')[0]}; autograd's is a tensor"))
        elif h is not None and a is not None:
            compared[name] = (a, h)
    findings += compare_grads(ctx, {f"`{n}`": a for n, (a, _) in compared.items()},
                              {f"`{n}`": h for n, (_, h) in compared.items()},
                              labels=("autograd through its forward", "its backward"), reference="autograd")
    rounding: list[str] = []
    if any(f.subject in {grad_subject(n) for n in compared} for f in findings):
        wide, stopped = in_float64(lambda: _rerun64(call, keys, rng, compared))
        findings, rounding = judge(findings, _values(compared), wide, stopped, reference="autograd's",
                                   why="its backward computes the same gradient by another formula, which is not a hazard")
        rounding = [f"{where}: {note}" for note in rounding]
    for index, finding in enumerate(findings):
        writer = next((n for n in wrote if grad_subject(n) == finding.subject), None)
        detail = (f"its backward wrote `{writer}.grad` itself and returned a gradient for `{writer}` too, which "
                  f"autograd accumulated into it again\n{finding.detail}") if writer else finding.detail
        findings[index] = dataclasses.replace(finding, hint=_HINT, detail=detail)
    return Report(findings, notes=notes + rounding)


def _values(compared: dict[str, tuple[Any, Any]]) -> Values:
    """Autograd's and the backward's gradients by finding subject, and the largest of autograd's."""
    pairs = {str(grad_subject(n)): pair for n, pair in compared.items() if pair[0] is not None and pair[1] is not None}
    return Values(lambda finding: pairs.get(str(finding.subject)),
                  lambda: {"gradient": largest(a for a, _ in pairs.values())})


def _rerun64(call: FunctionCall, keys: list[tuple[str, Any]], rng: RngRecord,
             compared: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> Values:
    """Both gradients again, every floating-point argument and the default dtype in float64."""
    try:
        hand, auto = _both(call, keys, rng, True)
    finally:
        rng.restore()
    return _values({n: (auto[n], hand[n]) for n in compared})


def audit_functions(calls: Iterable[FunctionCall]) -> Report:
    """The audit of each call (:func:`check_function`'s findings and notes); never raises."""
    report = Report(notes=getattr(calls, "notes", ()))
    for call in calls:
        try:
            report.extend(_audit(call))
        except Exception as exc:  # noqa: BLE001 - recheck's own failure is a note
            report.notes.append(could_not(f"audit {getattr(call.function, '__qualname__', call.function)}", exc))
    return report


def check_function(function: type, /, *args: Any, **kwargs: Any) -> Report:
    """Compare a custom ``torch.autograd.Function``'s backward with autograd's gradient of its forward.

    Runs ``function.apply(*args, **kwargs)`` on copies of the tensors and backward from a seeded
    upstream gradient, then ``function.forward`` again under autograd on fresh copies, and compares
    the gradient each copy holds, bit for bit: of the arguments that require grad (every
    floating-point tensor argument where none does).  A difference that is rounding (float64
    rerun) is a note with its size; one that is not is a ``gradient`` finding naming the
    Function's ``backward`` and its ``file:line``.  A forward autograd cannot differentiate is a
    note, "not audited", with the reason.  The caller's tensors are never passed to the Function
    and every RNG stream is put back.

    Raises:
        TypeError: ``function`` is not a subclass of ``torch.autograd.Function``.
    """
    if not (isinstance(function, type) and issubclass(function, torch.autograd.Function)):
        raise TypeError(f"recheck.check_function() needs a torch.autograd.Function subclass, got {function!r}")
    report = audit_functions([FunctionCall.of(function, args, kwargs)])
    report.title = (f"function       {region_name(function.backward)}\n"
                    "compared with  autograd's gradient through its forward, bit for bit")
    return report


class FunctionCalls:
    """While active (a ``with`` block), the first call of every Function subclass outside torch
    and recheck, its tensors copied (a call that passes a callable, a checkpoint implementation
    running its region, is left to ``check_step``'s twin)."""

    def __init__(self) -> None:
        self.calls: dict[type, FunctionCall] = {}
        self.notes: list[str] = []
        self._patched: list[tuple[type, Any]] = []

    def __iter__(self) -> Any:
        return iter(list(self.calls.values()))

    def __enter__(self) -> FunctionCalls:
        try:  # every original first (a subclass may inherit a forward patched below), then the patches
            found = [(c, inspect.getattr_static(c, "forward")) for c in _subclasses(torch.autograd.Function)
                     if not str(getattr(c, "__module__", "")).startswith(("torch.", "recheck."))]
            for function, forward in found:
                if isinstance(forward, staticmethod) and not str(forward.__func__.__module__).startswith("torch."):
                    original = vars(function).get("forward")
                    setattr(function, "forward", staticmethod(self._recording(function, forward.__func__)))
                    self._patched.append((function, original))
        except Exception as exc:  # noqa: BLE001 - recheck's own failure is a note; the step runs on
            self.notes.append(could_not("observe the custom autograd Functions the step runs", exc))
        return self

    def __exit__(self, *exc: Any) -> None:
        for function, original in reversed(self._patched):
            if original is None:
                delattr(function, "forward")
            else:
                setattr(function, "forward", original)
        self._patched = []

    def _recording(self, function: type, forward: Any) -> Any:
        skip = 0 if _setup_context_style(function) else 1

        @functools.wraps(forward)
        def recorded(*args: Any, **kwargs: Any) -> Any:
            if function not in self.calls and not torch.compiler.is_compiling():
                try:
                    if not any(callable(a) for a in (*args[skip:], *kwargs.values())):
                        self.calls[function] = FunctionCall.of(function, args[skip:], kwargs)
                except Exception as exc:  # noqa: BLE001 - recheck's own failure is a note
                    self.notes.append(could_not(f"copy the arguments of {function.__qualname__}", exc))
            return forward(*args, **kwargs)

        return recorded


def _subclasses(base: type) -> list[type]:
    found: dict[type, None] = {}
    stack: list[type] = list(base.__subclasses__())
    while stack:
        cls = stack.pop()
        if cls not in found:
            found[cls] = None
            stack.extend(cls.__subclasses__())
    return list(found)
