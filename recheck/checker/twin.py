"""``recheck.check_step()``: a whole training step against its uncheckpointed twin.

Comparing each recomputation with its own forward (``watch()``) is necessary and not
enough: many hazards make the *checkpointed forward itself* compute something else (a
reentrant forward under ``no_grad`` records router logits without a graph; an eval cache is
filled without grad), and the recompute then agrees with a forward that was already wrong.
The twin compares what matters in the end, at the same model, data, precision, update
boundary and randomness:

1. everything the step can touch is snapshot: parameters with their gradients, buffers,
   every module attribute, the optimizers', schedulers' and gradient scalers' state, every
   RNG stream (explicit generators too), the globals its code reaches (also as
   ``module.attr``), plain objects it holds (caches, trackers);
2. the step runs **as written**, inside ``watch()`` (every recompute verified against its own
   forward); its end state is observed and the snapshot restored;
3. the step runs with **every checkpoint bypassed** (:mod:`recheck.intercept.bypass`: each
   region called directly, under grad, nothing else changed); its end state is observed and
   the snapshot restored;
4. the two end states are compared bit for bit: the step's return value, every gradient
   (None against a tensor), parameters and buffers after the step, optimizer state, RNG
   states, Python state.

**Accumulation order is not a hazard.**  Reentrant checkpointing sums a shared weight's
gradient contributions in another order, which moves last bits.  When the twins differ only
in floating-point values and nothing explains it (no RNG stream, no Python state, no
recompute difference), both twins run again in float64 and each value finding is judged by
:func:`~recheck.checker.rounding.judge`: rounding is a note with its size, never a finding
and never hidden.

**Compiled steps.**  The twin runs compiled code eagerly (``torch.compiler.set_stance("force_eager")``,
torch 2.6 and later), so a recomputation the compiler chose for the step as written (under any
``activation_memory_budget``, also one the step sets itself) is compared too, and the step's
compiled graphs are left as they were.  Compiled kernels round otherwise than eager ones; a float64
rerun would compile the step anew rather than run its graphs, so their differences are judged by
size (:data:`~recheck.checker.rounding.SIZE_BOUND`).

**Errors are evidence.**  When the step as written raises (torch's ``CheckpointError``, or an
error raised while a region recomputes), what its watch saw is kept and the twin runs: where
the twin completes, the report's finding is "the step fails only when checkpointed", with the
region, the invocation, the error, the first differing saved tensor and the cause the watch
saw (``watcher.failure``); where the twin fails too, the step's own error is raised with a note
that says so.  A step whose state spans ranks raises its error with the watch's explanation
(a rank that ran the twin alone would wait in its collectives).

**Wrappers.**  Under DDP every run is made with gradient synchronisation off (``no_sync()`` on
each ``DistributedDataParallel`` the step reaches): both twins compare this rank's local
gradients and neither touches the C++ reducer (its one-time bucket rebuild is done first, as the
step's next forward would), whose state no snapshot can put back; DDP's own attributes are put
back and never compared.  What cannot be put back is refused before anything runs: a
``static_graph`` DDP, an optimizer holding tensors outside its groups and state
(:func:`~recheck.runtime.steps.unseen_optimizer_tensors`).

The check leaves no trace: the snapshot is restored after every run, also when the step
raises.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Sequence

import torch
from torch.nn.parallel import DistributedDataParallel

from recheck.checker.compare import Context, compare_grads, compare_observed, compare_outputs
from recheck.checker.rounding import Values, in_float64, judge, largest
from recheck.findings import Finding, Invocation, Report, Subject, could_not, parts_of
from recheck.intercept.bypass import Bypass, bypassing
from recheck.distributed.world import any_rank, collectives_made
from recheck.runtime.bits import Tolerance, local_tensor, unwrapped
from recheck.runtime.explaining import with_likely_causes
from recheck.runtime.fingerprints import showing
from recheck.runtime.naming import attribute_subject, region_name, step_name
from recheck.runtime.reach import Reach, reach_of
from recheck.runtime.rng import RngRecord
from recheck.runtime.snapshot import (DefaultDtypeRecord, DigestedTensor, Observed, Snapshot, TensorRecord,
                                      shared_or_copied)
from recheck.runtime.steps import StepState, discover_state, unseen_optimizer_tensors
from recheck.runtime.effects import EffectCapture
from recheck.runtime.trees import input_tensors, leaves, map_tensors

__all__ = ["RegionError", "RegionStep", "StepRun", "Twin", "check_region_report",
           "check_step_report", "given_upstream", "make_upstream"]

#: Kinds whose difference rounding may explain (values computed in floating point).
_VALUE_KINDS = ("output", "gradient", "state")
_LABELS = ("uncheckpointed step", "step as written")


@dataclass
class StepRun:
    """What one run of the step left behind."""

    mode: str
    result: Any = None
    #: a lean run keeps a gradient as its digest (:class:`~recheck.runtime.snapshot.DigestedTensor`)
    grads: dict[str, torch.Tensor | DigestedTensor | None] = field(default_factory=dict)
    post: dict[tuple[str, str], Observed] = field(default_factory=dict)
    error: BaseException | None = None
    report: Report | None = None
    compiled: bool = False
    notes: list[str] = field(default_factory=list)
    #: findings of the recompute probe (checkpoint implementations no entry point reports)
    probe: list[Finding] = field(default_factory=list)
    #: where the step as written raised: what its watch saw of the failure (``watcher.failure``)
    failure: Any = None
    #: saved tensors its watch compared with their recomputation
    saved_compared: int = 0
    #: the run left every piece of state as found and emitted nothing (check()'s plain run: a full
    #: replay of an early stopped recompute, which starts where it started, could show nothing)
    inert: bool = False


class Twin:
    """One step, its state, and the runs that compare it with its uncheckpointed twin."""

    def __init__(self, step: Callable[[], Any], modules: Sequence[torch.nn.Module] = (),
                 optimizers: Sequence[torch.optim.Optimizer] = (), reach: Reach | None = None,
                 inputs: Sequence[tuple[str, torch.Tensor]] = ()) -> None:
        self.step = step
        self.state: StepState = discover_state(step, modules, optimizers, getattr(step, "parts", None))
        self.reach: Reach = reach or reach_of(step, {})  # (a reach of its own: the twin adds to it)
        for module in self.state.modules:
            if id(module) not in self.reach.modules:
                self.reach.add_module(self.reach.name_unknown(module), module)
        #: DDP modules the step reaches: every run is made with their gradient synchronisation off
        self.unsynced = {name: m for name, m in self.reach.modules.values() if isinstance(m, DistributedDataParallel)}
        _refuse_unfaithful(self.unsynced, self.state)  # before anything is copied or run
        _settle(self.unsynced.values())
        known = [*self.reach.tensors.values(), *(t for _, t in inputs)]
        for tensor in self.state.tensors + self.state.leaves:
            if all(t is not tensor for t in known):
                self.reach.tensors[f"tensor#{len(self.reach.tensors) + 1}"] = tensor
        found = [g for g in self.state.generators if all(g is not h for h in self.reach.generators.values())]
        generators = {**self.reach.generators, **{f"#{i}": g for i, g in enumerate(found)}}
        self.snapshot = Snapshot(RngRecord(generators))
        self.snapshot.add(("default dtype",), DefaultDtypeRecord)
        self.parameters = self.snapshot.track(self.reach, param_kind="state")
        self.snapshot.closures(step)  # (a batch list it pops from, a list it appends to)
        unreadable = {**{f"`{name}`": why for name, why in self.reach.unreadable.items()}, **self.state.unreadable}
        for what, why in unreadable.items():  # (the step search names its objects by their type, in words)
            self.snapshot.unrestorable.setdefault(what, f"looking into it raised {why}")
        self.snapshot.refuse_iterators()
        self.inputs = [tensor for _, tensor in inputs]
        for path, tensor in inputs:  # a region's inputs (check()), named by their path
            self.snapshot.add(("input", id(tensor)), functools.partial(TensorRecord, "input_mutation", path, tensor))
        self._restore_loop = self.state.loop_snapshot()
        #: whether the state is as captured: no run started since the last restore ended
        self._restored = True
        #: runs of the step made (a lean round whose twin differed, the float64 rerun: more than two)
        self.runs = 0
        #: a run let the region's output through (check(): its first plain run)
        self._shown = False
        self._grads = {r.name: r for r in self.snapshot.grads}
        #: the step's state spans the ranks of a world (sharded parameters, a DDP module, a pipeline
        #: schedule or stage): every rank runs it, and the runs each rank makes are agreed by all
        #: (:meth:`agreed`)
        self.spans_ranks = bool(self.unsynced) or any(unwrapped(p) is not None for p in self.parameters.values()) \
            or any(type(o).__module__.startswith("torch.distributed.") for o in self.reach.objects.values())

    def _wrapper_subjects(self) -> set[str]:
        """The subjects of the DDP modules' own attributes (not their submodules, parameters or
        buffers): state DDP's wrapper writes at every forward, never the step's regions."""
        return {attribute_subject(name, key) for name, module in self.unsynced.items() for key in vars(module)
                if key not in _MODULE_DICTS}

    def agreed(self, flag: bool) -> bool:
        """``flag`` on any rank, for a step whose state spans ranks (one collective every rank
        makes): a rank that ran the step once more alone would wait forever in its collectives."""
        return any_rank(flag) if self.spans_ranks else flag

    # -- state ---------------------------------------------------------------------------------

    def restore(self, trust_observed: bool = False) -> None:
        """Put everything back as it was before the first run (``trust_observed``: the
        snapshot's last observe is current, so what it found unchanged is not compared again).

        Nothing to do where no run started since the last restore that ended without an error
        (the check's last safeguard after its last run: a pass over every tensor the step holds).
        """
        if self._restored and not trust_observed:
            return
        try:
            self.snapshot.restore(trust_observed)
        finally:
            self._restore_loop()
        self._restored = True

    def _observe(self, run: StepRun, reference: StepRun | None, lean: bool = False) -> None:
        """The end state of a run (gradients, every tracked value, optimizer state), then restore.

        A tensor left as ``reference`` (the run this one is compared with) left it is kept as
        that run's value, not copied; ``lean`` keeps what the run changed as digests
        (:class:`~recheck.runtime.snapshot.DigestedTensor`), its gradients too, which are then
        freed before the next run.
        """
        fresh = {f"`{name}`": p.grad for name, p in self.parameters.items()}
        fresh.update(getattr(self.step, "input_grads", {}))  # a region's inputs (check()'s step)
        grads: dict[str, torch.Tensor | DigestedTensor | None] = dict(fresh)
        if lean:
            grads = {name: DigestedTensor.of(grad) if grad is not None and DigestedTensor.fits(grad) else grad
                     for name, grad in fresh.items()}
        elif reference is not None:
            for name, grad in fresh.items():
                theirs = reference.grads.get(name)
                if type(theirs) is DigestedTensor and grad is not None and theirs.matches(grad):
                    grads[name] = theirs  # alike: the other run's value (compared by identity)
        run.grads = grads
        seen = None if reference is None else reference.post
        run.post = self.snapshot.observe(seen, lean)
        if run.inert and isinstance(self.step, RegionStep):  # (what the observe found as captured is not read again)
            run.inert = self.snapshot.unchanged(self.step.reset_streams)
        wrapper = self._wrapper_subjects() if self.unsynced else set()
        for key in [key for key in run.post if key[0] == "state" and key[1] in wrapper]:
            del run.post[key]  # DDP's own bookkeeping, put back and not compared (:func:`_unsynced`)
        for index, optimizer in enumerate(self.state.optimizers):
            names = {id(p): name for name, p in self.parameters.items()}
            for param, values in optimizer.state.items():
                label = names.get(id(param), f"#{id(param)}")
                for key, value in values.items():
                    subject = Subject("optimizer state", key, owner=label)
                    if isinstance(value, torch.Tensor):
                        run.post[("state", subject)] = shared_or_copied(
                            "state", subject, value, None if seen is None else seen.get(("state", subject)), lean)
        self.restore(trust_observed=True)  # only reads since the observe

    # -- runs ----------------------------------------------------------------------------------

    def run(self, mode: str, watch_options: Mapping[str, Any], *, compiled: bool = False,
            before: Callable[[Twin], None] | None = None, reference: StepRun | None = None,
            lean: bool = False) -> StepRun:
        """Run the step once, ``"as written"`` (under watch()) or ``"bypassed"``, and restore.

        ``before(twin)`` changes the state the run starts from (the float64 rerun);
        ``reference``: the run this one will be compared with, ``lean``: keep digests of what
        the run changed, not copies (see :meth:`_observe`).
        """
        run = StepRun(mode)
        self._restored = False
        self.runs += 1
        for record in self._grads.values():
            record.fresh()
        try:
            if before is not None:
                before(self)
            made = collectives_made()
            with _unsynced(self.unsynced.values()), self._mode(run, watch_options, compiled):
                try:
                    run.result = _detached(self.step())
                except Exception as exc:  # the step's own error: the caller decides
                    run.error = exc
            self.spans_ranks |= collectives_made() != made  # (a DeepSpeed engine's: every rank made them)
        finally:
            self._observe(run, reference, lean)
        return run

    @contextlib.contextmanager
    def _mode(self, run: StepRun, watch_options: Mapping[str, Any], compiled: bool) -> Iterator[None]:
        # a region's output (check()) shows once, as a plain call shows it: the first run of its
        # twin lets it through, every other run keeps it
        region = self.step if isinstance(self.step, RegionStep) else None
        plain = region is not None and run.mode == "bypassed"
        quiet = EffectCapture(passthrough=plain and not self._shown) if region is not None else None
        self._shown |= plain
        with quiet or contextlib.nullcontext(), self._watched(run, watch_options, compiled):
            yield
        run.inert = quiet is not None and plain and not quiet.effects  # and the state as found: see _observe

    @contextlib.contextmanager
    def _watched(self, run: StepRun, watch_options: Mapping[str, Any], compiled: bool) -> Iterator[None]:
        if run.mode == "as written":
            from recheck.watcher.probe import RecomputeProbe
            from recheck.watcher.session import watch

            watcher = watch(raise_on_finding=False, **watch_options)
            # the step's own modules (named in the step, not inside another) name what it finds
            probe = RecomputeProbe(*[m for name, m in self.reach.modules.values() if "." not in name])
            try:
                with watcher, probe:  # the probe sees recomputes of implementations nothing intercepts
                    yield
            finally:
                run.report = watcher.report
                if run.error is not None:
                    run.failure = _explained(watcher, run.error)
                run.probe = list(probe.findings)
                run.saved_compared = sum(r._saved_compared for r in watcher.records)
                run.notes.extend(probe.notes)
                run.compiled = watcher.compiled
            return
        extra = watch_options.get("checkpoint_functions") or ()
        with _eager(compiled) as eager_notes, bypassing(extra) as bypass:
            yield
        run.notes.extend(bypass.notes + eager_notes)
        if not bypass.bypassed:
            run.notes.append("the step made no checkpoint call recheck could bypass: its twin is the step itself")


#: a module's own dicts of parameters, buffers and submodules, tracked and compared as such
_MODULE_DICTS = ("_parameters", "_buffers", "_modules")


def _refuse_unfaithful(unsynced: Mapping[str, DistributedDataParallel], state: StepState) -> None:
    """Refuse, before anything runs, a step whose state the check could not put back.

    Raises:
        RuntimeError: naming the module or the optimizer's attribute, why, and what to do instead.
    """
    for name, module in unsynced.items():
        if getattr(module, "static_graph", False):
            raise RuntimeError(
                f"recheck.check_step() cannot put back the C++ reducer state of `{name}`, a "
                "DistributedDataParallel(static_graph=True) (the graph it records is its own, not the "
                "module's Python state), so its twin could not run faithfully; run check_step on the "
                "unwrapped module, or use recheck.watch() around the real step")
    unseen = unseen_optimizer_tensors(state)
    if unseen:
        raise RuntimeError(
            "recheck.check_step() cannot put back tensors an optimizer keeps outside its param_groups and "
            f"state ({', '.join(unseen)}: master copies or shards of its own), so the check would leave "
            "training changed; check the step with a torch.optim optimizer over the same parameters, or "
            "use recheck.watch() around the real step")


def _settle(modules: Any) -> None:
    """DDP's one-time bucket rebuild, done now as the step's next forward would do first (after
    the first synchronised iteration), so that no run of the check changes the C++ reducer, whose
    state a snapshot cannot put back (only DDP's own mirror of it, ``_has_rebuilt_buckets``)."""
    if not torch.is_grad_enabled():
        return
    for module in modules:
        reducer = getattr(module, "reducer", None)
        if getattr(module, "_use_python_reducer", False) or reducer is None:
            continue
        try:
            rebuilt = reducer._rebuild_buckets()  # a collective every rank makes, as in DDP's forward
        except Exception:  # noqa: BLE001 - left to the step's own forward, which does the same
            continue
        if rebuilt:
            module._has_rebuilt_buckets = True


@contextlib.contextmanager
def _unsynced(modules: Any) -> Iterator[None]:
    """Gradient synchronisation off in every DDP module (``no_sync()``) for one run: the step as
    written and its twin both compare this rank's local gradients, and neither touches the
    reducer's bookkeeping of a synchronised iteration (its autograd hooks, its buckets)."""
    with contextlib.ExitStack() as stack:
        for module in modules:
            stack.enter_context(module.no_sync())
        yield


def _explained(watcher: Any, error: BaseException) -> Any:
    """What the watch of a step that raised saw of the failure (None where that fails)."""
    from recheck.watcher.failure import explain_failure

    try:
        return explain_failure(list(watcher.records), error)
    except Exception:  # noqa: BLE001 - recheck's own wording: the error is still the finding's
        return None


def _fails_only_checkpointed(name: str, written: StepRun) -> Finding:
    """The finding of a step that raised as written and completed with every checkpoint bypassed."""
    from recheck.watcher.failure import FailureExplanation, error_line

    error = written.error
    assert error is not None
    failure = written.failure
    if failure is None:
        failure = FailureExplanation(error_line(error))
    return failure.finding(name)


#: the note of a step whose twin is not run (see :func:`_compared`)
UNCOMPARED = ("a parameter changed in place between a forward and its backward (param_version), which torch "
              "refuses without checkpointing: the step was not compared with its uncheckpointed twin, the findings "
              "are its watch's")

#: the note added to the error of a step that fails with every checkpoint bypassed too
FAILS_UNCHECKPOINTED = ("recheck: the step fails without checkpointing as well (every checkpoint bypassed): "
                        "not a checkpointing hazard, so recheck has nothing to report on it")


def _digests_differ(written: StepRun, other: StepRun) -> bool:
    """Whether ``other`` left a tensor otherwise than the lean ``written`` did: one kept as its
    digest there that ``other`` did not share (see :meth:`Twin._observe`)."""
    for name, grad in written.grads.items():
        if type(grad) is DigestedTensor and other.grads.get(name) is not grad:
            return True
    for key, seen in written.post.items():
        if type(seen.value) is DigestedTensor:
            theirs = other.post.get(key)
            if theirs is None or theirs.value is not seen.value:
                return True
    return False


def _detached(value: Any) -> Any:
    """The leaves of a step's result, copied off the graph; whether each required grad is kept
    (a reentrant checkpoint's output needs none where its inputs need none: a finding)."""
    return [(path, _copied(leaf) if isinstance(leaf, torch.Tensor) else leaf) for path, leaf in leaves(value)]


def _copied(tensor: torch.Tensor) -> torch.Tensor:
    copy = tensor.detach().clone()
    return copy.requires_grad_() if tensor.requires_grad and copy.is_leaf else copy


#: the note of a compiled step, whose twin ran its compiled code eagerly
EAGER_NOTE = ('compiled code: the uncheckpointed twin ran it eagerly (torch.compiler.set_stance("force_eager")), '
              "so a recomputation the compiler chose for the step as written (activation_memory_budget below 1) "
              "is compared too; watch() sees no recompute inside compiled code, the twin compares where it ends")


@contextlib.contextmanager
def _eager(compiled: bool) -> Iterator[list[str]]:
    """The twin's compiled code run eagerly: no compiler recomputation, the step's graphs untouched
    (only where something imported Dynamo, which nothing compiles without)."""
    notes: list[str] = []
    stance = getattr(torch.compiler, "set_stance", None)
    if stance is None or "torch._dynamo" not in sys.modules:
        if compiled:
            notes.append(f"compiled code: torch {torch.__version__} has no torch.compiler.set_stance (torch 2.6 "
                         "and later), so the uncheckpointed twin ran the compiled code as well: a recomputation "
                         "the compiler chose is not compared")
        yield notes
        return
    with stance("force_eager"):
        yield notes
    if compiled:
        notes.append(EAGER_NOTE)


def _own_random(findings: Sequence[Finding]) -> list[str]:
    """Why a compiled step cannot be compared with its eager twin: inductor draws random numbers its
    own way unless ``fallback_random``, so every value they reach differs without a hazard, and a
    hazard among them cannot be told apart; the twin's differences are then not reported (the
    watch's own findings stand)."""
    config, utils = sys.modules.get("torch._inductor.config"), sys.modules.get("torch._dynamo.utils")
    if config is None or getattr(config, "fallback_random", True) or not getattr(utils, "counters", {}).get("inductor") \
            or not any(f.kind == "rng" for f in findings):
        return []
    return ["compiled code: inductor, which compiled code in this process, draws random numbers its own way "
            "(torch._inductor.config.fallback_random is False) and eager does not reproduce them, so this step "
            "differs from its eager twin wherever they reach and was not compared with it (its differences are "
            "not reported); set torch._inductor.config.fallback_random = True before compiling to check it"]


# -- comparing the twins ------------------------------------------------------------------------


def noise_floor_reason(parameters: Mapping[str, Any]) -> str | None:
    """Why the step's noise floor is measured before it is compared (None: it is not).

    On an accelerator, kernels that accumulate with atomics (scatter-add, index-add, some
    convolution and attention backwards) give other last bits from run to run unless
    deterministic algorithms are on; on the CPU every kernel is deterministic."""
    if torch.are_deterministic_algorithms_enabled():
        return None
    devices = sorted({str(p.device.type) for p in parameters.values()} - {"cpu", "meta"})
    if not devices:
        return None
    return (f"parameters on {'/'.join(devices)} with deterministic algorithms off "
            "(torch.use_deterministic_algorithms(False))")


#: A difference from the twin up to this many times what the step's own runs differ by is noise:
#: two runs sample the noise once, and the twin's difference from them is another sample of it.
NOISE_MARGIN = 4.0


def _beyond_noise(findings: list[Finding], floor: Mapping[tuple[str, Any], float], values: Values, repeats: int,
                  notes: list[str]) -> list[Finding]:
    """The findings that differ from the uncheckpointed step by more than :data:`NOISE_MARGIN`
    times what the step as written differs by from itself (``floor``: the greatest difference of
    each value between its own runs); those within it are said in a note with the floor's size,
    never as findings."""
    kept: list[Finding] = []
    within = larger = 0
    for finding in findings:
        bound = floor.get((finding.kind, finding.subject))
        size = values.difference(finding) if bound is not None else None
        if bound is None or (size is not None and size[0] > NOISE_MARGIN * bound):
            kept.append(finding)
            larger += bound is not None
        else:
            within += 1
    sizes = [v for v in floor.values() if v != float("inf")]
    shown = ", ".join(sorted(str(s) for _, s in floor)[:6]) + (f" and {len(floor) - 6} more" if len(floor) > 6 else "")
    notes.append(f"the step as written is not deterministic from run to run ({repeats} runs): {shown} differ "
                 "between its own runs" + (f" by up to {max(sizes):.3g}" if sizes else "")
                 + f"; {within} difference(s) from the uncheckpointed step within {NOISE_MARGIN:g}× that are not "
                 f"attributed to checkpointing, {larger} larger one(s) stay findings")
    return kept


def _twin_findings(ctx: Context, written: StepRun, bypassed: StepRun, notes: list[str] | None = None) -> list[Finding]:
    findings = compare_outputs(ctx, bypassed.result, written.result, labels=_LABELS, flat=True)
    # a digest (a lean run's) is here only where both runs share it, which compares by identity
    findings += compare_grads(ctx, bypassed.grads, written.grads, labels=_LABELS,  # type: ignore[arg-type]
                              reference="the uncheckpointed step")
    findings += compare_observed(ctx, bypassed.post, written.post, when="from the uncheckpointed step",
                                 labels=_LABELS, notes=notes)
    return findings


def _values(a: StepRun, b: StepRun) -> Values:
    """The values behind the twins' value findings, and the largest magnitude of each kind in ``b``."""
    return Values(lambda finding: _tensors_of(finding, a, b) if finding.kind in _VALUE_KINDS else None,
                  lambda: {"gradient": largest(b.grads.values()), "state": largest(o.value for o in b.post.values()),
                           "output": largest(leaf for _, leaf in b.result if isinstance(leaf, torch.Tensor))})


def _tensors_of(finding: Finding, a: StepRun, b: StepRun) -> tuple[torch.Tensor, torch.Tensor] | None:
    subject = finding.subject or ""
    x: Any
    y: Any
    if finding.kind == "gradient":
        name = parts_of(subject).path  # (as the runs' gradients are named: `w`, args[0])
        x, y = a.grads.get(name), b.grads.get(name)
    elif finding.kind == "output":
        x, y = dict(a.result).get(subject), dict(b.result).get(subject)
    else:
        seen_a, seen_b = a.post.get((finding.kind, subject)), b.post.get((finding.kind, subject))
        x = seen_a.value if seen_a is not None else None
        y = seen_b.value if seen_b is not None else None
    if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
        x, y = local_tensor(x), local_tensor(y)  # a DTensor's local shard: no collective
        if x is not None and y is not None:
            return x, y
    return None


def _to_float64(twin: Twin) -> None:
    """Every floating-point tensor the step holds in float64, and the default dtype float64 (before
    one run of the rerun: each run starts from the snapshot, so both twins start alike and a
    ``torch.rand([])`` draws the same in both).

    Parameters, buffers, loose tensors (the data, a region's inputs), optimizer state and the gradients a run
    starts from change dtype in place; the twin's snapshot puts every one of them back (dtype,
    bytes and version), and the default dtype, when the run ends.
    """
    torch.set_default_dtype(torch.float64)  # tensors the step makes itself are float64 too
    tensors = list(twin.parameters.values())
    tensors += [b for _, m in twin.reach.modules.values() for b in m._buffers.values() if b is not None]
    tensors += list(twin.reach.tensors.values()) + twin.inputs
    tensors += [v for opt in twin.state.optimizers for st in opt.state.values() for v in st.values()
                if isinstance(v, torch.Tensor)]
    with torch.no_grad():
        for tensor in {id(t): t for t in tensors}.values():
            if tensor.is_floating_point() and tensor.dtype != torch.float64:
                tensor.data = tensor.data.to(torch.float64)
    for record in twin._grads.values():
        if record.parameter.grad is not None and record.parameter.grad.is_floating_point():
            record.parameter.grad = record.parameter.grad.to(torch.float64)


def _value_causes(findings: Sequence[Finding], watched: Sequence[Finding]) -> list[Finding]:
    """Causes found that act on computed values (an RNG stream torch draws from, a recompute that
    differed, a parameter or input changed in between, a global the recompute read otherwise):
    the value differences follow from them, and a float64 rerun could not say more.  A host RNG
    (numpy, Python), a side effect or a global only the end states show does not."""
    return [f for f in [*findings, *watched]
            if f.kind in ("recompute", "param_version", "input_mutation") or (f.kind == "global" and f in watched)
            or (f.kind == "rng" and _torch_stream(parts_of(f.subject)))]


def _torch_stream(subject: Subject) -> bool:
    """A stream torch draws from: a device's default generator, or a ``torch.Generator``."""
    return subject.what == "device RNG" or (subject.what == "RNG instance" and subject.owner == "generator")


def _separate_rounding(twin: Twin, ctx: Context, findings: list[Finding], written: StepRun,
                       bypassed: StepRun, watch_options: Mapping[str, Any]) -> tuple[list[Finding], list[str]]:
    """Findings that are rounding (accumulation order) become a note with their size; the rest stay
    (:func:`~recheck.checker.rounding.judge`).  Not rerun where a cause the check found explains the values,
    nor for compiled code (judged by size)."""
    own = _values(written, bypassed)
    values = [f for f in findings if (own.difference(f) or (0.0,))[0] > 0]
    watched = [*(written.report.findings if written.report is not None else ()), *written.probe]
    wanted = bool(values) and not _value_causes(findings, watched)
    if not twin.agreed(wanted):  # a rank reruns the step only with all the others
        return findings, []
    wide: Values | None = None
    compiled = written.compiled or bool(twin.reach.compiled)
    if twin.spans_ranks and any(unwrapped(p) is not None for p in twin.parameters.values()):
        stopped: str | None = ("its parameters are sharded (FSDP2 DTensors): FSDP keeps the dtypes of its all-gather, "
                               "reduce-scatter and gradients fixed at fully_shard(), so a float64 rerun would not "
                               "run in float64")
    elif any(type(o).__module__.startswith("torch.distributed.pipelining.") for o in twin.reach.objects.values()):
        stopped = ("it runs a pipeline schedule, whose stages send and receive in the dtypes of their first step, "
                   "so a float64 rerun would not run in float64")
    elif compiled:
        stopped = "compiled code: in float64 the step would be compiled anew, not run as it was compiled"
    else:
        wide, stopped = in_float64(functools.partial(_rerun64, twin, watch_options))
    if not wanted:  # rerun for another rank's differences
        return findings, []
    return judge(findings, own, wide, stopped, reference="the uncheckpointed step",
                 why=("compiled kernels round otherwise than eager ones, and " if compiled else "")
                 + "the checkpointed step sums contributions in another order, which is not a hazard")


def _rerun64(twin: Twin, watch_options: Mapping[str, Any]) -> Values:
    """Both twins again with every floating-point tensor of the step in float64; an error either raised is raised."""
    try:
        written = twin.run("as written", {**watch_options, "store": "digest", "atol": None, "rtol": None,
                                          "max_ulp": None}, before=_to_float64)
        bypassed = twin.run("bypassed", {}, before=_to_float64, reference=written)
    finally:
        twin.restore()
    error = written.error or bypassed.error
    if error is not None:
        raise error
    return _values(written, bypassed)


@showing()  # a state's printed text, made once per check
def check_step_report(step: Callable[[], Any], *, repeats: int = 1, tolerance: Tolerance | None = None,
                      watch_options: Mapping[str, Any] | None = None,
                      modules: Sequence[torch.nn.Module] = (),
                      optimizers: Sequence[torch.optim.Optimizer] = ()) -> Report:
    """The report of :func:`recheck.check_step` (see there for the arguments)."""
    name = step_name(step)
    twin = Twin(step, modules, optimizers)
    ctx = Context(region=f"step {name}", invocation=None, tolerance=tolerance, use_reentrant=False,
                  preserve_rng_state=None)
    noisy = noise_floor_reason(twin.parameters)
    if noisy is not None:
        repeats = max(repeats, 2)
    written, bypassed, found, notes = _compared(twin, ctx, name, repeats, dict(watch_options or {}))
    watched = written.report if written.report is not None else Report()
    stats = {"runs": twin.runs, "parameters": len(twin.parameters), "watch": dict(watched.stats)}
    title = (f"step           {name}\n"
             f"compared with  its uncheckpointed twin (every checkpoint bypassed), bit for bit"
             + (f", tolerance: {tolerance}" if tolerance else "")
             + f"\nwatched        {watched.title or 'nothing'}"
             + (f"\nnoise floor    the step as written ran {repeats} times first: {noisy}; what differs "
                "within its own runs is a note" if noisy is not None else ""))
    return Report(found, title=title, notes=notes, stats=stats)


def _compared(twin: Twin, ctx: Context, name: str, repeats: int, watch_options: dict[str, Any],
              plain_error: bool = False, detail: Mapping[str, Any] | None = None, once: bool = False
              ) -> tuple[StepRun, StepRun, list[Finding], list[str]]:
    """Run the step as written and its twin, and compare them: the two runs, every finding
    (the watch's and the twins' differences), every note.  ``detail``: watch options for the
    round that keeps copies, which then also runs where the watch found something; ``once``: a
    difference of the twins the watch names too (kind and subject) is said once, as the watch says it.

    Where both raise, the step as written's error is raised with a note that its twin fails
    too, or with ``plain_error`` the twin's own (``check()``: the region's error, as a plain
    call raises it).
    """
    tolerance = ctx.tolerance
    notes: list[str] = []
    try:
        # first lean: the step as written keeps digests of what it changed; where any run differs
        # from it there, all run again keeping copies, which the findings need (their first
        # difference, their size, the float64 rerun that tells rounding from a hazard)
        lean = True
        failed: Finding | None = None
        # what the step as written differs by between its own runs, per value: its noise floor
        unsteady: dict[tuple[str, Any], float] = {}
        while True:
            written = twin.run("as written", watch_options if lean else {**watch_options, **(detail or {})}, lean=lean)
            noticed = detail is not None and lean and (written.error is not None or written.report is not None
                                                       and not written.report.ok)
            if noticed and not twin.spans_ranks:
                lean = False  # again, keeping copies for the findings' detail
                continue
            if written.error is not None:
                from recheck.watcher.failure import add_note as _add_note

                # errors are evidence: the twin tells a failure of checkpointing from the step's own
                if twin.spans_ranks:  # a rank that ran the twin alone would wait in its collectives
                    if written.failure is not None:
                        _add_note(written.error, written.failure.note())
                    raise written.error
                bypassed = twin.run("bypassed", {}, compiled=written.compiled or bool(twin.reach.compiled))
                if bypassed.error is not None:
                    if plain_error:
                        raise bypassed.error
                    _add_note(written.error, FAILS_UNCHECKPOINTED)
                    raise written.error
                failed = _fails_only_checkpointed(name, written)
                break
            if not plain_error and twin.agreed(written.report is not None and any(
                    f.kind == "param_version" for f in written.report.findings)):
                # uncheckpointed, torch refuses a backward whose saved parameter changed in place
                # (perhaps on one rank only, mid-schedule: the others would wait for it)
                notes.append(UNCOMPARED)
                bypassed = written
                break
            unsteady = {}
            for _ in range(repeats - 1):
                again = twin.run("as written", watch_options, reference=written)
                if twin.agreed(lean and _digests_differ(written, again)):
                    break
                own = _values(again, written)
                for f in _twin_findings(ctx, again, written):
                    size = own.difference(f)
                    key = (f.kind, f.subject)
                    unsteady[key] = max(unsteady.get(key, 0.0), size[0] if size is not None else float("inf"))
            else:
                compiled = written.compiled or bool(twin.reach.compiled)
                bypassed = twin.run("bypassed", {}, compiled=compiled, reference=written)
                if bypassed.error is not None:
                    raise bypassed.error
                if not twin.agreed(lean and _digests_differ(written, bypassed)):
                    break
            lean = False
        if twin.reach.compiled:
            notes.append("the step reaches compiled code: " + ", ".join(dict.fromkeys(twin.reach.compiled)))
        try:
            # a step that failed has no end state to compare: its failure is the finding
            findings = [failed] if failed is not None else [] if bypassed is written \
                else _twin_findings(ctx, written, bypassed, notes)
        except Exception as exc:  # noqa: BLE001 - recheck's own comparison: the watch's findings stand
            findings = []
            notes.append(could_not("compare the step with its uncheckpointed twin", exc))
        own_random = _own_random(findings) if written.compiled or twin.reach.compiled else []
        if own_random:  # refused rather than guessed: inductor's random numbers are not told from a hazard
            notes += own_random
            findings = []
        if unsteady:
            findings = _beyond_noise(findings, unsteady, _values(written, bypassed), repeats, notes)
        if tolerance is None and failed is None and bypassed is not written:
            try:
                findings, rounding = _separate_rounding(twin, ctx, findings, written, bypassed, watch_options)
            except Exception as exc:  # noqa: BLE001 - recheck's own analysis: the differences stay findings
                rounding = [could_not("tell rounding from a hazard; the differences are shown as findings", exc)]
            notes += rounding
    finally:
        twin.restore()
    watched = written.report if written.report is not None else Report()
    watched.findings.extend(written.probe)
    notes += [n for n in watched.notes if n not in notes] + written.notes + (bypassed.notes if bypassed is not written else [])
    notes += twin.snapshot.notes()  # what the step reaches and the check cannot put back
    if once:  # the comparator's words, once (latent ones too: a full replay changed them again)
        said = {(f.kind, f.subject) for f in watched.findings}
        findings = [f for f in findings if (f.kind, f.subject) not in said]
    try:
        found = with_likely_causes([*watched.findings, *findings])
    except Exception as exc:  # noqa: BLE001 - the findings as they were found
        found = [*watched.findings, *findings]
        notes.append(could_not("point the findings at their likely causes", exc))
    return written, bypassed, found, notes


# -- check(): one region as a generated step ----------------------------------------------------


class RegionError(ValueError):
    """The region cannot be checked as given (no tensor output, nothing requires grad)."""


class RegionStep:
    """The step :func:`recheck.check` generates for one region, checked as its twin.

    It calls ``torch.utils.checkpoint.checkpoint(fn, *args, **kwargs)`` with the configuration
    under test, then backward with the upstream gradient (``grad_outputs``, or seeded noise the
    same in every run), and returns the outputs; the inputs' gradients are in
    :attr:`input_grads` (fresh leaves each run, so the caller's tensors keep their ``.grad``).
    Under the watch each recompute is compared with its own forward; bypassed, the region is
    called directly, the plain run every comparison of outputs and end state is made against.
    Whether the region can be checked at all is judged on the plain run's outputs (a reentrant
    checkpoint's output may need no grad where the plain output does: that is a finding), and
    a :class:`RegionError` raised before its backward.
    """

    def __init__(self, fn: Callable[..., Any], args: tuple, kwargs: dict, *, use_reentrant: bool,
                 preserve_rng_state: bool, early_stop: bool, grad_outputs: Any) -> None:
        self.fn, self.args, self.kwargs = fn, args, kwargs
        self.options: dict[str, Any] = {"use_reentrant": use_reentrant, "preserve_rng_state": preserve_rng_state}
        if not use_reentrant:
            self.options["early_stop"] = early_stop
        self.grad_outputs = grad_outputs
        #: the RNG streams the recompute sets back to the forward's
        self.reset_streams = frozenset({"cpu RNG"}) if preserve_rng_state else frozenset()
        #: the plain run's upstream gradient, once made (every later run gets the same)
        self.upstream: list[tuple[str, torch.Tensor]] | None = None
        self.input_grads: dict[str, torch.Tensor | None] = {}
        #: what the region alone reaches, given to each watch of the step as its reach of the region
        self.reach: Reach | None = None

    @property
    def parts(self) -> tuple[Any, ...]:
        """What the step holds of the user's (the state a twin discovers from it)."""
        return self.fn, self.args, self.kwargs, self.grad_outputs

    def __call__(self) -> Any:
        from torch.utils.checkpoint import checkpoint

        from recheck.intercept import patches
        from recheck.watcher.dispatch import Dispatcher

        installation = patches.installed()
        hooks = installation.hooks if installation is not None else None
        plain = isinstance(hooks, Bypass)
        args, kwargs, fresh = prepare_inputs(self.args, self.kwargs)
        self.input_grads = {}
        fn = self.fn
        if kwargs and self.options["use_reentrant"]:  # the reentrant variant takes no keyword arguments
            fn, kwargs = functools.partial(fn, **kwargs), {}
        elif isinstance(hooks, Dispatcher) and self.reach is not None:
            hooks.known_reach(fn, self.reach.copy())  # (a copy: a watch adds what its forward finds)
        outputs = checkpoint(fn, *args, **self.options, **kwargs)
        tensors = dict(leaves(outputs))
        try:
            _fits(outputs, tensors)
            upstream = self.upstream or make_upstream(tensors, self.grad_outputs)
        except RegionError:
            if plain:
                raise
            return outputs  # the plain run judges, and a checkpointed output may need no grad
        if plain:
            self.upstream = upstream
        pairs = [(tensors[path], grad) for path, grad in upstream
                 if isinstance(tensors.get(path), torch.Tensor) and tensors[path].requires_grad
                 and tensors[path].shape == grad.shape]
        if pairs:
            torch.autograd.backward([t for t, _ in pairs], [g for _, g in pairs])
        self.input_grads = {path: leaf.grad for path, leaf in fresh.items()}
        return outputs


def _fits(outputs: Any, found: Mapping[str, Any]) -> None:
    """Raise :class:`RegionError` where the region returned no tensor, or none that requires grad."""
    tensors = [v for v in found.values() if isinstance(v, torch.Tensor)]
    if not tensors:
        raise RegionError(
            f"the region returned no tensor (got {type(outputs).__name__}); "
            "recheck compares what checkpoint recomputes, so the region must return a tensor")
    if not any(t.requires_grad for t in tensors):
        raise RegionError(
            "no output of the region requires grad, so checkpoint would never recompute it; "
            "pass an input with requires_grad=True or use a module with parameters")


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


def make_upstream(outputs: Mapping[str, Any], given: Any) -> list[tuple[str, torch.Tensor]]:
    """The upstream gradient of each output that requires grad: ``given``, or seeded noise.

    Raises:
        RegionError: when ``given`` does not fit the outputs (their count, or an output's
            shape, named with both shapes): the backward, and so the recompute, would not run.
    """
    wanted = [(p, t) for p, t in outputs.items() if isinstance(t, torch.Tensor)
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
        # drawn in single precision but for double outputs: torch's float32 normals are a
        # vectorized kernel, and a half-precision output keeps no more of a double draw
        drawn = (torch.complex128 if tensor.dtype == torch.complex128 else torch.complex64) if tensor.is_complex() \
            else (torch.float64 if tensor.dtype == torch.float64 else torch.float32)
        base = torch.randn(tensor.shape, generator=generator, dtype=drawn)
        upstream.append((path, base.to(dtype=tensor.dtype, device=tensor.device)))
    return upstream


_LATENT_WHY = ("latent: early stop ended the recompute before this ran; "
               "use_reentrant=True or early_stop=False run it")


@showing()
def check_region_report(fn: Callable[..., Any], args: tuple, kwargs: dict, *, use_reentrant: bool,
                        preserve_rng_state: bool, early_stop: bool, grad_outputs: Any,
                        watch_options: Mapping[str, Any], tolerance: Tolerance | None) -> Report:
    """The report of :func:`recheck.check` (see there for the arguments): the twin check of
    the step :class:`RegionStep` makes of the region, under a watch that replays an early
    stopped recompute fully (what only that replay shows is latent)."""
    from recheck.checker.message import configuration_text, title
    from recheck.runtime.reach import static_reach

    region = region_name(fn)
    step = RegionStep(fn, args, kwargs, use_reentrant=use_reentrant, preserve_rng_state=preserve_rng_state,
                      early_stop=early_stop, grad_outputs=grad_outputs)
    # what the region alone reaches is its watch's too: walked once, handed to the watch (RegionStep)
    step.reach = static_reach(fn, (), {})
    twin = Twin(step, reach=static_reach(fn, args, kwargs, step.reach), inputs=input_tensors(args, kwargs))
    ctx = Context(region=region, invocation=Invocation(index=1, of=1), tolerance=tolerance,
                  use_reentrant=use_reentrant, preserve_rng_state=preserve_rng_state)
    written, plain, found, notes = _compared(twin, ctx, region, 1, dict(watch_options), plain_error=True,
                                             detail={"store": "copy"}, once=True)
    if early_stop and not use_reentrant and written.error is None and not plain.inert:
        # early stop ended the recompute: a full replay runs the rest, and what only it shows is latent
        replay = twin.run("as written", {**watch_options, "early_stop": False}, lean=True)
        said = {(f.kind, f.subject) for f in found}
        latent = [dataclasses.replace(f, detail="\n".join(filter(None, (f.detail, _LATENT_WHY))))
                  for f in (replay.report.findings if replay.report is not None else ())
                  if f.latent and (f.kind, f.subject) not in said]
        found = with_likely_causes(found + latent)
        notes.append("early stop ended the recompute; a full replay observed the rest")
    # the region's one call is the check's own (its call site is recheck's): named by the title
    found = [dataclasses.replace(f, invocation=Invocation(f.invocation.index, f.invocation.of))
             if f.invocation is not None and f.region == region else f for f in found]
    stats = {"runs": twin.runs, "saved_tensors_compared": written.saved_compared,
             "modules": len(twin.reach.modules)}
    config = configuration_text(use_reentrant, preserve_rng_state, early_stop, tolerance)
    return Report(found, title=title(region, config), notes=notes, stats=stats)
