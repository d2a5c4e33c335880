"""One traced run of a step: storage lifetimes, what autograd holds, and the work done.

Three instruments run together:

* a ``TorchDispatchMode`` sees every operator (forward, backward, recompute, optimizer
  step): it follows each output storage in the :class:`~recheck.cost.ledger.Ledger`,
  counts FLOPs and bytes moved (:mod:`recheck.cost.work`) by phase and by region;
* outer ``saved_tensors_hooks`` see every tensor autograd saves outside non-reentrant
  checkpoints (inside one, torch's own inner hooks take over: only the kept inputs are
  visible) and hold its storage in the ledger until autograd frees the saved slot;
* for a non-reentrant recompute, whose saved tensors live in torch's checkpoint frame
  where no outer hook sees them, the storages the recompute created and that are still
  alive when it has ended (checked at the next operator, once the early-stop exception
  has unwound) are held until they are freed: that is the rebuilt saved set.

Phases are told apart by ``torch._C._current_graph_task_id()`` (-1 outside backward) and
by optimizer step hooks.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from recheck.cost.ledger import Ledger, storage_key
from recheck.cost.router import RegionCall, Router
from recheck.runtime.steps import StepState
from recheck.cost.work import Work, op_work

__all__ = ["PHASES", "StepTrace", "Tracer", "cuda_peak", "label_graph", "running_label", "tensor_storage"]

PHASES = ("forward", "backward", "optimizer")


@dataclass
class StepTrace:
    """What one traced run measured."""

    ledger: Ledger
    work: dict[str, Work] = field(default_factory=lambda: {p: Work() for p in PHASES})
    saved_at_end_of_forward: int = 0
    observed_at_end_of_forward: int = 0
    end_of_forward_index: int | None = None


def tensor_storage(t: Any) -> Any | None:
    """The untyped storage of a tensor, or None (not a tensor, sparse, meta, no storage)."""
    if not isinstance(t, torch.Tensor) or t.is_sparse or t.device.type == "meta":
        return None
    try:
        return t.untyped_storage()
    except (RuntimeError, NotImplementedError):  # tensor subclasses without storage
        return None


def _metadata(node: Any) -> dict[str, Any]:
    """An autograd node's metadata dict (a property at run time; torch's stubs call it a method)."""
    return cast("dict[str, Any]", node.metadata)


def label_graph(tensors: Any, key: str, value: Any) -> None:
    """Set ``key`` to ``value`` on every node of the graph behind ``tensors`` that has no ``key`` yet.

    Autograd makes a node after the operator returns (above a dispatch mode), so a graph is
    labelled from the values a frame receives (what came before it) and returns (what it
    made); the walk stops at a labelled node, so each node is visited once.
    """
    todo = [leaf.grad_fn for leaf in tree_leaves(tensors) if isinstance(leaf, torch.Tensor)]
    while todo:
        node = todo.pop()
        if node is None or key in _metadata(node):
            continue
        _metadata(node)[key] = value
        todo.extend(next_node for next_node, _ in node.next_functions)


def running_label(key: str) -> Any:
    """The ``key`` label of the autograd node running now (None outside backward or unlabelled)."""
    node = torch._C._current_autograd_node()
    return None if node is None else _metadata(node).get(key)


class _Packed:
    """What the outer pack hook hands autograd: the tensor, released with this object."""

    __slots__ = ("__weakref__", "tensor")

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor


class _Mode(TorchDispatchMode):
    def __init__(self, tracer: Tracer) -> None:
        super().__init__()
        self.tracer = tracer

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        tracer = self.tracer
        tracer.before_operator()
        out = func(*args, **kwargs)
        tracer.after_operator(func, args, kwargs, out)
        return out


class Tracer:
    """``with Tracer(state, router) as tracer: step()``; the figures are in ``tracer.trace``."""

    def __init__(self, state: StepState, router: Router) -> None:
        self.state, self.router = state, router
        self.trace = StepTrace(Ledger())
        self.excluded: set[int] = set()
        self.pending: list[RegionCall] = []
        self.in_optimizer = 0
        #: the recompute whose rebuilt set is being held right now (for ledger listeners)
        self.holding_for: RegionCall | None = None
        self._handles: list[Any] = []
        self._contexts: list[Any] = []

    # -- setup ----------------------------------------------------------------------------
    def __enter__(self) -> Tracer:
        ledger = self.trace.ledger
        for tensor in [*self.state.parameters(), *self.state.buffers()]:
            storage = tensor_storage(tensor)
            if storage is not None:
                self.excluded.add(ledger.track(storage, "parameters"))
        for p in self.state.parameters():
            if p.grad is not None and (storage := tensor_storage(p.grad)) is not None:
                ledger.track(storage, "gradients")
            if p.requires_grad:
                self._handles.append(p.register_post_accumulate_grad_hook(self._grad_ready))
        for tensor in self.state.optimizer_tensors():
            if (storage := tensor_storage(tensor)) is not None:
                ledger.track(storage, "optimizer_state")
        for tensor in self.state.tensors:
            if (storage := tensor_storage(tensor)) is not None:
                ledger.track(storage, "other")
        for opt in self.state.optimizers:
            self._handles.append(opt.register_step_pre_hook(self._optimizer_begins))
            self._handles.append(opt.register_step_post_hook(self._optimizer_ends))
        self.router.on_recompute_end = self._recompute_ended
        hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        mode = _Mode(self)
        for context in (hooks, mode):
            context.__enter__()
            self._contexts.append(context)
        ledger.mark()
        return self

    def __exit__(self, *exc: object) -> None:
        while self._contexts:
            self._contexts.pop().__exit__(None, None, None)
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self.router.on_recompute_end = None
        self.before_operator()
        self.trace.ledger.mark()

    # -- phases ---------------------------------------------------------------------------
    def phase(self) -> str:
        """The phase running now: forward, backward or optimizer."""
        if self.in_optimizer:
            return "optimizer"
        return "backward" if torch._C._current_graph_task_id() != -1 else "forward"

    def _optimizer_begins(self, *_: Any) -> None:
        self.in_optimizer += 1

    def _optimizer_ends(self, optimizer: Any, *_: Any) -> None:
        self.in_optimizer -= 1
        for st in optimizer.state.values():
            for value in st.values():
                if (storage := tensor_storage(value)) is not None:
                    self.trace.ledger.set_base(storage, "optimizer_state")

    def _grad_ready(self, param: torch.Tensor) -> None:
        if param.grad is not None and (storage := tensor_storage(param.grad)) is not None:
            self.trace.ledger.set_base(storage, "gradients")

    # -- autograd's saved tensors ----------------------------------------------------------
    def _pack(self, tensor: torch.Tensor) -> Any:
        storage = tensor_storage(tensor)
        if storage is None:
            return tensor
        key = storage_key(storage)
        if key in self.excluded:
            return tensor
        machinery = self.router.machinery()
        ledger = self.trace.ledger
        ledger.hold(storage, "input" if machinery is not None else "saved")
        nbytes = ledger.nbytes(key)
        if machinery is not None:
            machinery.inputs.setdefault(key, nbytes)
        for call in self.router.calls():
            call.saved.setdefault(key, nbytes)
            call.packs_seen += 1
        packed = _Packed(tensor)
        weakref.finalize(packed, ledger.release, key)
        return packed

    @staticmethod
    def _unpack(packed: Any) -> torch.Tensor:
        return packed.tensor if isinstance(packed, _Packed) else packed

    # -- operators -----------------------------------------------------------------------
    def before_operator(self) -> None:
        """Settle ended non-reentrant recomputes: what they built and still lives is held."""
        trace = self.trace
        trace.ledger.phase = self.phase()
        if trace.end_of_forward_index is None and trace.ledger.phase == "backward":
            trace.end_of_forward_index = len(trace.ledger.timeline)
            trace.saved_at_end_of_forward = trace.ledger.saved_total
            trace.observed_at_end_of_forward = trace.ledger.observed_total
        if not self.pending or self.router.calls():
            return
        pending, self.pending = self.pending, []
        ledger = trace.ledger
        for call in pending:
            self.holding_for = call
            for ref in call.created:
                storage = ref()
                if storage is not None:
                    # held for as long as it lives: the ledger lets go when it is freed
                    ledger.hold(storage, "recomputed")
        self.holding_for = None
        ledger.mark()

    def after_operator(self, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
        """Follow the operator's output storages and count its work."""
        trace = self.trace
        calls = self.router.calls()
        innermost = calls[-1] if calls else None
        ledger = trace.ledger
        for leaf in tree_leaves(out):
            storage = tensor_storage(leaf)
            if storage is None:
                continue
            key = storage_key(storage)
            if key in ledger.entries and ledger.entries[key].observed:
                continue
            ledger.track(storage, "temporary")
            if innermost is not None and innermost.recompute:
                innermost.created.append(weakref.ref(storage))
        ledger.tell("read", args, kwargs)
        work = op_work(func, args, kwargs, out)
        trace.work[self.phase()].add(work)
        if innermost is not None:
            (innermost.stats.recompute if innermost.recompute else innermost.stats.forward).add(work)
        ledger.mark()

    def _recompute_ended(self, call: RegionCall) -> None:
        if call.packs_seen == 0 and call.created:
            self.pending.append(call)


class cuda_peak:
    """``with cuda_peak(state) as peak: step()``; then ``peak.result``, the allocator's peaks (None off CUDA).

    On CPU there is no caching allocator to ask: the observed peak is the ledger's.  On CUDA the
    allocator's counters are read around an untraced run: *allocated* is what tensors occupy
    (block-rounded), *reserved* adds the blocks the caching allocator keeps (fragmentation and
    cache), which ``out of memory`` is judged against.  Both are absolute counters.
    """

    def __init__(self, state: StepState) -> None:
        self.device = next((p.device for p in state.parameters() if p.is_cuda), None)
        self.active = torch.cuda.is_available() and (self.device is not None or torch.cuda.is_initialized())
        self.result: dict[str, Any] | None = None

    def __enter__(self) -> cuda_peak:
        if self.active:
            self.device = self.device or torch.device("cuda", torch.cuda.current_device())
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.before = torch.cuda.memory_allocated(self.device)
        return self

    def synchronize(self) -> None:
        """Wait for queued device work (so a wall-clock time covers it); no-op off CUDA."""
        if self.active:
            torch.cuda.synchronize(self.device)

    def __exit__(self, *exc: object) -> None:
        if self.active:
            torch.cuda.synchronize(self.device)
            self.result = {"device": str(self.device),
                           "max_memory_allocated": torch.cuda.max_memory_allocated(self.device),
                           "max_memory_reserved": torch.cuda.max_memory_reserved(self.device),
                           "allocated_before_step": self.before}
