"""Prototype: see recomputations made by checkpoint implementations nobody intercepts.

Issue 12: "a module forward that runs while autograd executes a backward is a
recomputation; match it to that module's forward by instance and order, and compare".

A process-wide forward pre-hook and forward hook (``register_module_forward_pre_hook`` /
``register_module_forward_hook``) see every module call.  A call is a *recompute* when
``torch._C._current_graph_task_id() != -1`` (the autograd engine is running a graph task on
this thread).  The enclosing ``torch.autograd.Function`` is found on the Python stack: its
``forward``/``backward`` frame has a local ``ctx`` that is the ``<Class>Backward`` node
(``torch.autograd.function.BackwardCFunction``), whose ``_forward_cls`` is the Function.
The *region* is the outermost module called inside that frame; each region call records
the context (grad mode, autocast enabled/dtype per device type, autocast cache, default
dtype), the CPU RNG state at entry and exit, and the output bytes.  A recompute is matched
to a forward of the same module instance whose inputs share storage with the recompute's
(hand-written Functions save the inputs and detach them: same data pointers), else to the
latest unmatched forward of that instance (backward runs regions last-first).

Not part of recheck; run ``python recompute_probe.py`` for the fixtures' results.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import sys
import weakref
from typing import Any, Iterator

import torch
from torch.autograd.function import BackwardCFunction
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

DEVICE_TYPES = ("cpu", "cuda")


def autocast_state() -> dict[str, tuple[bool, torch.dtype]]:
    return {d: (torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)) for d in DEVICE_TYPES}


def context() -> dict[str, Any]:
    """What decides how a region computes, besides its inputs and state."""
    return {
        "grad_enabled": torch.is_grad_enabled(),
        "autocast": autocast_state(),
        "autocast_cache_enabled": torch.is_autocast_cache_enabled(),
        "default_dtype": torch.get_default_dtype(),
    }


def _tensor_bytes(value: Any) -> list[tuple]:
    if isinstance(value, torch.Tensor):
        t = value.detach()
        return [(t.dtype, tuple(t.shape), t.reshape(-1).contiguous().view(torch.uint8).clone() if t.numel() else None)]
    if isinstance(value, (list, tuple)):
        return [b for v in value for b in _tensor_bytes(v)]
    if isinstance(value, dict):
        return [b for v in value.values() for b in _tensor_bytes(v)]
    return []


def _same_bytes(a: list[tuple], b: list[tuple]) -> bool:
    return len(a) == len(b) and all(
        x[0] == y[0] and x[1] == y[1] and (x[2] is None) == (y[2] is None) and (x[2] is None or torch.equal(x[2], y[2]))
        for x, y in zip(a, b))


def enclosing_function(frame) -> tuple[type | None, str | None, str | None]:
    """The autograd.Function whose forward/backward frame encloses ``frame``: (class, phase, file:line)."""
    while frame is not None:
        ctx = frame.f_locals.get("ctx") if frame.f_code.co_name in ("forward", "backward") else None
        if isinstance(ctx, BackwardCFunction):
            cls = ctx._forward_cls
            try:
                site = f"{inspect.getsourcefile(cls)}:{inspect.getsourcelines(cls)[1]}"
            except (OSError, TypeError):
                site = None
            return cls, frame.f_code.co_name, site
        frame = frame.f_back
    return None, None, None


def _digest(value: Any) -> tuple:
    """dtype, shape and a hash of the bytes of every tensor in ``value`` (nested lists/tuples/dicts)."""
    import hashlib

    out = []
    for dtype, shape, data in _tensor_bytes(value):
        out.append((dtype, shape, None if data is None else hashlib.blake2b(data.numpy().tobytes()).hexdigest()))
    return tuple(out)


@dataclasses.dataclass
class ModuleCall:
    module: weakref.ref
    key: int                        # id(module) at the call (the weakref may be dead by the time of a report)
    name: str
    phase: str                      # "forward" or "recompute"
    context: dict[str, Any]
    input_ptrs: tuple[int, ...]
    rng_in: torch.Tensor
    function: type | None = None    # recompute only: the enclosing autograd.Function, if any
    site: str | None = None
    driver: str | None = None       # recompute only: the frame that ran it when no Function encloses it
    rng_out: torch.Tensor | None = None
    output: tuple | None = None     # None: the call raised (early stop) or is still running
    matched: "ModuleCall | None" = None
    match_by: str | None = None


@dataclasses.dataclass
class Difference:
    region: str
    function: str
    site: str | None
    what: str


def _driver(frame) -> str | None:
    """For a recompute with no enclosing Function: the first Python frame the autograd engine called.

    The engine calls Python back (a Function's backward, a saved-tensor unpack hook, a tensor
    grad hook) from C++; that callback's ``f_back`` is the frame that entered the engine
    (``torch/autograd/graph.py:_engine_run_backward``).
    """
    while frame is not None and frame.f_back is not None:
        outer = frame.f_back
        if outer.f_code.co_name == "_engine_run_backward":
            path = frame.f_code.co_filename
            short = path.rsplit("/site-packages/", 1)[-1]
            return f"{short}:{frame.f_lineno} {frame.f_code.co_qualname if hasattr(frame.f_code, 'co_qualname') else frame.f_code.co_name}"
        frame = outer
    return None


class Probe:
    """Records every module call in forward, and the outermost module calls made in backward."""

    def __init__(self, *roots: torch.nn.Module) -> None:
        self.names = {id(m): n or type(m).__name__ for root in roots for n, m in root.named_modules()}
        self.calls: list[ModuleCall] = []
        self._stack: list[ModuleCall | None] = []   # one entry per module call in progress
        self._recomputing = 0

    # hooks -----------------------------------------------------------------------------
    def _pre(self, module, args):
        backward = torch._C._current_graph_task_id() != -1
        if backward and self._recomputing:
            self._stack.append(None)            # inside a recomputed region: its outermost call is compared
            return
        call = ModuleCall(
            module=weakref.ref(module), key=id(module), name=self.names.get(id(module), type(module).__name__),
            phase="recompute" if backward else "forward", context=context(),
            input_ptrs=tuple(a.data_ptr() for a in args if isinstance(a, torch.Tensor)),
            rng_in=torch.get_rng_state())
        if backward:
            frame = sys._getframe(1)
            call.function, _, call.site = enclosing_function(frame)
            if call.function is None:
                call.driver = _driver(frame)
            self._recomputing += 1
            self._match(call)
        self.calls.append(call)
        self._stack.append(call)

    def _post(self, module, args, output):
        call = self._stack.pop()
        if call is None:
            return
        if call.phase == "recompute":
            self._recomputing -= 1
        call.rng_out = torch.get_rng_state()
        if output is not None:
            call.output = _digest(output)

    @contextlib.contextmanager
    def watching(self) -> Iterator["Probe"]:
        pre = register_module_forward_pre_hook(self._pre)
        post = register_module_forward_hook(self._post, always_call=True)
        try:
            yield self
        finally:
            pre.remove()
            post.remove()

    # matching and comparison ---------------------------------------------------------
    def _match(self, rec: ModuleCall) -> None:
        """Match a recompute, as it starts, to a forward call of the same module instance.

        First choice: an unmatched forward whose tensor inputs have the recompute's data
        pointers (saved inputs are detached views of the same storage); else the latest
        unmatched forward (backward recomputes regions last-first).  Done while the module
        is alive, so that ``id()`` cannot have been reused.
        """
        taken = {id(c.matched) for c in self.calls if c.matched is not None}
        candidates = [c for c in self.calls if c.phase == "forward" and c.key == rec.key and id(c) not in taken]
        by_ptr = [f for f in candidates if f.input_ptrs == rec.input_ptrs]
        if by_ptr:
            rec.matched, rec.match_by = by_ptr[-1], "input storage"
        elif candidates:
            rec.matched, rec.match_by = candidates[-1], "order (latest unmatched forward)"

    def recomputes(self) -> list[ModuleCall]:
        return [c for c in self.calls if c.phase == "recompute"]

    def differences(self) -> list[Difference]:
        found = []
        for rec in self.recomputes():
            fn = rec.function.__qualname__ if rec.function else (rec.driver or "?")
            fwd = rec.matched
            if fwd is None:
                found.append(Difference(rec.name, fn, rec.site, "recompute matches no forward"))
                continue
            for key in ("autocast", "autocast_cache_enabled", "default_dtype"):
                if fwd.context[key] != rec.context[key]:
                    found.append(Difference(rec.name, fn, rec.site,
                                            f"context {key}: forward {fwd.context[key]} vs recompute {rec.context[key]}"))
            used_rng = fwd.rng_out is not None and not torch.equal(fwd.rng_in, fwd.rng_out)
            if used_rng and not torch.equal(fwd.rng_in, rec.rng_in):
                found.append(Difference(rec.name, fn, rec.site,
                                        "cpu RNG: the region draws random numbers and the recompute starts "
                                        "from another RNG state than its forward"))
            if fwd.output is not None and rec.output is not None and fwd.output != rec.output:
                found.append(Difference(rec.name, fn, rec.site, "output differs from its forward's"))
        return found

    def summary(self) -> str:
        rec = self.recomputes()
        fwd = sum(c.phase == "forward" for c in self.calls)
        drivers = sorted({c.function.__qualname__ if c.function else f"no Function ({c.driver})" for c in rec})
        by = sorted({c.match_by for c in rec if c.match_by})
        early = sum(c.output is None for c in rec)
        return (f"{fwd} module forward(s) recorded, {len(rec)} recompute(s) ({early} without output: early stop), "
                f"{sum(c.matched is not None for c in rec)} matched (by {', '.join(by) or '-'}); "
                f"recomputed by: {', '.join(drivers) or '-'}")


def probe_step(step, model) -> Probe:
    probe = Probe(model)
    with probe.watching():
        step()
    return probe


def _report(title, build) -> None:
    step, model = build()[:2]
    torch.manual_seed(1234)
    probe = probe_step(step, model)
    diffs = probe.differences()
    print(f"== {title}\n  {probe.summary()}\n  {len(diffs)} difference(s)")
    seen = {}
    for d in diffs:
        seen.setdefault((d.function, d.site, d.what), []).append(d.region)
    for (fn, site, what), regions in seen.items():
        print(f"    {what}  [{fn} at {site}; regions: {', '.join(regions)}]")


if __name__ == "__main__":
    from twin import load_fixture

    print(f"torch {torch.__version__}")
    diffusion = load_fixture("diffusion_checkpoint")
    amp = load_fixture("amp_checkpoint")
    moe = load_fixture("moe_router")
    levit = load_fixture("levit_cache")
    _report("diffusion_checkpoint.step (no RNG restore)", diffusion.make_step)
    _report("diffusion_checkpoint.fixed_step", lambda: diffusion.make_step(fixed=True))
    _report("amp_checkpoint.step (autocast dtype not restored)", amp.make_step)
    _report("amp_checkpoint.fixed_step", lambda: amp.make_step(fixed=True))
    _report("moe_router.step (torch reentrant checkpoint)", moe.make_step)
    _report("moe_router.fixed_step (torch non-reentrant checkpoint)", lambda: moe.make_step(fixed=True))
    _report("levit_cache.step (torch reentrant, closures over Sequential blocks)", levit.make_step)
    tracker = load_fixture("moe_tracker")
    _report("moe_tracker.step (torch non-reentrant, early stop)", tracker.make_step)
    bn = load_fixture("batchnorm_outside")
    _report("batchnorm_outside.closure_step (non-reentrant closure; BatchNorm outside)", lambda: bn.make_step("closure"))
