"""One record per checkpoint invocation: what its forward saw, compared at each recompute.

A record is matched to its recomputation by identity: the record travels inside the
function object handed to torch (``dispatch.WatchedFunction``), so the recompute of call 3
is compared with the forward of call 3, never with another call of the same shape.

The forward keeps: RNG states at entry (and which streams it consumed), the context it
computes in (grad mode at the call, autocast, default dtype), the globals the region's
function reads, parameter versions of the modules it runs, their buffers and plain
attributes at forward exit, prints of its outputs, and (non-reentrant) prints of every
tensor autograd saved.  A recompute is compared against all of these; each difference
becomes a :class:`~recheck.findings.Finding` with the kind vocabulary.

Only state the region itself runs or touches is compared: the modules whose forward ran
in it, with their submodules; the callable's own modules (``self`` of a bound method or a
closure, a ``partial``'s arguments) for their own attributes; and any buffer of those
modules' subtrees that the forward wrote (``F.batch_norm(x, self.bn.running_mean, ...)``).
A BatchNorm that runs *outside* the region, after the checkpoint returned (torchvision's
DenseNet), changes its statistics between the forward and the recompute, and that is none
of the region's business.  A buffer the recompute updates is reported as "updated again"
only when the forward updated it too (fairscale's patched BatchNorm updates its statistics
in the recompute alone: once, as the uncheckpointed step does).

A difference matters only where the region computes from it or the step keeps it: state
changed between the forward and the recompute is reported where the region's code can read
it (:mod:`recheck.runtime.reads`: a trainer's ``self._current_fx_name``, a config field no
layer names, a global only another method reads are not) and the recompute does not start from
what its forward started from (a ``context_fn`` that puts it back); state the recompute changes
is reported where it ends other than its forward left it (a counter bumped twice, not a value
put back or written again alike) and the region's code names it: state a framework's hooks keep
on a module (DeepSpeed ZeRO-3 counts pending backwards in ``applied_pre_backward_ref_cnt``,
written by a Function its forward hook applies) is the framework's bookkeeping.
"""

from __future__ import annotations

import sys
import operator
import types
from typing import Any, Callable, Iterator, Literal, Mapping, NamedTuple

import torch

from recheck.catalogue import explain, hint
from recheck.runtime.reach import Reach, is_library
from recheck.runtime.reads import names_read, root_functions
from recheck.runtime.bits import Tolerance, same
from recheck.runtime.context import (ComputeContext, WiderContext, context_differences, current_context,
                                     wider_context, wider_differences)
from recheck.runtime.fingerprints import same_objects, shallow
from recheck.runtime.explaining import effect_messages, param_version_message, with_likely_causes
from recheck.runtime.naming import buffer_subject, grad_subject, parameter_subject
from recheck.runtime.trees import input_tensors, tensors
from recheck.findings import Finding, Invocation, Subject, could_not, error_line, parts_of
from recheck.watcher import capture
from recheck.runtime.digests import (ParameterView, Store, TensorPrint, parameter_print_of, parameter_view, planned_digest,
                                     planned_print_of, print_activation, print_tensor)
from recheck.runtime.naming import RegionKey

__all__ = ["LAZY", "Forward", "InvocationRecord", "Recomputed", "SavedPrint", "state_changes"]

#: a (name, module) pair's module; a module's own buffers (C-level passes over the scope)
_MODULE = operator.itemgetter(1)
_BUFFERS = operator.attrgetter("_buffers")
_STRIDED = torch.strided

#: the subject of a finding about the tensors a recompute saved for backward
_SAVED = Subject("saved tensors")
#: the empty set of streams a forward consumed (one object, shared by every record)
_NONE: frozenset[tuple[str, str]] = frozenset()
#: what a forward's containers become once it returned (:meth:`Forward.settle`) where nothing
#: needs them any more or they stayed empty, and a record's until it holds something: read-only,
#: and shared.  A watched invocation's own objects live from its forward to its backward, and
#: every one of them, an empty dict too, counts toward the garbage collector's next collection:
#: the fewer they are, the more seldom a collection promotes the whole step's objects, and the
#: more seldom a full one walks every object of the process
_NO_ENTRIES: Mapping[Any, Any] = types.MappingProxyType({})


class Forward:
    """What the forward of one invocation saw (one per invocation: a class with slots whose
    ``__init__`` sets each slot directly, where a dataclass's called a factory per container)."""

    __slots__ = ("reach", "entry", "shown", "params", "rng_consumed", "state_exit", "outputs", "saved",
                 "saved_buffers", "buffer_pointers", "parameter_pointers", "pointed", "direct", "ran",
                 "buffers_seen", "walked", "state_modules", "attribute_modules", "touched_buffers",
                 "written_buffers", "context", "inputs", "inputs_need_grad", "layout_memo", "scope_pairs", "told",
                 "subtrees", "predicted", "params_after", "wider", "state_entry", "names",
                 "written_values", "globals_exit")

    def __init__(self, reach: Reach, entry: dict[tuple[str, str], Any], shown: dict[tuple[str, str], str],
                 params: capture.ParameterVersions | None = None, context: ComputeContext | None = None) -> None:
        self.reach, self.entry, self.shown = reach, entry, shown
        #: the parameters' versions at forward entry: of the scope the region's last invocation
        #: had (``predicted``), or of its whole reach (``predicted`` None)
        self.params = params
        self.predicted: tuple[tuple[str, torch.nn.Module], ...] | None = None
        #: where the scope is not the one predicted: its parameters' versions when the forward
        #: returned, for those the entry did not read
        self.params_after: capture.ParameterVersions | None = None
        self.rng_consumed: frozenset[tuple[str, str]] = _NONE
        #: the prints of the globals the region reads as its forward left them (None: none read)
        self.globals_exit: dict[tuple[str, str], Any] | None = None
        self.state_exit: capture.ModuleState | dict[tuple[str, str], Any] = {}
        self.outputs: list[tuple[str, TensorPrint]] | None = None
        #: what torch saved, in order; each holds its tensor until the forward returns and its
        #: print is taken (see ``saved_print``)
        self.saved: list[SavedPrint] | tuple[()] = []
        #: indices of saved tensors that are module buffers (compared as buffers, not here), as
        #: keys; told when the forward returns (a dict only where there are any: most regions'
        #: modules hold no buffers)
        self.saved_buffers: dict[int, None] = _NO_ENTRIES  # type: ignore[assignment]
        #: data pointers of the compared modules' buffers (keys), and of their parameters, to the
        #: parameter; ``pointed``: read for the scope as it is (see ``_pointers``)
        self.buffer_pointers: dict[int, None] = _NO_ENTRIES  # type: ignore[assignment]
        self.parameter_pointers: dict[int, torch.Tensor] = _NO_ENTRIES  # type: ignore[assignment]
        self.pointed = False
        #: the modules the callable names directly (its own ``self``, a partial's arguments), by id
        self.direct: dict[int, torch.nn.Module] = {}
        #: the modules whose forward ran in the region, by id (those told: a submodule of one
        #: that ran is in the scope with it, and not told, see ``told``)
        self.ran: dict[int, torch.nn.Module] = {}
        #: ids of the modules whose calls need not be told (keys): those that ran and their
        #: submodules, whose state the scope compares already (``intercept.module_calls.pass_over``)
        self.told: dict[int, None] = {}
        #: the subtrees walked for ``buffers_seen`` in this forward, by their root's id
        self.subtrees: capture.Subtrees = {}
        #: the buffers of those modules' subtrees when first seen (to tell what the forward wrote)
        self.buffers_seen: capture.BufferVersions = {}
        #: the modules whose subtrees' buffers are in ``buffers_seen`` (ids, as keys)
        self.walked: dict[int, None] = {}
        #: the modules that ran and their submodules, named: whose buffers and attributes are compared
        self.state_modules: tuple[tuple[str, torch.nn.Module], ...] = ()
        #: the direct modules not among them: whose own attributes are compared
        self.attribute_modules: tuple[tuple[str, torch.nn.Module], ...] = ()
        #: buffers of other modules the forward wrote: (module name, module, buffer name)
        self.touched_buffers: tuple[tuple[str, torch.nn.Module, str], ...] = ()
        #: subjects of the buffers the forward wrote (keys; told by ``scope``)
        self.written_buffers: dict[str, None] = _NO_ENTRIES  # type: ignore[assignment]
        #: grad mode (at the checkpoint call), autocast and default dtype of the forward
        self.context = context
        #: the wider context when the forward returned (modes, flags, hooks: ``runtime.context``)
        self.wider: WiderContext | None = None
        #: the input tensors at forward entry: path, tensor, version (and print under early_stop=False)
        self.inputs: list[tuple[str, torch.Tensor, int, TensorPrint | None]] | tuple[()] = ()
        #: whether any input tensor requires grad (None: the inputs were not seen)
        self.inputs_need_grad: bool | None = None
        #: the layout of the state of the scope, as last found (see ``capture.module_state``): the
        #: reach's, which every invocation of the region reads with the same tuples of modules
        #: (None until a scope with modules is found)
        self.layout_memo: list[Any] | None = None
        #: ``state_modules + attribute_modules``: whose parameters a recompute compares
        self.scope_pairs: tuple[tuple[str, torch.nn.Module], ...] = ()
        #: the state at forward entry, of the scope predicted then (:meth:`read_entry`): a recompute
        #: that starts from it reads what its forward read
        self.state_entry: capture.ModuleState | dict[tuple[str, str], Any] = _NO_ENTRIES  # type: ignore[assignment]
        #: the names the region's code can read (``runtime.reads``; None: not known yet, or at all)
        self.names: frozenset[str] | None = None
        #: the tensors the forward wrote into attributes (the attribute, or a holder's fields), by
        #: their bytes (:func:`_tensor_bytes`): a recompute that writes the same bytes again is alike
        self.written_values: dict[tuple[str, str], Any] = _NO_ENTRIES  # type: ignore[assignment]

    def settle(self) -> None:
        """Once the forward returned and its scope and saved tensors are read: let go of what
        only the running forward needed (the modules that ran, what was told and walked), and
        share :data:`_NO_ENTRIES` for what stayed empty; a recompute only reads them."""
        self.ran = self.direct = self.told = self.subtrees = self.walked = self.buffers_seen = _NO_ENTRIES  # type: ignore[assignment]
        if not self.shown:
            self.shown = _NO_ENTRIES  # type: ignore[assignment]
        if not self.saved_buffers:
            self.saved_buffers = _NO_ENTRIES  # type: ignore[assignment]
        if not self.buffer_pointers:
            self.buffer_pointers = _NO_ENTRIES  # type: ignore[assignment]
        if not self.written_buffers:
            self.written_buffers = _NO_ENTRIES  # type: ignore[assignment]
        if not self.parameter_pointers:
            self.parameter_pointers = _NO_ENTRIES  # type: ignore[assignment]

    def scope(self) -> None:
        """Settle which modules' state is compared (see the module docstring)."""
        reach = self.reach
        # tuples and dicts of strings: what an invocation keeps adds few objects for the
        # garbage collector to walk (an empty tuple is none; a record lives as long as the block)
        self.state_modules = tuple(capture.with_submodules(reach, self.ran.values(), self.subtrees))
        # the same scope as the region's last invocation (the usual case): its very tuples, so
        # that what the layouts keep for them is found by identity, and its set of their ids
        last = reach.kept.get("scope")
        if last is not None and same_objects(last[0], self.state_modules):
            self.state_modules, covered = last[0], last[3]
        else:
            last, covered = None, {id(module) for _, module in self.state_modules}
        attributes: list[tuple[str, torch.nn.Module]] = []
        for module in self.direct.values():
            if id(module) not in covered:
                reach.add_found(module)
                attributes.append(reach.modules[id(module)])
        touched, self.written_buffers = [], {}
        for module, name in capture.changed_buffers(self.buffers_seen):
            reach.add_found(module)
            prefix = reach.modules[id(module)][0]
            self.written_buffers[buffer_subject(prefix, name)] = None
            if id(module) not in covered:
                touched.append((prefix, module, name))
        attribute_modules = tuple(attributes)
        if self.state_modules or attribute_modules:  # (a region of plain functions has none)
            if last is not None and same_objects(last[1], attribute_modules):
                attribute_modules, self.scope_pairs = last[1], last[2]
            else:
                self.scope_pairs = self.state_modules + attribute_modules
                reach.kept["scope"] = (self.state_modules, attribute_modules, self.scope_pairs, covered)
            self.layout_memo = reach.kept.setdefault("layout", [])
        self.attribute_modules, self.touched_buffers = attribute_modules, tuple(touched)
        self.pointed = False  # a new scope: its storages are read when first asked for

    def read_entry(self, store: Store) -> None:
        """Read the state at forward entry: of the scope the region's last invocation had, or
        of the callable's own modules and their submodules before its first (the modules that
        run are known only when the forward returns)."""
        reach, last = self.reach, self.reach.kept.get("scope")
        if last is not None:  # (its very tuples: the layout the forward's exit reads is found by identity)
            self.state_entry = capture.module_state(last[0], store, reach.writes.values(), attributes_of=last[1],
                                                    reach=reach, memo=reach.kept.setdefault("layout", []))
        else:
            self.state_entry = capture.module_state(capture.with_submodules(reach, self.direct.values()), store,
                                                    reach.writes.values(), reach=reach)

    def read_names(self, function: Any) -> frozenset[str] | None:
        """The names the callable ``function`` and the settled scope's code can read (None: not
        known), found when a difference first asks (most invocations have none to ask about)
        and kept with the reach for the same scope and code."""
        if self.names is not None:
            return self.names
        roots = root_functions(function)
        if roots is None:
            return None
        pairs, reach = self.scope_pairs, self.reach
        codes = tuple(root.__code__ for root in roots)
        kept = reach.kept.get("names")
        if kept is not None and kept[0] is pairs and kept[1] == codes:
            self.names = kept[2]
            return self.names
        modules = list(map(_MODULE, pairs))
        classes = {type(module) for module in modules} | {type(value) for value in reach.objects.values()}
        classes |= {type(value) for module in modules for value in vars(module).values()
                    if not is_library(type(value).__module__)}
        owner = getattr(function, "__self__", None)
        if owner is not None:
            classes.add(type(owner))
        for module in modules:
            roots += root_functions(module) or ()
        self.names = names_read(roots, classes)
        reach.kept["names"] = (pairs, codes, self.names)
        return self.names

    def reads(self, function: Any, key: tuple[str, str], then: Any = None, now: Any = None) -> bool:
        """Whether the code of the region (``function`` and its scope) can read the state ``key``
        names, whose entry went from ``then`` to ``now``: its name, and for an object changed in
        place one of the fields that changed (a config every layer holds, whose ``problem_type``
        no layer reads)."""
        if key[0] not in ("attribute", "global"):
            return True
        names = self.read_names(function)
        if names is None:
            return True
        if parts_of(key[1]).name not in names:
            return False
        fields = capture._changed_fields(then, now) if then is not None and now is not None else None
        if not fields:
            return True
        # a transformers config reads some fields under other names (``hidden_size`` is ``n_embd``)
        aliases = getattr(type(now[1]), "attribute_map", None)
        if isinstance(aliases, dict):
            names = names | {field for alias, field in aliases.items() if alias in names}
        return any(name in names for name, *_ in fields)

    def state(self, store: Store) -> capture.ModuleState:
        """The compared state now: buffers and attributes of the scope, the globals written."""
        return capture.module_state(self.state_modules, store, self.reach.writes.values(),
                                    attributes_of=self.attribute_modules, buffers=self.touched_buffers,
                                    reach=self.reach, memo=self.layout_memo)

    def _pointers(self) -> None:
        """Read the data pointers of the compared modules' buffers and parameters: those of the
        modules that ran and their submodules, the callable's own modules and the buffers the
        forward wrote (:meth:`scope`).  A region of timm's ``checkpoint_seq`` reaches every
        block of the model and runs a few: their parameters only.  A saved tensor outside
        them is digested by its bytes, which is exact either way."""
        self.pointed = True
        if not self.state_modules and not self.attribute_modules and not self.touched_buffers:
            self.buffer_pointers = self.parameter_pointers = _NO_ENTRIES  # type: ignore[assignment]
            return  # a region of plain functions
        modules = list(map(_MODULE, self.state_modules))
        if self.attribute_modules:
            modules += map(_MODULE, self.attribute_modules)
        # most regions' modules hold no buffers (transformers): no pass over them then
        buffers = [buffer for module in modules for buffer in module._buffers.values() if buffer is not None] \
            if any(map(len, map(_BUFFERS, modules))) else []
        if self.touched_buffers:
            buffers += [buffer for _, module, name in self.touched_buffers
                        if (buffer := module._buffers.get(name)) is not None]
        # (a wrapper subclass, FSDP2's DTensor, has no data of its own: pointer 0 is no one's)
        self.buffer_pointers = dict.fromkeys(pointer for buffer in buffers
                                             if buffer.numel() and (pointer := buffer.data_ptr())) \
            if buffers else {}
        self.parameter_pointers = {pointer: param
                                   for module in modules for param in module._parameters.values()
                                   if param is not None and param.numel() and param.layout == torch.strided
                                   and (pointer := param.data_ptr())}

    def is_buffer(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor`` is a buffer of a compared module (by data pointer)."""
        if not self.pointed:
            self._pointers()
        # a region whose modules hold no buffers (most transformers) asks nothing of the tensor
        return bool(self.buffer_pointers) and bool(tensor.numel()) and tensor.data_ptr() in self.buffer_pointers

    def parameter_of(self, tensor: torch.Tensor, refresh: bool = False) -> torch.Tensor | None:
        """The compared module's parameter whose data ``tensor`` starts at: the parameter itself,
        or a view of it from its first element (``weight.t()`` saved); a view from elsewhere in
        it (a slice of a fused weight) is not one here, and is digested by its bytes.  Told by
        the data pointer, which no other storage has while the parameter lives (a storage's
        own object would be made for every saved tensor).

        ``refresh`` reads the parameters' pointers again (FSDP allocates them at each gather).
        A pointer read earlier whose parameter lies elsewhere now is stale, and they are read
        again too: FSDP2 frees each unsharded storage after the forward and gathers it again
        before the recompute, where the allocator may hand one parameter the address another
        had at forward, and the saved tensor would be taken for that other parameter's.
        """
        if tensor.layout is not _STRIDED:
            return None
        if refresh or not self.pointed:
            self._pointers()
        pointer = tensor.data_ptr()
        owner = self.parameter_pointers.get(pointer)
        if owner is not None and not refresh and owner.data_ptr() != pointer:
            self._pointers()
            owner = self.parameter_pointers.get(pointer)
        return owner


class SavedPrint:
    """The metadata torch's ``determinism_check`` keeps per saved tensor, plus our print.

    Equality is torch's own (``base``, e.g. shape/dtype/device), so torch's checks and
    messages are unchanged; the comparison also hands the forward's print and the recomputed
    tensor to the record, which prints it the way the forward's was printed.  A forward's
    ``print`` is None until its forward returns, and its ``tensor`` is held until then; a
    recompute's holds its tensor only.

    Where the forward read an activation's bytes by :func:`planned_digest` (most saved tensors
    on CPU), it keeps what that gave as ``found`` and no print, and a parameter's view
    its :func:`parameter_view` as ``viewed``: a recompute reads its tensor the same way and
    compares the two tuples, and a print is made only where they differ (:meth:`forward_print`).

    ``base`` is :data:`LAZY` for torch's default check: its metadata (shape, dtype, device)
    is read from the print, or the tensor, when torch compares, not made for every saved
    tensor as a dict of a ``torch.Size`` and a ``torch.device``.
    """

    __slots__ = ("base", "print", "record", "index", "tensor", "found", "viewed")

    def __init__(self, base: Any, tensor_print: TensorPrint | None, record: InvocationRecord | None, index: int,
                 tensor: torch.Tensor | None = None) -> None:
        self.base, self.print, self.record, self.index, self.tensor = base, tensor_print, record, index, tensor
        #: the forward's ``planned_digest`` of its tensor, where it gave one (then ``print`` is None)
        self.found: tuple[tuple[int, ...], torch.dtype, int, tuple[int, ...] | None] | None = None
        #: the forward's ``parameter_view`` of its tensor, where it is a parameter's (then ``print`` is None)
        self.viewed: ParameterView | None = None

    def __eq__(self, other: object) -> bool:
        if type(other) is Recomputed:  # torch's default check, at a recompute: the common case
            record = self.record
            if record is not None:
                try:
                    theirs = record.compare_saved(self, other[0])
                except Exception as exc:  # noqa: BLE001 - recheck's own: torch's check still answers
                    record.could_not("compare a saved tensor", exc)
                    theirs = None
                if theirs is True:
                    return True  # equal, to the byte
                if theirs is not None:  # printed: shape, dtype, device
                    mine = self.forward_print()
                    return mine is not None and mine.shape == theirs.shape and mine.dtype == theirs.dtype \
                        and mine.device == theirs.device
            if self.base is LAZY:
                return self.metadata() == other.metadata()
            # a forward whose recording was let go of (``abort_forward``): its metadata, as torch's check made it
            return bool(self.base == _metadata_dict(other.metadata()))
        if type(other) is not SavedPrint:
            # the check's own value where the print could not be made (``_SavedPrinter``)
            return NotImplemented if self.base is LAZY else bool(self.base == other)
        # a recompute's under another check (``base``: torch's default answers with a Recomputed):
        # its bytes compared by the record, its equality that check's own
        record, tensor = self.record, other.tensor
        if record is not None and other.record is None and tensor is not None:
            try:
                record.compare_saved(self, tensor)
            except Exception as exc:  # noqa: BLE001 - recheck's own: that check's equality still answers
                record.could_not("compare a saved tensor", exc)
        if self.base is LAZY and other.base is LAZY:
            return self.metadata() == other.metadata()
        return bool(self.base == other.base)

    # no __ne__: object's own inverts __eq__ in C (torch asks ``!=``, once per saved tensor)

    __hash__ = None  # type: ignore[assignment]

    def forward_print(self) -> TensorPrint | None:
        """The print of the tensor (None: not printed yet), made from ``found`` or ``viewed``
        where the forward kept only that."""
        if self.print is None:
            if self.found is not None:
                self.print = planned_print_of(self.found)
            elif self.viewed is not None:
                self.print = parameter_print_of(self.viewed)
        return self.print

    def metadata(self) -> tuple[tuple[int, ...], torch.dtype, str] | None:
        """Shape, dtype and device, as torch's default check compares them (None: not known)."""
        if self.found is not None:
            return self.found[0], self.found[1], "cpu"
        if self.viewed is not None:
            return self.viewed[0], self.viewed[1], self.viewed[2]
        if self.print is not None:
            return self.print.shape, self.print.dtype, self.print.device
        if self.tensor is not None:
            return tuple(self.tensor.shape), self.tensor.dtype, str(self.tensor.device)
        return None

    def __repr__(self) -> str:
        if self.base is not LAZY:
            return repr(self.base)
        metadata = self.metadata()
        if metadata is None:
            return "{}"
        return _metadata_text(metadata)


class Recomputed(tuple):
    """A recompute's answer to torch's default check, ``(tensor,)``: torch asks for one per saved
    tensor after the recompute ran, and compares it with the forward's :class:`SavedPrint`,
    which compares the tensor (a tuple is made in C: no ``__init__``, no slot to set)."""

    __slots__ = ()

    def metadata(self) -> tuple[tuple[int, ...], torch.dtype, str]:
        """Shape, dtype and device, as torch's default check compares them."""
        tensor = self[0]
        return tuple(tensor.shape), tensor.dtype, str(tensor.device)

    def __eq__(self, other: object) -> bool:  # as the forward's print compares it (either side of ``==``)
        if type(other) is SavedPrint:
            return other.__eq__(self)
        if type(other) is Recomputed:  # (a record that had no forward answered its forward's call too)
            return self.metadata() == other.metadata()
        return NotImplemented

    def __ne__(self, other: object) -> bool:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return _metadata_text(self.metadata())


def _metadata_text(metadata: tuple[tuple[int, ...], torch.dtype, str]) -> str:
    """The metadata as torch's default check writes it in its error message."""
    return repr(_metadata_dict(metadata))


def _metadata_dict(metadata: tuple[tuple[int, ...], torch.dtype, str]) -> dict[str, Any]:
    """The metadata as torch's default check makes it (``_default_meta_extractor``)."""
    shape, dtype, device = metadata
    return {"shape": torch.Size(shape), "dtype": dtype, "device": torch.device(device)}


#: the forward of every released record (see ``InvocationRecord.release``): nothing reads or
#: writes it after the release, and it holds nothing
_RELEASED = Forward(Reach(), {}, {})


#: the tags of a record made without any (shared: nothing writes a record's tags)
_NO_TAGS: dict[str, Any] = {}

#: the ``base`` of a :class:`SavedPrint` under torch's default determinism check
LAZY: Any = object()
_NEW_SAVED = object.__new__


def _tensor_leaves(value: Any, root: str, store: Store) -> list[tuple[str, TensorPrint]]:
    return [(path, print_tensor(tensor, store)) for path, tensor in tensors(value, root)]


class InvocationRecord:
    """A checkpoint invocation: its forward, its recomputations and their findings.

    A block keeps every record until it ends (a training loop watched for 10,000 steps keeps
    10,000 times its invocations): what every invocation sets lives in slots, which ``__init__``
    sets.  Where they lived in a dict, a record that gained a finding held a dict of its own
    order, a kilobyte or more for every invocation of a model whose every layer has a finding
    (timm's ResNet, whose BatchNorm layers each say one).
    What only some records set (a replay, a full replay's state at the last saved tensor)
    starts from the class attributes below: an assignment gives that record a dict of its own.
    """

    __slots__ = ("region", "index", "tags", "entry", "store", "tolerance", "forced_early_stop", "replay_fully",
                 "function", "reentrant", "needs_input_grad", "implementation", "_pass_saved", "_saved_diffs",
                 "grad_enabled", "preserve_rng_state", "replaced", "during_backward", "intended_grad", "nested",
                 "early_stop", "forward", "forward_done", "recomputes", "_saved_compared", "failed", "closed",
                 "findings", "__dict__")

    #: made again by another region's recompute: the record of the call it makes again, to
    #: whose forward its run was compared (a recompute of that record)
    replay_of: InvocationRecord | None = None
    #: under a full replay: what the forward's state and effects were at its last saved
    #: tensor (where early stop would end a recompute), and which keys changed after it
    forward_effects: list[Any] | None = None
    _at_last_save: tuple[capture.ModuleState, int | None] | None = None
    _late_keys: frozenset[tuple[str, str]] = _NONE
    #: globals the region reads that its own forward changed, as (subject, message, whether the
    #: recompute changed it again): a ``global`` finding where the recompute changes it again (a
    #: counter) or computes something else, none where it changes nothing (a cache its forward filled)
    _own_writes: tuple[tuple[str, str, bool], ...] = ()
    _early_effects: int | None = None
    #: notes of the observations of this call that failed (recheck's own failures, never the
    #: region's): each check that failed was skipped, and the call went on
    problems: tuple[str, ...] = ()
    #: what differed in the context of the last recompute from its forward's, ``(subject, at
    #: forward, at recompute, why)``: the causes a failure of the recompute is explained by
    #: (``watcher.failure``)
    context_changes: tuple[tuple[str, str, str, str], ...] = ()

    def __init__(
        self,
        region: RegionKey,
        index: int,
        tags: Mapping[str, Any],
        *,
        entry: str,
        function: Any,
        store: Store = "digest",
        early_stop: bool | None = None,
        tolerance: Tolerance | None = None,
        implementation: str = "torch",
        reentrant: bool | None = None,
        needs_input_grad: bool | None = None,
        grad_enabled: bool = True,
        preserve_rng_state: bool | None = None,
        replaced: bool = False,
        during_backward: bool = False,
        intended_grad: bool | None = None,
        nested: bool = False,
    ) -> None:
        self.region, self.index, self.tags = region, index, dict(tags) if tags else _NO_TAGS
        self.entry, self.store, self.tolerance = entry, store, tolerance
        #: the early stop the watch imposes on the call (None: the call's own)
        self.forced_early_stop = early_stop
        self.replay_fully = early_stop is False
        self.function = function
        self.reentrant = entry in ("reentrant", "apply") if reentrant is None else reentrant
        #: the output requires grad only when an input does (see ``CheckpointCall``)
        self.needs_input_grad = self.reentrant if needs_input_grad is None else needs_input_grad
        #: ``"torch"``, or the library of another implementation (``"deepspeed"`` ...)
        self.implementation = implementation
        #: indices of the saved tensors the current recompute compared (keys; a dict from the
        #: first recompute on)
        self._pass_saved: dict[int, None] = _NO_ENTRIES  # type: ignore[assignment]
        #: saved tensors whose recomputed print differs: index -> (forward's, recompute's); a
        #: dict from the first on (most records have none)
        self._saved_diffs: dict[int, tuple[TensorPrint, TensorPrint]] = _NO_ENTRIES  # type: ignore[assignment]
        #: the grad mode at the checkpoint call
        self.grad_enabled = grad_enabled
        #: the call's ``preserve_rng_state`` (None when the entry point does not say)
        self.preserve_rng_state = preserve_rng_state
        #: made inside a reentrant forward (under its no_grad): its recompute makes it again
        self.replaced = replaced
        #: made while autograd ran a backward (during another region's recompute)
        self.during_backward = during_backward
        #: the grad mode the region is meant to run in (a replaced call's: its outer call's)
        self.intended_grad = intended_grad
        #: made while another region's forward ran (its recompute makes this call again)
        self.nested = nested
        # what the call's forward and recomputes set later (see the class docstring)
        self.early_stop: bool | None = None
        self.forward: Forward | None = None
        self.forward_done = False
        self.recomputes = 0
        #: the most saved tensors one recompute compared
        self._saved_compared = 0
        self.failed = self.closed = False
        #: a tuple until the first finding, then a list: each as :meth:`_finding` drafts it,
        #: made a :class:`Finding` by :meth:`findings_of`
        self.findings: list[_Draft] | tuple[()] = ()

    def could_not(self, what: str, exc: BaseException) -> None:
        """Note that recheck's own observation ``what`` of this call failed with ``exc`` (the
        report's notes say so); the check is skipped, nothing is raised into the program."""
        note = could_not(f"{what} of {self.region}, call {self.index}", exc)
        if note not in self.problems:
            self.problems = (*self.problems, note)

    # -- forward -------------------------------------------------------------------------

    def begin_forward(self, reach: Reach, args: tuple | None = None, kwargs: dict | None = None) -> None:
        for name, why in reach.unreadable.items():  # (what it holds is neither found nor compared)
            note = f"could not look into `{name}`, which {self.region} reaches: {why}; what it holds is not compared"
            if note not in self.problems:
                self.problems = (*self.problems, note)
        entry, shown = capture.entry_state(reach)
        intended = self.grad_enabled if self.intended_grad is None else self.intended_grad
        # the versions of the parameters of the scope the region's last invocation had (the
        # same modules run again: a region of timm's checkpoint_seq reaches every block of the
        # model and runs one), or, before its first, of all it reaches
        last = reach.kept.get("scope")
        predicted = last[2] if last is not None else None
        self.forward = Forward(reach, entry, shown, capture.parameter_versions(reach, predicted),
                               context=current_context(intended))
        self.forward.predicted = predicted
        for module in capture.direct_modules(self.function, reach):
            self.forward.direct.setdefault(id(module), module)
        capture.buffer_versions(self.forward.direct.values(), self.forward.buffers_seen, self.forward.walked,
                                self.forward.subtrees)
        try:
            self.forward.read_entry(self.store)
        except Exception as exc:  # noqa: BLE001 - then a recompute is compared with the forward's exit only
            self.could_not("read the state at forward entry", exc)
        if args is not None:
            # an input changed in place by the forward: its version moves (a write through
            # ``.data`` does not; under early_stop=False the bytes are compared as well)
            self.forward.inputs = [(path, tensor, tensor._version,
                                    print_tensor(tensor, self.store) if self.replay_fully else None)
                                   for path, tensor in input_tensors(args, kwargs or {})]
            self.forward.inputs_need_grad = any(t.requires_grad for _, t, _, _ in self.forward.inputs)

    def add_module(self, module: torch.nn.Module) -> None:
        """A module ran inside the forward (told by ``intercept.module_calls`` before it ran).

        The scope compares the state of its whole subtree (see :meth:`Forward.scope`), so its
        submodules' calls add nothing: they are not told again (``forward.told``).  A forward
        that returned hears nothing more: its scope is settled (a record left on the dispatcher's
        stack past its forward, by a forward that ended out of order, is not told)."""
        forward = self.forward
        key = id(module)
        if forward is not None and key not in forward.ran and not self.forward_done:
            forward.ran[key] = module
            if key not in forward.reach.modules:
                forward.reach.add_found(module)
            if key not in forward.walked:  # else its subtree's buffers were seen with its parent's
                capture.buffer_versions((module,), forward.buffers_seen, forward.walked, forward.subtrees)
            if module._modules:  # its subtree as walked in this forward, or found now
                below = forward.subtrees.get(key)
                forward.told.update(dict.fromkeys(map(id, capture.subtree(module) if below is None else below[0])))
            else:  # a leaf (most modules): its subtree is itself
                forward.told[key] = None

    def end_forward(self, output: Any, has_output: bool) -> None:
        forward = self.forward
        if forward is None:
            return
        reads_globals = bool(forward.reach.reads)
        exit_state, _ = capture.entry_state(forward.reach, rng_only=not reads_globals, with_text=False)
        # a stream read only since a module found while running reached it has no entry to compare
        forward.rng_consumed = frozenset(k for k, v in exit_state.items()
                                         if k[0] == "rng" and k in forward.entry and forward.entry[k] != v) or _NONE
        if reads_globals:  # (what the recompute starts from, where the forward changed a global itself)
            forward.globals_exit = {k: v for k, v in exit_state.items() if k[0] == "global"}
        forward.scope()
        try:
            forward.wider = wider_context(forward.scope_pairs)
        except Exception as exc:  # noqa: BLE001 - only a failure's explanation needs it
            self.could_not("read the context of the forward", exc)
        if forward.predicted is not None and forward.scope_pairs is not forward.predicted:
            # other modules ran than at the last invocation: those the entry did not read are
            # read now (an in-place change made by this forward itself shows in its activations)
            forward.params_after = capture.parameter_versions(forward.reach, forward.scope_pairs)
        forward.predicted = None
        forward.state_exit = forward.state(self.store)
        try:
            self._read_written(forward)
        except Exception as exc:  # noqa: BLE001 - then a holder written again alike is reported
            self.could_not("read the tensors the forward wrote", exc)
        if has_output and not self._stops_early():
            forward.outputs = _tensor_leaves(output, "output", self.store)
        if self._at_last_save is not None:
            state, effects = self._at_last_save
            earlier = _entries(state)
            self._late_keys = frozenset(k for k, v in _entries(forward.state_exit).items()
                                        if k not in earlier or not same(earlier[k], v))
            self._early_effects = effects
            self._at_last_save = None
        self._check_grad_reaches()
        self._check_inputs()
        # which saved tensors are buffers is told now that the scope (the modules the forward
        # ran) is settled: at each save it would still be growing
        store, is_buffer = self.store, forward.is_buffer
        if forward.saved and not forward.pointed:
            forward._pointers()
        any_buffers = bool(forward.buffer_pointers)  # most regions' modules hold none: no call per tensor
        if any_buffers:
            buffers = forward.saved_buffers = {}
        pointers = forward.parameter_pointers  # what ``parameter_of`` reads, read here for each tensor
        in_place = store == "digest"
        for saved in forward.saved:
            tensor, saved.tensor = saved.tensor, None
            if tensor is None:
                continue
            if any_buffers and is_buffer(tensor):
                buffers[saved.index] = None
            owner = pointers.get(tensor.data_ptr()) if pointers and tensor.layout is _STRIDED else None
            if owner is not None and owner.data_ptr() != tensor.data_ptr():
                owner = forward.parameter_of(tensor)  # a stale pointer (FSDP2 gathered anew): read again
                pointers = forward.parameter_pointers
            if owner is not None and (view := parameter_view(tensor, owner)) is not None:
                saved.viewed = view  # a parameter's view, told by identity and version: no print either
            elif in_place and (found := planned_digest(tensor)) is not None:
                saved.found = found  # an activation read by its plan: no print unless a recompute differs
            else:  # an activation (no parameter's view): the print ``print_saved`` would make, one call sooner
                saved.print = print_activation(tensor, store)
        forward.settle()
        self.forward_done = True

    def _read_written(self, forward: Forward) -> None:
        """Keep the bytes of the tensors the forward wrote into attributes (rarely any: compared
        by identity when the state is unchanged)."""
        started, left = forward.state_entry, forward.state_exit
        if not started or _all_equal(started, left):
            return
        # of two states of one layout, only the entries that may differ (a BatchNorm's statistics)
        differing = started.differing(left) if isinstance(started, capture.ModuleState) else None
        before, after = differing if differing is not None else (_entries(started), _entries(left))
        written = {}
        for key, now in after.items():
            if key[0] == "attribute" and (key not in before or not same(before[key], now)):
                found = _tensor_bytes(now[1], self.store)
                if found is not None:
                    written[key] = found
        if written:
            forward.written_values = written

    def _stops_early(self) -> bool:
        """Whether no recompute of this call can return its output: torch's non-reentrant
        checkpoint with early stop ends every recompute at its last saved tensor (one that runs
        to the end saved fewer tensors than the forward, which :meth:`end_recompute` reports),
        so the forward's outputs are not printed.  A call made inside another region's forward
        is made again by that region's recompute, whose run returns: its outputs are printed."""
        return (self.early_stop is True and not self.replay_fully and not self.nested and not self.reentrant
                and self.implementation == "torch" and self.entry in ("checkpoint", "generator"))

    def _check_inputs(self) -> None:
        forward = self.forward
        assert forward is not None
        for path, tensor, version, before in forward.inputs:
            if tensor._version != version:
                how = f"version {version} -> {tensor._version}"
            elif before is not None and not before.same(print_tensor(tensor, self.store)):
                how = "bytes changed without a version bump (.data or a view)"
            else:
                continue
            self._add("input_mutation", f"{path} is modified in place by the region", subject=Subject("input", path=path),
                      detail=how)
        forward.inputs = ()

    def _check_grad_reaches(self) -> None:
        """A reentrant forward runs under no_grad and its output requires grad only when an
        input does: without one, the parameters it used never get a gradient (and nothing is
        ever recomputed)."""
        forward = self.forward
        assert forward is not None
        if not (self.needs_input_grad and self.grad_enabled) or forward.inputs_need_grad is not False:
            return
        used = capture.with_submodules(forward.reach, [*forward.direct.values(), *forward.ran.values()])
        lost = [f"{name}.{param_name}" if name else param_name for name, module in used
                for param_name, param in module._parameters.items() if param is not None and param.requires_grad]
        keeps = "use_reentrant=False, or an input with requires_grad=True, keeps the graph"
        if lost:  # the cause, then each gradient it loses
            self._add("input_grad", f"no tensor input of this reentrant checkpoint requires grad, so {len(lost)} "
                      f"parameter(s) the region uses get no gradient", subject=parameter_subject(lost),
                      detail=f"torch only warns \"None of the inputs have requires_grad=True\"; {keeps} "
                      "(transformers' enable_input_require_grads makes the embedding's output require grad)")
        for name in lost:
            subject = grad_subject(name)
            self._add("gradient", f"{subject} is never computed: the reentrant checkpoint ran the forward "
                      "under no_grad and no input requires grad, so the output does not require grad",
                      subject=subject, detail=keeps)

    def abort_forward(self) -> None:
        """The forward is not compared (it raised, or recording it failed): let go of its tensors.
        A saved tensor nothing printed keeps its metadata, which torch's own check still compares."""
        self.failed = True
        self.forward_done = True
        if self.forward is not None:
            for saved in self.forward.saved:
                tensor = saved.tensor
                if saved.base is LAZY and tensor is not None and saved.found is None and saved.viewed is None \
                        and saved.print is None:
                    saved.base = _metadata_dict((tuple(tensor.shape), tensor.dtype, str(tensor.device)))
                saved.tensor = None
            self.forward.subtrees.clear()

    def saved_print(self, tensor: torch.Tensor, base: Any = LAZY) -> SavedPrint | Recomputed:
        """``determinism_check`` hook: the forward's print of a saved tensor, or a recompute's.

        ``base`` is what another determinism check made of the tensor (``"none"``'s is None);
        without one, torch's default check is answered from the prints (see :class:`SavedPrint`).

        The forward's print is taken when its forward returns, not now: a kernel may fill a
        tensor after saving it (RReLU saves its noise buffer, then draws into it), so bytes
        read at pack time can be uninitialized memory.  The tensor is held until then, as
        the uncheckpointed forward would hold it: as the hook got it, not detached (its print
        reads it in place and records no autograd history; its graph, which holds the checkpoint's
        frame that holds this print, lives at least as long in the forward anyway, and the
        reference goes when the forward returns or raises).  torch asks for the recompute's metadata
        after the recompute ran, and compares it with the forward's at once: under torch's default
        check the answer is the tensor itself (:class:`Recomputed`), compared by the forward's print.
        """
        forward = self.forward
        # made without a call to ``__init__`` (torch asks for one per saved tensor, at the forward
        # and at each recompute): every slot is set here, as ``__init__`` sets them
        if self.forward_done or forward is None:  # a recompute's
            if base is LAZY:  # under torch's default check
                return Recomputed((tensor,))
            saved = _NEW_SAVED(SavedPrint)
            saved.base, saved.print, saved.record, saved.index, saved.tensor, saved.found, saved.viewed = \
                base, None, None, -1, tensor, None, None
            return saved
        saved = _NEW_SAVED(SavedPrint)
        saved.base, saved.print, saved.record, saved.index, saved.tensor, saved.found, saved.viewed = \
            base, None, self, len(forward.saved), tensor, None, None
        forward.saved.append(saved)  # type: ignore[union-attr]  # a list until the forward is done
        if self.replay_fully:  # what early stop would have left behind, were this the last save
            try:
                forward.scope()
                effects = None if self.forward_effects is None else len(self.forward_effects)
                self._at_last_save = (forward.state(self.store), effects)
            except Exception as exc:  # noqa: BLE001 - inside torch's pack hook: the forward goes on
                self.could_not("read the state at a saved tensor", exc)
        return saved

    # -- recompute -----------------------------------------------------------------------

    def begin_recompute(self, grad_enabled: bool | None = None) -> tuple[dict[tuple[str, str], Any],
                                                                         capture.ModuleState]:
        """Compare what the recompute starts from with the forward; return the entry snapshot.

        ``grad_enabled`` stands for the recompute's grad mode when it runs as the forward of a
        reentrant call (another region's recompute making this call again).
        """
        self.recomputes += 1
        self._count_compared()
        self._pass_saved = {}
        forward = self.forward
        assert forward is not None
        entry, _ = capture.entry_state(forward.reach, with_text=False)
        left = forward.globals_exit
        for key, value in entry.items():
            kind, subject = key
            if kind == "global" and forward.entry.get(key, value) != value and forward.reads(self.function, key):
                then, now = capture.global_change(forward.reach, key, forward.entry[key], forward.shown[key])
                message = f"{subject} was {then} at forward and {now} at recompute"
                if left is not None and left.get(key) == value:
                    # the forward left it so: the region's own write, a finding only if it matters (findings_of)
                    self._own_writes = (*self._own_writes, (subject, message, False))
                    continue
                self._add("global", message, subject=subject)
        # (name, version at forward, version now) of the parameters modified in place since
        # the parameters of the forward's scope (the modules that ran, their submodules, the
        # callable's own): a region of timm's checkpoint_seq reaches every block of the model
        versions_now = capture.parameter_versions(forward.reach, forward.scope_pairs)
        versions = forward.params.moved(versions_now) if forward.params else []
        if forward.params_after is not None:  # the scope was not the one predicted at the entry
            read = dict(forward.params.items()) if forward.params else {}
            versions += [moved for moved in forward.params_after.moved(versions_now)
                         if ("param_version", moved[0]) not in read]
        if versions:
            subject, message, detail = param_version_message(versions)
            self._add("param_version", message, subject=subject, detail=detail)
        changes: list[tuple[str, str, str, str]] = []
        if forward.context is not None:
            for subject, message, detail in context_differences(forward.context, current_context(grad_enabled)):
                self._add("context", message, subject=subject, detail=detail)
                changes.append((subject, message, "", detail))
        if forward.wider is not None:
            try:
                changes += wider_differences(forward.wider, wider_context(forward.scope_pairs))
            except Exception as exc:  # noqa: BLE001 - only a failure's explanation needs it
                self.could_not("read the context of the recompute", exc)
        if changes or self.context_changes:
            self.context_changes = tuple(changes)
        state_entry = forward.state(self.store)
        # a global changed outside the region is the `global` finding above, when the region reads it;
        # state the region cannot read, or that is back as its forward found it (a ``context_fn``
        # that puts it back for the recompute), is not what it computes from
        started = forward.state_entry
        # (state the recompute reads anew, RC101's; what it writes again below is RC104's)
        self._compare_state(forward.state_exit, state_entry, "changed between forward and recompute",
                            between=True, leave_out=_is_global,
                            matters=lambda key, then, now: forward.reads(self.function, key, then, now)
                            and not (key in started and now is not None and same(started[key], now, self.tolerance)))
        return entry, state_entry

    def end_recompute(self, entry: dict[tuple[str, str], Any], state_entry: capture.ModuleState,
                      output: Any, has_output: bool, effects: list[Any]) -> None:
        forward = self.forward
        assert forward is not None
        # a stream is reported when the recompute started from another state than the forward
        # and either run drew from it: where every stream started as at the forward (torch
        # restored them), what the recompute drew needs no second read
        differ = [key for key, value in forward.entry.items() if key[0] == "rng" and entry.get(key) != value]
        if differ:
            exit_state, _ = capture.entry_state(forward.reach, rng_only=True)
            consumed = {k for k in differ if k in exit_state and exit_state[k] != entry.get(k)}
            for key in sorted(consumed | (forward.rng_consumed & set(differ))):
                self._add("rng", f"{key[1]} state at recompute differs from the forward's; the region draws from it",
                          subject=key[1],
                          detail="checkpoint restores only torch's default generators, and only with "
                                 "preserve_rng_state=True")
        if self._own_writes:  # (rare: a global the forward changed itself, read again as the recompute left it)
            now_state, _ = capture.entry_state(forward.reach, with_text=False)
            forward_left = forward.globals_exit or {}
            self._own_writes = tuple(
                (subject, message, now_state.get(("global", subject)) != forward_left.get(("global", subject)))
                for subject, message, _ in self._own_writes)
        state_exit = forward.state(self.store)
        # under a full replay of a call that asked for early stop, what its forward changed only
        # after its last saved tensor is changed again only because of the replay: latent
        late = self._late_keys if self.replay_fully and self.early_stop is True else _NONE
        # a buffer the forward did not write is updated by the recompute alone: once, as without
        # checkpoint (fairscale runs BatchNorm's update in the recompute only)
        # and a recompute that leaves the state as its forward left it changed nothing the step keeps;
        # state no code of the region names was written by a framework's hook (ZeRO-3's counts)
        written, left, values = forward.written_buffers, forward.state_exit, forward.written_values
        self._compare_state(state_entry, state_exit, "updated again by the recompute", late,
                            leave_out=lambda key: key[0] == "buffer" and key[1] not in written,
                            matters=lambda key, then, now: not (
                                key in left and now is not None and same(left[key], now, self.tolerance)
                                or key in values and _alike(values[key], _tensor_bytes(now[1], self.store)))
                            and forward.reads(self.function, key, then, now))
        if has_output and forward.outputs is None and self._stops_early():
            self._add("recompute", f"the recompute saved fewer than the {len(forward.saved)} tensors its forward "
                      "saved for backward", subject=_SAVED,
                      detail="it ran to its end, where torch's early stop ends a recompute at its forward's "
                             "last saved tensor")
        if has_output and forward.outputs is not None:
            recomputed = dict(_tensor_leaves(output, "output", self.store))
            for path, original in forward.outputs:
                again = recomputed.get(path)
                if again is not None and not original.matches(again, self.tolerance):
                    self._add("recompute", f"recomputed {path} differs from the forward's",
                              subject=Subject("output", path=path), detail=original.difference(again, self.tolerance))
        if not effects:  # (the usual recompute: it emitted nothing)
            return
        effects = [e for e in effects if not _torch_own(e)]
        # under a full replay, the effects past those the forward emitted before its last saved
        # tensor come only from the replay: with early stop they would not happen
        early = len(effects) if self._early_effects is None else self._early_effects
        for latent, part in ((False, effects[:early]), (True, effects[early:])):
            for channel, message, detail in effect_messages(part):
                self._add("side_effect", message, subject=Subject("channel", channel), detail=detail, latent=latent)

    def recompute_raised(self, exc: BaseException) -> None:
        """The region raised while recomputing (its forward returned): the backward fails with it."""
        self._add("recompute", f"the region raised during recompute: {error_line(exc)}", subject=Subject("recompute"),
                  detail="its forward ran to the end; the recompute of the same call did not, so the "
                         "backward raises (a recompute that differs from its forward)")

    def compare_saved(self, saved: SavedPrint, tensor: torch.Tensor) -> TensorPrint | Literal[True] | None:
        """The recomputed saved tensor against the forward's print of it (``saved``): True where
        it is equal to it, to the byte, else the recomputed print (None where it is not compared
        here: a buffer, a tensor compared already in this recompute, one its forward never read)."""
        found = saved.found
        if found is None and saved.viewed is None and saved.print is None:
            return None  # not read: its forward never returned
        index = saved.index
        compared = self._pass_saved
        if index in compared:
            return None
        try:
            compared[index] = None
        except TypeError:  # the shared empty of a record whose recompute ran outside a bracket (closed before it)
            self._pass_saved = {index: None}
        forward = self.forward
        if forward is not None and index in forward.saved_buffers:
            return None  # a module buffer autograd saved: the buffer comparison reports it
        if found is not None:
            # the common case: an activation its forward read by its layout's plan (row-major, or a
            # transposed one's memory order), read so again: equal when shape, dtype, digest and
            # order are (digests hold no copies, so a tolerance has nothing to compare but the bytes)
            now = planned_digest(tensor)
            if now == found:
                return True
            original = saved.forward_print()
            assert original is not None
            recomputed = planned_print_of(now) if now is not None and now[3] == found[3] \
                else print_tensor(tensor, self.store, found[3], saved=True)  # in the order the forward's was
        elif saved.viewed is not None and forward is not None:
            # a parameter's view at forward: the same view of the same parameter, at the same
            # version, now?  (FSDP gathers it anew: look again)
            owner = forward.parameter_of(tensor)
            if owner is None:
                owner = forward.parameter_of(tensor, refresh=True)
            view = parameter_view(tensor, owner)
            if view == saved.viewed:
                return True
            original = saved.forward_print()
            assert original is not None
            recomputed = parameter_print_of(view) if view is not None else print_activation(tensor, self.store)
        else:
            original = saved.forward_print()
            assert original is not None
            # hashed in the order the forward's print was (its memory order: no copy when the
            # recompute lays it out as the forward did)
            recomputed = print_tensor(tensor, self.store, original.order, saved=True)
        tolerance = self.tolerance
        if tolerance is None:
            if original.same(recomputed):
                return True  # the same metadata and bytes (or parameter and version)
        elif original.matches(recomputed, tolerance):
            return recomputed
        if self._saved_diffs is _NO_ENTRIES:
            self._saved_diffs = {}
        self._saved_diffs.setdefault(index, (original, recomputed))
        return recomputed

    def _count_compared(self) -> None:
        """Fold the pass just ended into the most saved tensors one recompute compared."""
        if len(self._pass_saved) > self._saved_compared:
            self._saved_compared = len(self._pass_saved)

    def release(self) -> None:
        """Drop what only a later recompute would need (called when torch frees the graph).

        A block keeps every record until it ends (a training loop watched for 10,000 steps
        keeps 10,000 times its invocations): what stays is the findings and the counts.  The
        forward, with all it read (the CPU generator's state alone is 5 KiB, the prints, the
        modules of its scope), goes; the record keeps one shared empty forward in its place, so
        that it still tells a call whose forward ran from one that never ran."""
        self.function = None
        self._count_compared()
        self._pass_saved = _NO_ENTRIES  # type: ignore[assignment]  # (no recompute after it)
        if self.forward is not None:
            self.forward = _RELEASED

    # -- findings ------------------------------------------------------------------------

    def _compare_state(self, before: Mapping[tuple[str, str], Any], after: Mapping[tuple[str, str], Any], how: str,
                       latent_keys: frozenset[tuple[str, str]] = frozenset(),
                       leave_out: Callable[[tuple[str, str]], bool] | None = None,
                       matters: Callable[[tuple[str, str], Any, Any], bool] | None = None,
                       between: bool = False) -> None:
        """A finding for each :func:`state_changes` gives; those of ``latent_keys`` are latent
        (``between``: the program changed the state between the forward and its recompute)."""
        for key, kind, message, detail in state_changes(before, after, how, self.tolerance, self.store, leave_out,
                                                        matters):
            self._add(kind, message, subject=key[1], detail=detail, latent=key in latent_keys, between=between)

    def _finding(self, kind: str, message: str, subject: str, detail: str = "", latent: bool = False,
                 between: bool = False) -> _Draft:
        latent = latent and self.replay_fully and self.early_stop is True
        context: dict[str, Any] = {"implementation": self.implementation, "between": between}
        if self.preserve_rng_state is not None:
            context["preserve_rng_state"] = self.preserve_rng_state
        code = explain(kind, subject, **context)
        return _Draft(kind, sys.intern(message), code, subject, detail, sys.intern(hint(code)) if code else None,
                      latent)

    def _add(self, kind: str, message: str, *, subject: str, detail: str = "", latent: bool = False,
             between: bool = False) -> None:
        for said in self.findings:  # a loop, not any() over a generator: a record of BatchNorm layers says many
            if said.message == message and said.subject == subject:
                return
        if not self.findings:
            self.findings = []
        self.findings.append(self._finding(kind, message, subject, detail, latent, between))

    def _saved_finding(self) -> list[_Draft]:
        """One ``recompute`` finding for the saved tensors whose recomputed print differs."""
        if not self._saved_diffs:
            return []
        index, (original, recomputed) = min(self._saved_diffs.items())
        others = sorted(self._saved_diffs)[1:]
        detail = f"saved tensor #{index}: " + original.difference(recomputed, self.tolerance)
        if others:
            more = f" and {len(others) - 8} more" if len(others) > 8 else ""
            detail += "\nalso differ: saved tensor " + ", ".join(f"#{i}" for i in others[:8]) + more
        total = max(self._saved_compared, len(self._pass_saved), len(self._saved_diffs))
        message = f"{len(self._saved_diffs)} of {total} tensors saved for backward differ when recomputed"
        return [self._finding("recompute", message, _SAVED, detail)]

    def findings_of(self, calls_of_region: int) -> list[Finding]:
        """The findings, ``call i of n`` of the region, symptoms pointed at their likely cause
        (each made once, here: a block of BatchNorm layers has many)."""
        drafts = (*self.findings, *self._saved_finding())
        if self._own_writes:  # a global its forward changed: where the recompute changes it again or differs
            differs = any(draft.kind == "recompute" for draft in drafts)
            drafts += tuple(self._finding("global", message, subject)
                            for subject, message, again in dict.fromkeys(self._own_writes) if again or differs)
        if not drafts:  # (the region is worded only for a finding)
            return []
        region, callsite, tags = str(self.region), self.region.callsite, self.tags
        return with_likely_causes([
            Finding(kind, message, code=code, region=region, subject=subject, detail=detail, hint=hinted,
                    latent=latent, invocation=Invocation(self.index, calls_of_region, dict(tags), callsite))
            for kind, message, code, subject, detail, hinted, latent in drafts])


class _Draft(NamedTuple):
    """A finding as a record says it, before the count of the region's calls is known."""

    kind: str
    message: str
    code: str | None
    subject: str
    detail: str
    hint: str | None
    latent: bool


def state_changes(before: Mapping[tuple[str, str], Any], after: Mapping[tuple[str, str], Any], how: str,
                  tolerance: Tolerance | None = None, store: Store = "digest",
                  leave_out: Callable[[tuple[str, str]], bool] | None = None,
                  matters: Callable[[tuple[str, str], Any, Any], bool] | None = None,
                  ) -> Iterator[tuple[tuple[str, str], str, str, str]]:
    """How a compared state differs between two moments (a forward's exit and its recompute's
    entry, or a recompute's entry and exit), ``how`` saying which: ``(key, kind, message,
    detail)`` for each buffer changed (``buffer``), each attribute or written global changed,
    appeared or gone (``state``), the key's subject being the finding's.  Keys ``leave_out``
    accepts are skipped, and changes ``matters(key, then, now)`` rejects (entries: None where absent).  The one state comparison of an invocation record and of the
    recompute probe (:mod:`recheck.watcher.probe`); entries are equal by :func:`same`."""
    if before is after:  # (the shared state of no modules: a region of plain functions)
        return
    if tolerance is None and store == "digest" and _all_equal(before, after):
        return
    # compared entry by entry, as plain dicts: of two states of one layout, only the entries
    # that may differ (a BatchNorm's statistics, not every flag of every module)
    differing = before.differing(after) if isinstance(before, capture.ModuleState) else None
    before, after = differing if differing is not None else (_entries(before), _entries(after))
    changed = [(key, before.get(key), now) for key, now in after.items()]
    changed += [(key, before[key], None) for key in before.keys() - after.keys()]
    for key, then, now in changed:
        if then is not None and now is not None and same(then, now, tolerance) \
                or leave_out is not None and leave_out(key) or matters is not None and not matters(key, then, now):
            continue
        what, subject = key
        if what != "buffer":
            shown_then, shown_now = capture.shown_change(then, now)
            yield key, "state", f"{subject} {how}: {shown_then} -> {shown_now}", ""
        elif then is not None and now is not None:
            buffer = parts_of(subject)
            name = f"{buffer.owner}.{buffer.name}" if buffer.owner else buffer.name
            message = f"BatchNorm statistics `{name}` {how}" if explain("buffer", buffer) == "RC106" \
                else f"{subject} {how}"
            yield key, "buffer", message, then.difference(now, tolerance)


def _all_equal(before: Mapping[tuple[str, str], Any], after: Mapping[tuple[str, str], Any]) -> bool:
    """Whether two states are equal entry for entry, without a finding to look for (the common
    case): C-level passes over two states of one layout (:meth:`capture.ModuleState.same`).

    Equal entries are equal by their prints, so no finding can come from them: an attribute's
    entry is (print, value), a buffer's a print without a copy (compared by all its fields).
    A value whose ``==`` raises (an array kept in a list) answers False: the entries are then
    compared one by one, by their prints.
    """
    if isinstance(before, capture.ModuleState):
        return before.same(after)
    try:
        return bool(before == after)
    except Exception:  # noqa: BLE001 - a user's __eq__ or __bool__
        return False


def _entries(state: capture.ModuleState | Mapping[tuple[str, str], Any]) -> Mapping[tuple[str, str], Any]:
    """A state's entries as a dict (a released forward's state is an empty dict already)."""
    return state.entries() if isinstance(state, capture.ModuleState) else state


def _tensor_bytes(value: Any, store: Store) -> Any:
    """A tensor, or a plain holder's fields with its tensors, by their bytes (None: no tensor):
    what a K/V carrier holds is equal when the same bytes are written into it again."""
    if isinstance(value, torch.Tensor):
        return print_tensor(value, store)
    fields = getattr(value, "__dict__", None)
    if type(fields) is not dict or isinstance(value, torch.nn.Module) \
            or not any(isinstance(field, torch.Tensor) for field in fields.values()):
        return None
    return {name: print_tensor(field, store) if isinstance(field, torch.Tensor) else shallow(field)
            for name, field in fields.items()}


def _alike(then: Any, now: Any) -> bool:
    """Whether two of :func:`_tensor_bytes`' answers are equal, tensors by their bytes."""
    if isinstance(then, TensorPrint):
        return isinstance(now, TensorPrint) and then.same(now)
    return type(then) is dict and type(now) is dict and then.keys() == now.keys() \
        and all(_alike(a, now[name]) if isinstance(a, TensorPrint) else a == now[name] for name, a in then.items())


def _is_global(key: tuple[str, str]) -> bool:
    return key[0] == "global"


#: warnings torch itself emits when a checkpoint call is made again during a recompute
_TORCH_WARNINGS = ("torch.utils.checkpoint", "None of the inputs have requires_grad=True")


def _torch_own(effect: Any) -> bool:
    return effect.channel == "warning" and any(text in effect.text for text in _TORCH_WARNINGS)
