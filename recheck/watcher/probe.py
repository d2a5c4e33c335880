"""The recompute probe: recomputations made by checkpoint implementations nobody intercepts.

A hand-written checkpoint (an ``autograd.Function`` that runs a block under ``no_grad`` in its
forward and again in its backward: guided-diffusion's ``CheckpointFunction``, torch-1.10-style
amp checkpoints, research code) calls no entry point recheck patches.  Its recomputation is
still visible: it is a module forward that runs **while autograd executes a backward**
(``torch._C._current_graph_task_id() != -1``) outside any recompute recheck intercepts
(:func:`recheck.intercept.hooks.active_runs`).  ::

    with RecomputeProbe() as probe:
        step()
    probe.findings   # recheck Finding objects
    probe.stats      # what was seen and matched

Process-wide module hooks (a forward pre-hook and an ``always_call=True`` forward hook, so that
a recompute torch's early stop ends still closes) see every module call.  In the forward, the
outermost calls made where a reentrant-style implementation runs its region (under ``no_grad``,
or inside saved-tensor hooks) each get an invocation record
(:class:`recheck.watcher.records.InvocationRecord`, the one comparator ``watch()`` uses too), and
their tensor inputs' data pointers are kept.  In backward, each recomputation's outermost module
call is matched to a recorded forward of the same module instance (same input storage, else the
latest unmatched one), and the record compares the recompute with its forward as it does for a
checkpoint ``watch()`` intercepts: RNG streams, context, parameters, globals, buffers and
attributes, outputs.  A finding names the module and the custom function (its class and
``file:line`` from the enclosing ``ctx`` frame, else the first Python frame the autograd engine
called).

Limits (docs/research/checkpoint-implementations.md tries each): a module called through
``.forward()`` fires no hooks (its children do); tensor operations between module calls are not
compared; module calls made by a user's own backward hooks are taken for recomputes.  Nothing is
registered until the probe is entered.
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
import threading
import weakref
from collections import Counter
from dataclasses import dataclass
from types import FrameType, TracebackType
from typing import Any

import torch
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

from recheck.findings import Finding, Invocation, could_not
from recheck.intercept.hooks import Phase, active_runs
from recheck.runtime.naming import RegionKey, relative
from recheck.runtime.reach import Reach, reach_of
from recheck.watcher.records import InvocationRecord

__all__ = ["ModuleRun", "RecomputeProbe"]

try:
    from torch.autograd.function import BackwardCFunction
except ImportError:  # pragma: no cover - every supported torch has it
    BackwardCFunction = ()  # type: ignore[assignment,misc]


@dataclass
class ModuleRun:
    """One recorded module call: a forward candidate with its record, or a recomputation in
    backward with the record of the forward it was matched to (None: unmatched)."""

    module: weakref.ref
    inputs: tuple[int, ...]
    record: InvocationRecord | None = None
    #: recompute only: who ran it (the Function's class and file:line, or the engine's callback)
    driver: str = ""
    site: str | None = None
    #: recompute only: what the record's ``begin_recompute`` returned (None: not compared)
    started: tuple[dict[tuple[str, str], Any], Any] | None = None
    finished: bool = False
    failure: BaseException | None = None


@dataclass
class _Frame:
    """One module call in progress on the probe's per-thread stack."""

    run: ModuleRun | None  # None: a call inside a recorded one (not compared by itself)
    candidate: bool = False  # a forward candidate is open: calls inside are not candidates
    recompute: bool = False  # a recompute is open: calls inside are compared as part of it
    grad: bool = True  # grad mode when the recompute started


def _site(cls: type) -> str | None:
    """``file:line`` of a class (a custom Function), None where its source cannot be found."""
    try:
        path = inspect.getsourcefile(cls)
        return f"{relative(path)}:{inspect.getsourcelines(cls)[1]}" if path else None
    except (OSError, TypeError):
        return None


def _hooks_active() -> bool:
    top = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
    try:
        return top is not None and top(False) is not None
    except (RuntimeError, TypeError):
        return False


class RecomputeProbe:
    """See the module docstring.  ``roots`` (optional) name modules by their path in a model;
    without them, the outermost modules called in the forward are the roots."""

    def __init__(self, *roots: torch.nn.Module) -> None:
        self._roots: list[weakref.ref] = [weakref.ref(r) for r in roots]
        self._explicit_roots = bool(roots)
        self._local = threading.local()
        self._lock = threading.Lock()
        self._candidates: dict[int, list[ModuleRun]] = {}
        self._recomputes: list[ModuleRun] = []
        self._stats: Counter[str] = Counter()
        self._by: Counter[str] = Counter()  # recomputes per driver
        self._handles: list[Any] = []
        self._names: dict[int, str] | None = None
        self._sites: dict[type, str | None] = {}
        #: the reach of each module recorded (``watch()``'s own, kept while the probe is entered)
        self._reaches: dict[Any, tuple[Reach, tuple]] = {}
        self.findings: list[Finding] = []
        #: the comparisons that failed in recheck itself (``could not compare ...``), skipped
        self.notes: list[str] = []

    # -- the block ---------------------------------------------------------------------------
    def __enter__(self) -> RecomputeProbe:
        if self._handles:
            raise RuntimeError("recheck: a RecomputeProbe can be entered only once at a time")
        self._handles = [register_module_forward_pre_hook(self._pre),
                         register_module_forward_hook(self._post, always_call=True)]
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self.findings = self._compare()
        self._candidates, self._recomputes, self._reaches = {}, [], {}

    @property
    def stats(self) -> dict[str, Any]:
        """``module_forwards`` recorded, ``recomputes`` seen, ``matched``/``unmatched``,
        ``early_stopped`` (ended by torch's early stop), ``by`` (recomputes per driver), ``findings``."""
        return {**{k: self._stats[k] for k in ("module_forwards", "recomputes", "matched", "unmatched",
                                               "early_stopped")}, "by": dict(self._by), "findings": len(self.findings)}

    # -- hooks -------------------------------------------------------------------------------
    def _stack(self) -> list[_Frame]:
        stack = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        return stack

    def _pre(self, module: torch.nn.Module, args: Any) -> None:
        try:
            self._enter(module, args)
        except Exception:  # noqa: BLE001 - the probe never breaks the user's program
            self._stack().append(_Frame(None))

    def _enter(self, module: torch.nn.Module, args: Any) -> None:
        """Classify a module call: inside a recorded one, a recompute, a forward candidate, or neither.

        A candidate is an outermost call where a reentrant-style implementation runs its
        region: under ``no_grad`` (or inside saved-tensor hooks) in the forward; under
        ``no_grad`` inside a recompute (a hand-written Function's forward rerun by an outer
        region's recompute, whose own recompute follows in a nested backward).
        """
        stack = self._stack()
        top = stack[-1] if stack else None
        grad = torch.is_grad_enabled()
        if top is not None and top.candidate:  # inside a recorded forward
            stack.append(_Frame(None, candidate=True))
            return
        if top is not None and top.recompute:  # inside a recompute: only a nested Function's forward counts
            if top.grad and not grad:
                stack.append(self._candidate(module, args))
            else:
                stack.append(_Frame(None, recompute=True, grad=top.grad))
            return
        task = torch._C._current_graph_task_id()
        runs = active_runs()
        innermost = runs[-1] if runs else None
        known = innermost is not None and innermost.graph_task == task
        if task != -1 and not known:
            stack.append(self._start_recompute(module, args))
            return
        if innermost is not None and known:
            # a forward recheck intercepts has its recompute verified; inside a recompute it
            # intercepts, only a nested Function's forward (no_grad) can be recomputed by another
            if innermost.phase is Phase.FORWARD or grad:
                stack.append(_Frame(None))
                return
        else:
            if not stack and not self._explicit_roots and grad:
                self._note_root(module)
            if grad and not _hooks_active():
                stack.append(_Frame(None))
                return
        stack.append(self._candidate(module, args))

    def _candidate(self, module: torch.nn.Module, args: Any) -> _Frame:
        record = InvocationRecord(RegionKey(type(module).__qualname__, None, None), 1, {}, entry="probe",
                                  function=module, needs_input_grad=False)
        record.begin_forward(reach_of(module, self._reaches))
        record.add_module(module)
        run = ModuleRun(weakref.ref(module), _pointers(args), record)
        with self._lock:
            self._candidates.setdefault(id(module), []).append(run)
            self._stats["module_forwards"] += 1
        return _Frame(run, candidate=True)

    def _post(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        stack = self._stack()
        if not stack:
            return
        frame = stack.pop()
        run = frame.run
        if run is None:
            return
        run.finished, record = output is not None, run.record
        if record is None:
            return
        try:
            if not frame.recompute:
                record.end_forward(output, output is not None)
            elif run.started is not None:
                record.end_recompute(*run.started, output, output is not None, [])
                record.release()  # its findings stay; what only a recompute reads goes
        except Exception as exc:  # noqa: BLE001 - the probe never breaks the user's program
            run.failure = exc
            if not frame.recompute:
                record.abort_forward()

    def _start_recompute(self, module: torch.nn.Module, args: Any) -> _Frame:
        run = ModuleRun(weakref.ref(module), _pointers(args))
        implementation, run.site, run.driver = self._driver(sys._getframe(1))
        with self._lock:
            self._stats["recomputes"] += 1
            self._by[run.driver] += 1
            self._match(run, module)
            self._recomputes.append(run)
        record = run.record
        if record is not None and record.forward_done and not record.failed:
            record.implementation = implementation  # the rule a finding cites depends on it
            try:
                run.started = record.begin_recompute(grad_enabled=True)  # (the forward's grad mode is not known)
            except Exception as exc:  # noqa: BLE001
                run.failure = exc
        return _Frame(run, recompute=True, grad=torch.is_grad_enabled())

    def _match(self, run: ModuleRun, module: torch.nn.Module) -> None:
        """Match a recompute, as it starts (the module alive), to a forward of the same instance."""
        candidates = [c for c in self._candidates.get(id(module), ()) if c.module() is module]
        by_storage = [c for c in candidates if c.inputs and c.inputs == run.inputs]
        chosen = by_storage[-1] if by_storage else (candidates[-1] if candidates else None)
        if chosen is None:
            self._stats["unmatched"] += 1
            return
        self._candidates[id(module)].remove(chosen)
        run.record = chosen.record
        self._stats["matched"] += 1

    # -- who recomputes ------------------------------------------------------------------------
    def _driver(self, frame: FrameType | None) -> tuple[str, str | None, str]:
        """``(implementation, file:line, description)`` of what runs the recompute."""
        start = frame
        while frame is not None:
            if frame.f_code.co_name in ("forward", "backward"):
                ctx = frame.f_locals.get("ctx")
                if isinstance(ctx, BackwardCFunction):
                    cls = getattr(ctx, "_forward_cls", type(ctx))
                    if cls not in self._sites:
                        self._sites[cls] = _site(cls)
                    site = self._sites[cls]
                    return cls.__qualname__, site, f"{cls.__qualname__} ({site})" if site else cls.__qualname__
            frame = frame.f_back
        frame = start
        while frame is not None and frame.f_back is not None:
            if frame.f_back.f_code.co_name == "_engine_run_backward":
                code = frame.f_code
                site = f"{relative(code.co_filename)}:{frame.f_lineno}"
                name = getattr(code, "co_qualname", code.co_name)
                return name, site, f"{name} ({site})"
            frame = frame.f_back
        return "unknown", None, "an unknown caller"

    # -- naming --------------------------------------------------------------------------------
    def _note_root(self, module: torch.nn.Module) -> None:
        if all(r() is not module for r in self._roots):
            self._roots.append(weakref.ref(module))
            self._names = None

    def _name(self, run: ModuleRun) -> str:
        module = run.module()
        if module is None:
            return "<a module freed since>"
        if self._names is None:
            self._names = {}
            for ref in self._roots:
                root = ref()
                if root is not None:
                    for name, sub in root.named_modules():
                        self._names.setdefault(id(sub), name or type(root).__name__)
        name = self._names.get(id(module))
        return f"`{name}` ({type(module).__name__})" if name else type(module).__name__

    # -- findings ----------------------------------------------------------------------------
    def _compare(self) -> list[Finding]:
        """The findings the records of the recomputes made, each named by its module and driver."""
        counts: dict[str, int] = {}
        made: list[tuple[str, int, ModuleRun]] = []
        for run in self._recomputes:
            if not run.finished:
                self._stats["early_stopped"] += 1
            if run.record is None:
                continue
            region = f"{self._name(run)} recomputed by {run.driver}"
            counts[region] = counts.get(region, 0) + 1
            made.append((region, counts[region], run))
        findings: list[Finding] = []
        for region, index, run in made:
            record = run.record
            assert record is not None
            try:
                if run.failure is not None:
                    raise run.failure
                found = record.findings_of(counts[region])
            except Exception as exc:  # noqa: BLE001 - recheck's own: that recompute is not compared
                self._note(could_not(f"compare the recompute of {region}, call {index}", exc))
                continue
            for note in record.problems:
                self._note(note)
            invocation = Invocation(index, counts[region], {}, run.site)
            findings += [dataclasses.replace(f, region=region, invocation=invocation) for f in found]
        return findings

    def _note(self, note: str) -> None:
        if note not in self.notes:
            self.notes.append(note)


def _pointers(args: Any) -> tuple[int, ...]:
    """The data pointers of a call's tensor arguments (a recompute meets the forward of its inputs)."""
    return tuple(a.data_ptr() for a in (args if isinstance(args, tuple) else (args,)) if isinstance(a, torch.Tensor))
