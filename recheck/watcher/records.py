"""One record per checkpoint invocation: what its forward saw, compared at each recompute.

A record is matched to its recomputation by identity: the record travels inside the
function object handed to torch (``dispatch.WatchedFunction``), so the recompute of call 3
is compared with the forward of call 3, never with another call of the same shape.

The forward keeps: RNG states at entry (and which streams it consumed), the globals the
region's function reads, parameter versions of the modules it runs, their buffers and
plain attributes at forward exit, prints of its outputs, and (non-reentrant) prints of
every tensor autograd saved.  A recompute is compared against all of these; each
difference becomes a :class:`~recheck.findings.Finding` with the kind vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Mapping

import torch
from torch.utils._pytree import keystr, tree_flatten_with_path

from recheck.catalogue import explain, hint
from recheck.checker.reach import Reach
from recheck.checker.values import show
from recheck.findings import Finding, Invocation
from recheck.watcher import capture
from recheck.watcher.prints import Store, TensorPrint, print_tensor
from recheck.watcher.regions import RegionKey

__all__ = ["Forward", "InvocationRecord", "SavedPrint"]


@dataclass
class Forward:
    """What the forward of one invocation saw."""

    reach: Reach
    entry: dict[tuple[str, str], Any]
    shown: dict[tuple[str, str], str]
    rng_consumed: set[tuple[str, str]] = field(default_factory=set)
    state_exit: capture.ModuleState = field(default_factory=dict)
    outputs: list[tuple[str, TensorPrint]] | None = None
    saved: list[SavedPrint] = field(default_factory=list)
    #: saved tensors whose print is taken when the forward returns (see ``saved_print``)
    unprinted: list[tuple[SavedPrint, torch.Tensor]] = field(default_factory=list)
    #: indices of saved tensors that are module buffers (compared as buffers, not here)
    saved_buffers: set[int] = field(default_factory=set)
    #: data pointers of the reached modules' buffers, and how many modules they cover
    buffer_pointers: frozenset[int] = frozenset()
    buffer_modules: int = -1
    #: the modules the callable names directly, then those the forward ran, by id
    ran: dict[int, torch.nn.Module] = field(default_factory=dict)
    #: those modules and their submodules, named: whose state is compared
    state_modules: list[tuple[str, torch.nn.Module]] = field(default_factory=list)

    def is_buffer(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor`` is a buffer of a module the region reaches (by data pointer)."""
        if self.buffer_modules != len(self.reach.modules):
            self.buffer_modules = len(self.reach.modules)
            self.buffer_pointers = frozenset(
                buffer.data_ptr()
                for _, module in list(self.reach.modules.values())
                for buffer in module._buffers.values()
                if buffer is not None and buffer.numel()
            )
        return bool(tensor.numel()) and tensor.data_ptr() in self.buffer_pointers


class SavedPrint:
    """The metadata torch's ``determinism_check`` keeps per saved tensor, plus our print.

    Equality is torch's own (``base``, e.g. shape/dtype/device), so torch's checks and
    messages are unchanged; the comparison also hands both prints to the record.  A
    forward's ``print`` is None until its forward returns.
    """

    __slots__ = ("base", "print", "record", "index")

    def __init__(self, base: Any, tensor_print: TensorPrint | None, record: InvocationRecord | None, index: int) -> None:
        self.base, self.print, self.record, self.index = base, tensor_print, record, index

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SavedPrint):
            return NotImplemented
        if self.record is not None and other.record is None and self.print is not None and other.print is not None:
            self.record.compare_saved(self.index, self.print, other.print)
        return bool(self.base == other.base)

    def __ne__(self, other: object) -> bool:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(self.base)


def _tensor_leaves(value: Any, root: str, store: Store) -> list[tuple[str, TensorPrint]]:
    leaves, _ = tree_flatten_with_path(value)
    return [(root + keystr(path), print_tensor(leaf, store)) for path, leaf in leaves if isinstance(leaf, torch.Tensor)]


class InvocationRecord:
    """A checkpoint invocation: its forward, its recomputations and their findings."""

    def __init__(
        self,
        region: RegionKey,
        index: int,
        tags: Mapping[str, Any],
        *,
        entry: str,
        store: Store,
        strict: bool,
        function: Any,
    ) -> None:
        self.region, self.index, self.tags = region, index, dict(tags)
        self.entry, self.store, self.strict = entry, store, strict
        self.function = function
        self.reentrant = entry == "reentrant"
        self.early_stop: bool | None = None
        #: the call's ``preserve_rng_state`` (None when the entry point does not say)
        self.preserve_rng_state: bool | None = None
        self.grad_enabled = True
        self.forward: Forward | None = None
        self.forward_done = False
        self.failed = False
        self.recomputes = 0
        self.closed = False
        self.findings: list[Finding] = []
        self._pass_saved: set[int] = set()

    # -- forward -------------------------------------------------------------------------

    def begin_forward(self, reach: Reach) -> None:
        entry, shown = capture.entry_state(reach)
        self.forward = Forward(reach, entry, shown)
        for module in capture.direct_modules(self.function, reach):
            self.forward.ran.setdefault(id(module), module)

    def add_module(self, module: torch.nn.Module) -> None:
        """A module ran inside the forward (found by the global forward pre-hook)."""
        forward = self.forward
        if forward is not None:
            capture.add_module(forward.reach, module)
            forward.ran.setdefault(id(module), module)

    def end_forward(self, output: Any, has_output: bool) -> None:
        forward = self.forward
        if forward is None:
            return
        exit_state, _ = capture.entry_state(forward.reach, rng_only=True)
        forward.rng_consumed = {k for k, v in exit_state.items() if k[0] == "rng" and forward.entry.get(k) != v}
        forward.state_modules = capture.with_submodules(forward.reach, forward.ran.values())
        forward.state_exit = capture.module_state(forward.state_modules, self.store)
        if has_output:
            forward.outputs = _tensor_leaves(output, "output", self.store)
        for saved, tensor in forward.unprinted:
            saved.print = print_tensor(tensor, self.store)
        forward.unprinted = []
        self.forward_done = True

    def abort_forward(self) -> None:
        self.failed = True
        self.forward_done = True
        if self.forward is not None:
            self.forward.unprinted = []

    def saved_print(self, tensor: torch.Tensor, base: Any) -> SavedPrint:
        """``determinism_check`` hook: the forward's print of a saved tensor, or a recompute's.

        The forward's print is taken when its forward returns, not now: a kernel may fill a
        tensor after saving it (RReLU saves its noise buffer, then draws into it), so bytes
        read at pack time can be uninitialized memory.  The tensor is held until then, as
        the uncheckpointed forward would hold it.  torch computes the recompute's metadata
        after the recompute ran, so its print is taken here.
        """
        forward = self.forward
        if not self.forward_done and forward is not None:
            index = len(forward.saved)
            saved = SavedPrint(base, None, self, index)
            forward.saved.append(saved)
            forward.unprinted.append((saved, tensor.detach()))
            if forward.is_buffer(tensor):
                forward.saved_buffers.add(index)
            return saved
        return SavedPrint(base, print_tensor(tensor, self.store), None, -1)

    # -- recompute -----------------------------------------------------------------------

    def begin_recompute(self) -> tuple[dict[tuple[str, str], Any], capture.ModuleState]:
        """Compare what the recompute starts from with the forward; return the entry snapshot."""
        self.recomputes += 1
        self._pass_saved = set()
        forward = self.forward
        assert forward is not None
        entry, _ = capture.entry_state(forward.reach, with_text=False)
        versions: list[tuple[str, Any, Any]] = []
        for key, value in entry.items():
            kind, subject = key
            before = forward.entry.get(key, value)
            if kind == "rng" or before == value:
                continue
            if kind == "global":
                now = capture.global_text(forward.reach, key)
                self._add("global", f"{subject} was {forward.shown[key]} at forward and {now} at recompute",
                          subject=subject)
            elif kind == "param_version":
                versions.append((subject, before, value))  # subject: the parameter's name
        if versions:
            self._version_finding(versions)
        state_entry = capture.module_state(forward.state_modules, self.store)
        for state_key, value in state_entry.items():
            before = forward.state_exit.get(state_key, value)
            if not _same(before, value):
                self._state_finding(state_key, before, value, "changed between forward and recompute")
        return entry, state_entry

    def end_recompute(self, entry: dict[tuple[str, str], Any], state_entry: capture.ModuleState,
                      output: Any, has_output: bool, effects: list[Any]) -> None:
        forward = self.forward
        assert forward is not None
        exit_state, _ = capture.entry_state(forward.reach, rng_only=True)
        consumed = {k for k, v in exit_state.items() if k[0] == "rng" and entry.get(k) != v}
        for key in sorted(consumed | forward.rng_consumed):
            if entry.get(key) != forward.entry.get(key):
                self._add("rng", f"{key[1]} state at recompute differs from the forward's; the region draws from it",
                          subject=key[1],
                          detail="checkpoint restores only torch's default generators, and only with "
                                 "preserve_rng_state=True")
        state_exit = capture.module_state(forward.state_modules, self.store)
        for state_key, value in state_exit.items():
            before = state_entry.get(state_key, value)
            if not _same(before, value):
                self._state_finding(state_key, before, value, "updated again by the recompute")
        if has_output and forward.outputs is not None:
            recomputed = dict(_tensor_leaves(output, "output", self.store))
            for path, original in forward.outputs:
                again = recomputed.get(path)
                if again is not None and not original.same(again):
                    self._add("recompute", f"recomputed {path} differs from the forward's",
                              subject=path, detail=original.difference(again))
        effects = [e for e in effects if not _torch_own(e)]
        if effects:
            shown = "; ".join(str(e) for e in effects[:3]) + (f"; ... ({len(effects)} in all)" if len(effects) > 3 else "")
            self._add("side_effect", f"the recompute emitted {len(effects)} side effect(s) again: {shown}",
                      subject="side effects")

    def compare_saved(self, index: int, original: TensorPrint, recomputed: TensorPrint) -> None:
        if index in self._pass_saved:
            return
        self._pass_saved.add(index)
        if self.forward is not None and index in self.forward.saved_buffers:
            return  # a module buffer autograd saved: the buffer comparison reports it
        if not original.same(recomputed):
            self._add("recompute", f"saved tensor #{index} recomputed in backward differs from the forward's",
                      subject=f"saved tensor #{index}", detail=original.difference(recomputed))

    def release(self) -> None:
        """Drop what only a later recompute would need (called when torch frees the graph)."""
        self.function = None
        forward = self.forward
        if forward is not None:
            forward.saved, forward.unprinted, forward.outputs, forward.state_exit = [], [], None, {}
            forward.ran, forward.state_modules = {}, []

    # -- findings ------------------------------------------------------------------------

    def _state_finding(self, key: tuple[str, str, str], before: Any, after: Any, how: str) -> None:
        forward = self.forward
        assert forward is not None
        module_name, what, name = key
        module = next((m for n, m in forward.reach.modules.values() if n == module_name), None)
        label = f"{module_name}.{name}" if module_name else name
        if what == "buffer":
            batchnorm = isinstance(module, torch.nn.modules.batchnorm._NormBase)
            message = (f"BatchNorm statistics `{label}` {how}" if batchnorm else f"buffer `{label}` {how}")
            self._add("buffer", message, subject=f"buffer `{label}`", detail=before.difference(after))
        else:
            self._add("state", f"attribute `{label}` {how}: {show(before[1])} -> {show(after[1])}",
                      subject=f"attribute `{label}`")

    def _version_finding(self, versions: list[tuple[str, Any, Any]]) -> None:
        """One finding for the parameters (name, version at forward, at recompute) that changed."""
        shown = [f"`{name}` (version {before} at forward, {after} at recompute)" for name, before, after in versions]
        listed = ", ".join(shown[:_LISTED]) + (f" and {len(shown) - _LISTED} more" if len(shown) > _LISTED else "")
        plural = "s" if len(versions) > 1 else ""
        detail = "an optimizer step or another in-place update ran between this invocation's forward and its recompute"
        if len(shown) > _LISTED:
            detail += "\n" + "\n".join(shown)
        self._add("param_version", f"parameter{plural} modified in place between forward and recompute: {listed}",
                  subject=f"parameter{plural} " + ", ".join(f"`{name}`" for name, _, _ in versions),
                  detail=detail)

    def _add(self, kind: str, message: str, *, subject: str, detail: str = "") -> None:
        # Under strict=True an invocation whose own setting was early stop replays fully: Python
        # state and side effects after the last saved tensor only ran because of that.  (A
        # buffer updated by a kernel, like BatchNorm's, is updated with early stop too.)
        if any(f.message == message and f.subject == subject for f in self.findings):
            return
        latent = self.strict and self.early_stop is True and kind in ("state", "side_effect")
        context = {} if self.preserve_rng_state is None else {"preserve_rng_state": self.preserve_rng_state}
        code = explain(kind, subject, **context)
        finding = Finding(kind, message, code=code, region=str(self.region), subject=subject, detail=detail,
                          hint=hint(code) if code else None, latent=latent,
                          invocation=Invocation(self.index, None, dict(self.tags), self.region.callsite))
        self.findings.append(finding)

    def findings_of(self, calls_of_region: int) -> list[Finding]:
        """The findings with ``call i of n`` filled in."""
        out = []
        for finding in self.findings:
            invocation = replace(finding.invocation, of=calls_of_region) if finding.invocation else None
            where = f"in {self.region}, {invocation}" if invocation else f"in {self.region}"
            detail = where + ("\n" + finding.detail if finding.detail else "")
            out.append(replace(finding, invocation=invocation, detail=detail))
        return out


#: parameters a ``param_version`` message names before "and N more" (the detail lists all)
_LISTED = 4


def _same(before: Any, after: Any) -> bool:
    if isinstance(before, TensorPrint) and isinstance(after, TensorPrint):
        return before.same(after)
    return bool(before[0] == after[0])


#: warnings torch itself emits when a checkpoint call is made again during a recompute
_TORCH_WARNINGS = ("torch.utils.checkpoint", "None of the inputs have requires_grad=True")


def _torch_own(effect: Any) -> bool:
    return effect.channel == "warning" and any(text in effect.text for text in _TORCH_WARNINGS)
