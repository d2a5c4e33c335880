"""The check algorithm for one region.

1. Snapshot every piece of state the region can touch (see :mod:`recheck.runtime.reach`,
   :mod:`recheck.runtime.snapshot`), the input tensors included.
2. Plain run: call the region without checkpoint, then backward with a fixed,
   seeded upstream gradient (or the caller's ``grad_outputs``).
3. Restore.  4. Checkpointed run with the caller's configuration, same upstream
   gradient; for non-reentrant checkpoint a bitwise ``determinism_check`` compares
   every saved tensor (:mod:`recheck.runtime.saved_tensors`).  Restore.
5. When early stop cut the recompute short (non-reentrant, ``early_stop=True``), a
   full replay observes the whole recompute: the state right after the checkpointed
   forward is put back and the region is called again the way checkpoint's recompute
   calls it (forward RNG restored, same inputs, grad mode on).  What only the replay
   shows is reported as *latent*.  When the checkpointed forward left every piece of
   state as the check found it (the streams the recompute resets aside) and the plain
   forward, run with grad from that same state, did too, the replay would be that
   plain forward again: its record stands in and nothing runs a third time.
6. Restore: a check leaves no trace.  Each run's state is observed and restored in one
   pass; a tensor is copied only when its bytes changed.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from recheck.runtime.bits import Tolerance, bits_equal
from recheck.checker.inputs import RegionError, arguments_print, make_upstream, prepare_inputs
from recheck.checker.observe import CallRecord, Observer, Probe
from recheck.runtime.reach import ModuleRecorder, Reach, static_reach
from recheck.runtime.trees import input_tensors, leaves
from recheck.runtime.saved_tensors import MODE, SavedTensorLog, bitwise_determinism
from recheck.runtime.snapshot import (DefaultDtypeRecord, Observed, RngRecord, Snapshot, TensorRecord)

__all__ = ["CheckOptions", "RegionError", "RunResult", "Runner"]



@dataclass(frozen=True)
class CheckOptions:
    """The checkpoint configuration under test and the comparison's tolerance."""

    use_reentrant: bool = False
    preserve_rng_state: bool = True
    early_stop: bool = True
    grad_outputs: Any = None
    tolerance: Tolerance | None = None


@dataclass
class RunResult:
    """What one run of the region produced."""

    mode: str
    outputs: Any = None
    grads: dict[str, torch.Tensor | None] = field(default_factory=dict)
    post: dict[tuple[str, str], Observed] = field(default_factory=dict)
    calls: list[CallRecord] = field(default_factory=list)
    forward_error: BaseException | None = None
    backward_error: BaseException | None = None
    saved: SavedTensorLog | None = None
    rng_at_forward: torch.Tensor | None = None
    baseline: dict[tuple[str, str], Observed] | None = None  # replay: state before recompute
    stand_in: bool = False  # replay: the plain forward's call, which started from the same state


class Runner:
    """Runs one region in the three modes, restoring the snapshot between runs."""

    def __init__(self, fn: Callable[..., Any], args: tuple, kwargs: dict,
                 options: CheckOptions) -> None:
        self.fn, self.args, self.kwargs, self.options = fn, args, kwargs, options
        self.reach: Reach = static_reach(fn, args, kwargs)
        self.snapshot = Snapshot(RngRecord(self.reach.generators))
        self.snapshot.add(("default dtype",), DefaultDtypeRecord)
        self.parameters: dict[str, torch.Tensor] = {}
        self.upstream: list[tuple[str, torch.Tensor]] | None = None
        self.after_forward: tuple[Snapshot | None, tuple, dict] | None = None
        self.plain_forward: CallRecord | None = None  # set when it left the state as found
        self._inputs: dict[str, TensorRecord] = {}
        self._user_args: Any = None
        self._calls: list[CallRecord] = []
        self._dirty = False
        self._sync()

    # -- snapshot bookkeeping --------------------------------------------------------------------
    def _sync(self) -> None:
        """Add records for everything the reach knows and the snapshot does not yet."""
        self.parameters.update(self.snapshot.track(self.reach))
        for path, tensor in input_tensors(self.args, self.kwargs):
            if self.snapshot.add(("input", id(tensor)), functools.partial(TensorRecord, "input_mutation", path,
                                                                          tensor)):
                self._inputs[path] = self.snapshot.records[-1]

    def _on_module(self, module: torch.nn.Module) -> None:
        if id(module) not in self.reach.modules:
            self.reach.add_module(self.reach.name_unknown(module), module)
            self._sync()

    def restore(self) -> None:
        """Put back everything as it was before the check (nothing to do after a settled run)."""
        if self._dirty:
            self.snapshot.restore()
            self._dirty = False

    def _settle(self) -> dict[tuple[str, str], Observed]:
        """The state after a run, then restored (each tensor compared once)."""
        seen = self.snapshot.observe_and_restore()
        self._dirty = False
        return seen

    def _reset_streams(self) -> frozenset[str]:
        """RNG streams checkpoint's recompute (and the full replay) set back to the forward's."""
        return frozenset({"cpu RNG"}) if self.options.preserve_rng_state else frozenset()

    def buffer_storages(self) -> frozenset[int]:
        """Storage pointers of every buffer of a reached module; a tensor subclass without a
        storage of its own (FSDP2's DTensor) has none, and is left out, as a saved tensor of
        that kind is (``runtime.saved_tensors``)."""
        pointers = set()
        for _, module in self.reach.modules.values():
            for buffer in module._buffers.values():
                if buffer is not None and buffer.layout == torch.strided:
                    try:
                        pointers.add(buffer.untyped_storage().data_ptr())
                    except (RuntimeError, NotImplementedError):
                        continue
        return frozenset(pointers)

    # -- one run ---------------------------------------------------------------------------------
    def _call(self, observer: Observer, args: tuple, kwargs: dict, mode: str,
              log: SavedTensorLog | None) -> Any:
        if mode == "plain":
            return observer(*args, **kwargs)
        from torch.utils.checkpoint import checkpoint

        target = observer if not kwargs else (lambda *a: observer(*a, **kwargs))
        options = self.options
        if options.use_reentrant:
            return checkpoint(target, *args, use_reentrant=True,
                              preserve_rng_state=options.preserve_rng_state)
        return checkpoint(target, *args, use_reentrant=False,
                          preserve_rng_state=options.preserve_rng_state,
                          determinism_check=MODE if log is not None else "default",
                          early_stop=options.early_stop)

    def execute(self, mode: str) -> RunResult:
        """Run the region once: ``plain``, or ``user`` (checkpointed as configured)."""
        self._dirty = True
        for record in self.snapshot.grads():
            record.clear()
        args, kwargs, leaves = prepare_inputs(self.args, self.kwargs)
        probe = Probe(self.reach, self.parameters)
        keep = self._keep_after_forward if mode == "user" else self._check_plain_forward
        self.plain_forward = None if mode == "plain" else self.plain_forward
        if mode == "user":
            self._user_args = arguments_print(args, kwargs)
        observer = Observer(self.fn, probe, passthrough=mode == "plain",
                            track_inputs=mode == "plain", after_first=keep)
        result = RunResult(mode=mode, calls=observer.calls)
        self._calls = observer.calls
        reentrant = self.options.use_reentrant
        bitwise = bitwise_determinism() if mode != "plain" and not reentrant else contextlib.nullcontext()
        quiet = warnings.catch_warnings() if mode != "plain" else contextlib.nullcontext()
        with ModuleRecorder(self._on_module), bitwise as log, quiet:
            if mode != "plain":
                warnings.simplefilter("ignore")
            result.saved = log
            result.rng_at_forward = torch.get_rng_state()  # what checkpoint stashes
            try:
                result.outputs = self._call(observer, args, kwargs, mode, log)
            except Exception as exc:
                result.forward_error = exc
            if log is not None:
                log.freeze()
            if result.forward_error is None:
                self._backward(result)
            result.grads = {f"`{name}`": p.grad for name, p in self.parameters.items()}
            result.grads.update({path: leaf.grad for path, leaf in leaves.items()})
        result.post = self._settle()
        return result

    def _check_plain_forward(self, args: tuple, kwargs: dict) -> None:
        """Keep the plain forward's call when it ran with grad and left the state as found."""
        if self.options.use_reentrant or not self.options.early_stop:
            return  # no full replay to stand in for
        call = self._calls[0]
        if any(effect.channel == "warning" for effect in call.effects):
            return  # re-shown on the user's stderr, which the record may then hold as well
        if torch.is_grad_enabled() and self.snapshot.unchanged(self._reset_streams()):
            self.plain_forward = call

    def _keep_after_forward(self, args: tuple, kwargs: dict) -> None:
        """Remember the state right after the checkpointed forward, for :meth:`replay`."""
        if not self.options.use_reentrant and self.options.early_stop:
            as_plain = (self.plain_forward is not None and self._inputs_as_captured(args, kwargs)
                        and arguments_print(args, kwargs) == self._user_args
                        and self.snapshot.unchanged(self._reset_streams()))
            self.after_forward = (None if as_plain else self.snapshot.recapture(), args, kwargs)

    def _inputs_as_captured(self, args: tuple, kwargs: dict) -> bool:
        """True when every input tensor the forward got holds the bytes captured at the start."""
        return all(path in self._inputs and bits_equal(t, self._inputs[path].copy)
                   for path, t in input_tensors(args, kwargs))

    def replay(self, user: RunResult) -> RunResult | None:
        """Replay the whole recompute of the checkpointed run, as early_stop=False would.

        Puts back the state as it was right after the checkpointed forward, restores the
        forward's RNG state when ``preserve_rng_state`` (forking the RNG like checkpoint
        does), and calls the region again with the forward's inputs under grad mode.
        Returns None when nothing is left to observe: the forward failed, or the
        recompute already ran to the end.
        """
        recomputes = user.calls[1:]
        if self.after_forward is None or (recomputes and recomputes[0].outcome == "returned"):
            return None
        snapshot, args, kwargs = self.after_forward
        if snapshot is None:
            return self._stand_in(user)
        self._dirty = True
        snapshot.restore()
        baseline = self.snapshot.observe()
        observer = Observer(self.fn, Probe(self.reach, self.parameters))
        observer.calls.append(user.calls[0])
        result = RunResult(mode="replay", calls=observer.calls, baseline=baseline)
        forward_rng = user.rng_at_forward
        with ModuleRecorder(self._on_module), warnings.catch_warnings(), torch.enable_grad():
            warnings.simplefilter("ignore")
            devices = [t.device.index or 0 for _, t in input_tensors(self.args, self.kwargs) if t.is_cuda]
            with torch.random.fork_rng(devices=sorted(set(devices)),
                                       enabled=self.options.preserve_rng_state):
                if self.options.preserve_rng_state and forward_rng is not None:
                    torch.set_rng_state(forward_rng)
                try:
                    observer(*args, **kwargs)
                except Exception:  # recorded by the observer as a raising recompute
                    pass
        result.post = self._settle()
        return result

    def _stand_in(self, user: RunResult) -> RunResult:
        """The full replay's observation without running it again.

        The state right after the checkpointed forward was the state the check started
        from (every tensor by bytes and version, every value, every RNG stream but those
        the recompute sets back to the forward's), the forward's inputs held their
        original bytes, and the plain forward ran with grad from that same state and left
        it so.  A replay would start exactly where the plain forward started, with the
        same inputs, RNG and grad mode: it is that call again, so the plain forward's
        record (entry state, side effects, outputs) stands for it and, like it, the
        replay changes no state.
        """
        assert self.plain_forward is not None
        return RunResult(mode="replay", calls=[user.calls[0], self.plain_forward],
                         baseline={}, post={}, stand_in=True)

    def _backward(self, result: RunResult) -> None:
        outputs = dict(leaves(result.outputs))
        if self.upstream is None:
            self.upstream = make_upstream(outputs, self.options.grad_outputs)
        tensors, grads = [], []
        for path, grad in self.upstream:
            leaf = outputs.get(path)
            if isinstance(leaf, torch.Tensor) and leaf.requires_grad and leaf.shape == grad.shape:
                tensors.append(leaf)
                grads.append(grad)
        if not tensors:
            return
        try:
            torch.autograd.backward(tensors, grads)
        except Exception as exc:
            result.backward_error = exc
