"""Exact capture and restore of the state a region can touch, and comparable views of it.

A :class:`Snapshot` holds *records*; each record remembers one piece of state as it
was at capture time and can put it back exactly (:meth:`Snapshot.restore`), and
each can report its current value as an :class:`Observed` for comparison between
runs (:meth:`Snapshot.observe`).  Records exist for

* RNG streams (:class:`RngRecord`): torch's default CPU generator, every
  initialized CUDA device (and XPU when present), explicit ``torch.Generator``
  objects, Python ``random`` and numpy's global state;
* tensors (:class:`TensorRecord`): parameters, buffers and inputs, by bytes, with
  their version counters (put back with ``_unsafe_set_version_counter``);
* parameter gradients (:class:`GradRecord`): the original ``.grad`` object is
  detached from the parameter during the check and reattached afterwards;
* Python values in a namespace (:class:`ValueRecord`): module attributes (the
  module's ``__dict__``) and module-level globals, rebinding the original object
  and restoring the content of containers (nested up to three levels);
* torch's default dtype (:class:`DefaultDtypeRecord`), which code may set and not reset;
* what the values above hold (:meth:`Snapshot.hold`): the attributes of plain objects a module,
  a plain object, a global or an argument holds (:class:`HeldValueRecord`, to
  :data:`~recheck.runtime.fingerprints._MAX_DEPTH` levels and ``_MAX_ITEMS`` items a container,
  as fingerprints look), their ``__slots__`` (:class:`SlotRecord`), the plain data in the
  namespaces of the classes whose code the region runs (the classes of its modules and of those
  objects: :class:`ClassValueRecord`, :class:`ClassKeysRecord`), and the RNG instances found
  there (``random.Random``, numpy's ``RandomState``, ``Generator`` and bit generators:
  :class:`InstanceRngRecord`).

Whatever a snapshot records it puts back.  What it finds and cannot put back (an iterator's
position, an object of a compiled extension without readable attributes, a record whose restore
raised) it names in :meth:`Snapshot.notes`, which the report carries: a check never claims to
leave no trace where it cannot.

:func:`fingerprint` turns any value into a comparable structure: numbers by bits,
tensors by :func:`~recheck.runtime.bits.digest`, containers by content and length.
"""

from __future__ import annotations

import collections
import contextlib
import enum
import functools
import heapq
import itertools
import operator
import threading
import types
from typing import TYPE_CHECKING, Any, Iterator, Mapping

import torch

from recheck.findings import Subject, error_line
from recheck.runtime.bits import bits_equal
from recheck.runtime.digests import tensor_digest
from recheck.runtime.fingerprints import (MISSING, Observed, _MAX_DEPTH, _MAX_ITEMS, MODULE_INTERNALS, fingerprint,
                                          instance_dict, is_module_state, items_of, show, show_printed)
from recheck.runtime.naming import DEFAULT_DTYPE_SUBJECT, attribute_subject, buffer_subject, parameter_subject
from recheck.runtime.reach import code_globals, is_library
from recheck.runtime.rng import (RngRecord, instance_kind, instance_state, rng_fingerprint, rng_states, rng_summary,
                                 set_instance_state)

if TYPE_CHECKING:  # pragma: no cover
    from recheck.runtime.reach import Reach

__all__ = ["ClassKeysRecord", "ClassValueRecord", "DefaultDtypeRecord", "DigestedTensor", "GradRecord",
           "HeldKeysRecord", "HeldValueRecord", "InstanceRngRecord", "ModuleRecord", "NewKeysRecord", "Observed",
           "RngRecord", "SlotRecord", "Snapshot", "TensorRecord", "ValueRecord", "fingerprint", "is_immutable",
           "rng_fingerprint", "rng_states", "rng_summary", "same_items", "same_mapping", "shared_or_copied",
           "show"]

# -- tensors ------------------------------------------------------------------------------------


def _set_version(t: torch.Tensor, version: int) -> None:
    setter = getattr(torch._C._autograd, "_unsafe_set_version_counter", None)
    if setter is None or t._version == version:
        return
    try:
        setter((t,), (version,))
    except TypeError:  # torch < 2.5 took a single tensor and int
        setter(t, version)


class TensorRecord:
    """A tensor's bytes, shape and version counter, restored in place."""

    def __init__(self, kind: str, subject: str, tensor: torch.Tensor,
                 copy: torch.Tensor | None = None) -> None:
        self.kind = kind
        self.subject = subject
        self.tensor = tensor
        self.version = tensor._version
        self.copy = tensor.detach().clone() if copy is None else copy
        #: the copy's digest, where its bytes are read in place: each observe reads the tensor only
        self.digest = DigestedTensor.of(self.copy) if DigestedTensor.fits(self.copy) else None
        self._verified = False  # whether the last observe found the tensor as captured
        self._seen: Observed | None = None  # observe's answer for that case, made once

    def same_bytes(self) -> bool:
        """True when the tensor's shape, dtype and bytes are those captured.

        Exact even for writes through ``.data``, which bypass the version counter.
        """
        return self.digest.matches(self.tensor) if self.digest is not None else bits_equal(self.tensor, self.copy)

    def unchanged(self) -> bool:
        """True when the tensor's version and bytes are those captured."""
        return self.tensor._version == self.version and self.same_bytes()

    def restore(self) -> None:
        """Put the bytes and version back."""
        t = self.tensor
        if self.unchanged():
            return
        with torch.no_grad():
            # (a copy may be kept in host memory: an optimizer's state, see ``runtime.steps``)
            if t.dtype != self.copy.dtype:
                t.data = self.copy.to(t.device, copy=True)  # a dtype changed in place (check_step's float64 rerun)
            elif t.shape != self.copy.shape:
                t.set_(self.copy.to(t.device, copy=True))  # type: ignore[call-overload]  # (stubs lack the Tensor overload)
            else:
                t.copy_(self.copy)
        _set_version(t, self.version)

    def observe(self, reference: Observed | None = None, lean: bool = False) -> tuple[Observed]:
        """The tensor's value: the captured copy itself when the bytes are unchanged.

        A tensor whose version moved is copied without comparing its bytes first (an optimizer step moves
        every parameter's): the copy holds the same bytes either way.  ``reference`` (the
        same tensor as another run left it) is returned itself when the bytes are its bytes;
        ``lean`` keeps a changed tensor as its digest (see :func:`shared_or_copied`).
        """
        if self.tensor._version == self.version and self.same_bytes():
            self._verified = True
            if self._seen is None:
                self._seen = Observed(self.kind, self.subject, self.copy)
            return (self._seen,)
        self._verified = False
        return (shared_or_copied(self.kind, self.subject, self.tensor, reference, lean),)


def shared_or_copied(kind: str, subject: str, tensor: torch.Tensor, reference: Observed | None,
                     lean: bool = False) -> Observed:
    """``reference`` when it holds ``tensor``'s bytes (or their :class:`DigestedTensor`), else
    ``tensor`` as an Observed: its digest where ``lean`` and it has plain CPU bytes, else a copy.

    A run compared with an earlier one (``check_step``'s twin) keeps what it left alike
    without a copy: a copy of every parameter a step moved is fresh memory the size of the
    model, whose page faults cost more than the comparison.
    """
    if reference is not None:
        value = reference.value
        if type(value) is DigestedTensor:
            if value.matches(tensor):
                return reference
        elif isinstance(value, torch.Tensor) and bits_equal(value, tensor):
            return reference
    if lean and DigestedTensor.fits(tensor):
        return Observed(kind, subject, DigestedTensor.of(tensor))
    return Observed(kind, subject, tensor.detach().clone())


class DigestedTensor:
    """A tensor a lean run kept as its metadata and the digest of its bytes, not a copy.

    ``check_step``'s step as written keeps what it changed so (its parameters, gradients and
    optimizer state: fresh memory three times the model's, at every check); its twin's values
    are compared with it by digest, and where one differs the step is run again keeping copies,
    for the finding's first difference and size.  Only plain CPU tensors, whose bytes the
    digest reads in place (:func:`~recheck.runtime.digests.tensor_digest`), are kept so.
    """

    __slots__ = ("shape", "dtype", "digest")

    def __init__(self, shape: tuple[int, ...], dtype: torch.dtype, digest: int) -> None:
        self.shape, self.dtype, self.digest = shape, dtype, digest

    @staticmethod
    def fits(tensor: torch.Tensor) -> bool:
        """A plain strided CPU tensor (no subclass: its bytes may not be there to read)."""
        return type(tensor) in _PLAIN_TENSORS and tensor.is_cpu and tensor.layout is torch.strided

    @classmethod
    def of(cls, tensor: torch.Tensor) -> DigestedTensor:
        return cls(tuple(tensor.shape), tensor.dtype, tensor_digest(tensor))

    def matches(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor`` has this shape, dtype and bytes."""
        return (self.fits(tensor) and tuple(tensor.shape) == self.shape and tensor.dtype == self.dtype
                and tensor_digest(tensor) == self.digest)

    def __repr__(self) -> str:
        return f"DigestedTensor({list(self.shape)}, {self.dtype}, digest={self.digest:032x})"


_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)


class GradRecord:
    """The ``.grad`` of a parameter: detached while the check runs, reattached after."""

    def __init__(self, name: str, parameter: torch.Tensor) -> None:
        self.name = name
        self.parameter = parameter
        self.grad = parameter.grad
        self.version = None if self.grad is None else self.grad._version

    def fresh(self) -> None:
        """A copy of the gradient as captured (a step accumulates into it; the original stays)."""
        self.parameter.grad = None if self.grad is None else self.grad.detach().clone()

    def restore(self) -> None:
        self.parameter.grad = self.grad


# -- Python values ------------------------------------------------------------------------------


class _Content:
    """Shallow content of a container (and of containers nested in it); a tensor in ``tracked``
    (ids of tensors the snapshot records by themselves) is not copied again."""

    def __init__(self, obj: Any, depth: int, tracked: frozenset[int] = frozenset()) -> None:
        # read and put back through the built-in types' own methods: a subclass's overridden
        # ``__iter__``, ``items`` or ``__getitem__`` (one that instantiates, or raises) is the
        # program's code, not what the container holds
        self.obj = obj
        cls = type(obj)
        if issubclass(cls, list):
            self.items: Any = list(list.__iter__(obj))
        elif issubclass(cls, dict):
            self.items = dict(dict.items(obj))
        elif issubclass(cls, set):
            self.items = set(set.__iter__(obj))
        elif issubclass(cls, bytearray):
            self.items = bytes(obj)
        elif issubclass(cls, torch.Tensor):
            self.items = (obj._version, obj.detach().clone())
        elif issubclass(cls, collections.deque):
            self.items = list(obj)
        elif _is_ndarray(obj):
            self.items = obj.copy()
        else:
            self.items = None
        values = (dict.values(obj) if issubclass(cls, dict) else tuple.__iter__(obj) if issubclass(cls, tuple)
                  else self.items if issubclass(cls, (list, set, collections.deque)) else ())
        self.children = [_Content(v, depth - 1, tracked) for v in list(itertools.islice(values, _MAX_ITEMS))
                         if depth > 0 and _is_container(v) and id(v) not in tracked]

    def restore(self) -> None:
        for child in self.children:
            child.restore()
        obj, items, cls = self.obj, self.items, type(self.obj)
        if issubclass(cls, list) and not same_items(list(list.__iter__(obj)), items):
            list.__setitem__(obj, slice(None), items)
        elif issubclass(cls, dict):
            if not same_mapping(obj, items):
                dict.clear(obj)
                dict.update(obj, items)
        elif issubclass(cls, set) and not (set.__len__(obj) == len(items)
                                           and all(any(x is y for y in items) for x in set.__iter__(obj))):
            set.clear(obj)
            set.update(obj, items)
        elif issubclass(cls, bytearray):
            obj[:] = items
        elif issubclass(cls, torch.Tensor):
            version, copy = items
            if obj._version != version:
                with torch.no_grad():
                    obj.copy_(copy)
                _set_version(obj, version)
        elif issubclass(cls, collections.deque) and not same_items(list(obj), items):
            obj.clear()
            obj.extend(items)
        elif items is not None and _is_ndarray(obj) and not (
                obj.shape == items.shape and obj.dtype == items.dtype and obj.tobytes() == items.tobytes()):
            obj[...] = items


def same_mapping(now: dict, then: dict) -> bool:
    """The same keys, in the same order, bound to the same objects (one C-level pass)."""
    if not then:  # most: a leaf module's ``_modules``, a module without buffers
        return not dict.__len__(now)
    return (dict.__len__(now) == len(then) and list(dict.keys(now)) == list(then)
            and all(map(operator.is_, dict.values(now), then.values())))


def same_items(now: list, then: list) -> bool:
    """The same objects in the same order (by identity: ``==`` on tensors is elementwise)."""
    return len(now) == len(then) and all(a is b for a, b in zip(now, then))


#: exact types whose objects never change: the same object has the same fingerprint
_IMMUTABLE = frozenset({bool, int, float, complex, str, bytes, type(None), torch.dtype, torch.device})


def is_immutable(value: Any) -> bool:
    """An object of an :data:`_IMMUTABLE` type, or a tuple of them (``(3, 3)``, ``("q", "v")``)."""
    kind = type(value)
    return kind in _IMMUTABLE or kind is tuple and len(value) <= 16 and all(type(v) in _IMMUTABLE for v in value)


def _is_container(value: Any) -> bool:
    return issubclass(type(value), _CONTAINERS) or _is_ndarray(value)


_CONTAINERS = (list, dict, set, bytearray, tuple, torch.Tensor, collections.deque)


def _is_iterator(value: Any) -> bool:
    """An iterator (``next()`` advances it): a generator, ``iter(data)``, a data loader's."""
    return hasattr(type(value), "__next__")


def _is_ndarray(value: Any) -> bool:
    """A numpy array (numpy is not imported for the question: an array cannot exist without it)."""
    return type(value).__name__ == "ndarray" and type(value).__module__ == "numpy"


#: per thread, while :meth:`Snapshot.track` or :meth:`Snapshot.observe` runs: the fingerprints
#: taken in that pass, by id (nothing changes during a pass; a record made later, by
#: ``recapture``, prints its value afresh)
_PASS = threading.local()


@contextlib.contextmanager
def _one_pass() -> Iterator[None]:
    """One object held by many modules (a transformers config on every layer) is printed once
    in the block."""
    outer = getattr(_PASS, "printed", None)
    _PASS.printed = {}
    try:
        yield
    finally:
        _PASS.printed = outer


def _printed(value: Any) -> Any:
    """``fingerprint(value)``, taken once per object in a :func:`_one_pass` block."""
    printed = getattr(_PASS, "printed", None)
    if printed is None:
        return fingerprint(value)
    found = printed.get(id(value), MISSING)
    if found is MISSING:
        found = printed[id(value)] = fingerprint(value)
    return found


class _Cell:
    """A closure cell as a namespace of one name, read, rebound and emptied as a dict's key is,
    so that a :class:`ValueRecord` puts back a closure's variable as it does a global."""

    __slots__ = ("cell",)

    def __init__(self, cell: Any) -> None:
        self.cell = cell

    def get(self, key: str, default: Any = None) -> Any:
        try:
            return self.cell.cell_contents
        except ValueError:  # an empty cell: a name the enclosing function has not assigned yet
            return default

    def __contains__(self, key: str) -> bool:
        return self.get(key, MISSING) is not MISSING

    def __setitem__(self, key: str, value: Any) -> None:
        self.cell.cell_contents = value

    def pop(self, key: str, default: Any = None) -> Any:
        value = self.get(key, default)
        if key in self:
            del self.cell.cell_contents
        return value


class ValueRecord:
    """One key of a namespace: a module's ``__dict__``, a module's globals, a closure's cell."""

    def __init__(self, kind: str, subject: str,
                 namespace: dict[str, Any] | types.MappingProxyType[str, Any] | _Cell, key: str,
                 tracked: frozenset[int] = frozenset()) -> None:
        self.kind = kind
        self.subject = subject
        #: written by :meth:`restore` only where it is a dict (a class's read-only view is put back
        #: through ``type.__setattr__`` by :class:`ClassValueRecord`'s own restore)
        self.namespace: Any = namespace
        self.key = key
        self.present = key in namespace
        self.value = namespace.get(key)
        #: the captured value is immutable (a module's flags and sizes: ``training``,
        #: ``in_features``, a convolution's ``kernel_size``): while the key holds that very
        #: object, its print is the captured one, and there is no content to put back
        self._immutable = self.present and is_immutable(self.value)
        self.content = _Content(self.value, _MAX_DEPTH, tracked) \
            if not self._immutable and _is_container(self.value) else None
        self.print = _printed(self.value) if self.present else MISSING
        self._seen: Observed | None = None  # observe's answer for that case, made once

    def unchanged(self) -> bool:
        """True when the key holds a value with the captured fingerprint (or is still absent)."""
        value = self.namespace.get(self.key, MISSING)
        if value is MISSING or not self.present:
            return value is MISSING and not self.present
        if self._immutable and value is self.value:
            return True
        return fingerprint(value) == self.print

    def restore(self) -> None:
        if not self.present:
            self.namespace.pop(self.key, None)
            return
        if self.namespace.get(self.key, MISSING) is not self.value:
            self.namespace[self.key] = self.value
        if self.content is not None:
            self.content.restore()

    def observe(self) -> tuple[Observed]:
        value = self.namespace.get(self.key, MISSING)
        if value is MISSING:
            return (Observed(self.kind, self.subject, "<absent>", "<absent>"),)
        if self._immutable and value is self.value:
            if self._seen is None:
                self._seen = _AsCaptured(self.kind, self.subject, self.print, value)
            return (self._seen,)
        seen = _printed(value)
        return (Observed(self.kind, self.subject, seen, show_printed(value, seen)),)


class _AsCaptured(Observed):
    """An immutable value observed as it was captured: its text (:func:`show_printed`) is made
    only where a comparison shows it, not at every check for every attribute of every module."""

    def __init__(self, kind: str, subject: str, printed: Any, value: Any) -> None:
        self.kind, self.subject, self.value, self._shown_value = kind, subject, printed, value

    @property
    def shown(self) -> str:  # type: ignore[override]
        return show_printed(self._shown_value, self.value)


class NewKeysRecord:
    """Keys that appear in a module's ``__dict__`` after capture (attributes a module creates).

    Restore removes them; observe reports them as ``state`` named like every other attribute
    (``attribute `self.load```), so a lazily created counter is compared too.  Only keys that
    :func:`~recheck.runtime.fingerprints.is_module_state` accepts count.
    """

    def __init__(self, namespace: dict, module: str = "") -> None:
        self.namespace = namespace
        self.keys = set(namespace)
        self.module = module

    def _new(self) -> list[str]:
        if self.namespace.keys() <= self.keys:  # no key appeared (the common case, in C)
            return []
        return [k for k in self.namespace if k not in self.keys and is_module_state(k)]

    def unchanged(self) -> bool:
        """True when no key appeared."""
        return not self._new()

    def restore(self) -> None:
        for key in self._new():
            del self.namespace[key]

    def observe(self) -> list[Observed]:
        return [Observed("state", attribute_subject(self.module, key), seen, show_printed(value, seen))
                for key in self._new() for value in (self.namespace[key],) for seen in (_printed(value),)]


class ModuleRecord(NewKeysRecord):
    """A module's attributes created after capture (:class:`NewKeysRecord`), and which objects its
    ``_parameters``, ``_buffers`` and ``_modules`` map their names to (put back, not compared)."""

    def __init__(self, module: torch.nn.Module, prefix: str) -> None:
        super().__init__(module.__dict__, prefix)
        names: tuple[dict[str, Any], ...] = (module._parameters, module._buffers, module._modules)
        self.bindings = tuple((mapping, dict(mapping)) for mapping in names)

    def unchanged(self) -> bool:
        return super().unchanged() and self.bound()

    def bound(self) -> bool:
        """Whether the parameter, buffer and submodule dicts map their names to the objects captured."""
        (parameters, then_parameters), (buffers, then_buffers), (submodules, then_submodules) = self.bindings
        return (same_mapping(parameters, then_parameters) and same_mapping(buffers, then_buffers)
                and same_mapping(submodules, then_submodules))

    def restore(self) -> None:
        super().restore()
        for mapping, then in self.bindings:
            if not same_mapping(mapping, then):
                dict.clear(mapping)
                dict.update(mapping, then)


class HeldValueRecord(ValueRecord):
    """One attribute of a plain object that another recorded value holds (``self.counter.n``):
    put back like any :class:`ValueRecord`, and observed through its holder, whose fingerprint
    prints the object's attributes (a finding names ``attribute `self.counter```, once)."""

    def observe(self) -> tuple[()]:  # type: ignore[override]
        return ()


class HeldKeysRecord(NewKeysRecord):
    """Attributes created on a held plain object: removed by restore, observed through its holder."""

    def observe(self) -> list[Observed]:
        return []


class SlotRecord:
    """One ``__slots__`` attribute of a held object, read and put back through its descriptor
    (so a ``__setattr__`` that refuses writes does not stop the restore)."""

    def __init__(self, subject: str, obj: Any, descriptor: Any) -> None:
        self.subject = subject
        self.obj = obj
        self.descriptor = descriptor
        self.value = self._read()
        self.print = _printed(self.value)
        self.content = _Content(self.value, _MAX_DEPTH) if _is_container(self.value) else None

    def _read(self) -> Any:
        try:
            return self.descriptor.__get__(self.obj, type(self.obj))
        except AttributeError:  # an empty slot
            return MISSING

    def unchanged(self) -> bool:
        value = self._read()
        return value is self.value if is_immutable(value) else fingerprint(value) == self.print

    def restore(self) -> None:
        value = self._read()
        if value is not self.value:
            if self.value is MISSING:
                self.descriptor.__delete__(self.obj)
            else:
                self.descriptor.__set__(self.obj, self.value)
        if self.content is not None:
            self.content.restore()

    def observe(self) -> tuple[Observed]:
        value = self._read()
        if value is MISSING:
            return (Observed("state", self.subject, "<absent>", "<absent>"),)
        seen = _printed(value)
        return (Observed("state", self.subject, seen, show_printed(value, seen)),)


def class_subject(cls: type, key: str) -> Subject:
    """``class attribute `Block.calls```."""
    return Subject("class attribute", key, owner=cls.__qualname__)


class ClassValueRecord(ValueRecord):
    """One piece of plain data in a class's namespace (a counter bumped as ``type(self).calls += 1``,
    a registry dict): the binding put back with ``type.__setattr__`` (a class's ``__dict__`` is a
    read-only view; a metaclass's ``__setattr__`` is not asked), the content as a value's."""

    def __init__(self, cls: type, key: str) -> None:
        self.owner = cls
        super().__init__("state", class_subject(cls, key), cls.__dict__, key)  # (a live view)

    def restore(self) -> None:
        cls, key = self.owner, self.key
        if not self.present:
            if key in cls.__dict__:
                type.__delattr__(cls, key)
            return
        if cls.__dict__.get(key, MISSING) is not self.value:
            type.__setattr__(cls, key, self.value)
        if self.content is not None:
            self.content.restore()


class ClassKeysRecord:
    """Plain data a region creates in a class's namespace (``type(self).total += 1`` where
    ``total`` is inherited makes it the subclass's own): removed by restore, observed as
    ``class attribute `Block.total```."""

    def __init__(self, cls: type) -> None:
        self.owner = cls
        self.keys = set(cls.__dict__)

    def _new(self) -> list[str]:
        namespace = self.owner.__dict__
        if namespace.keys() <= self.keys:
            return []
        return [k for k in namespace if k not in self.keys and _class_data(k, namespace[k])]

    def unchanged(self) -> bool:
        return not self._new()

    def restore(self) -> None:
        for key in self._new():
            type.__delattr__(self.owner, key)

    def observe(self) -> Iterator[Observed]:
        namespace = self.owner.__dict__
        for key in self._new():
            value = namespace[key]
            seen = _printed(value)
            yield Observed("state", class_subject(self.owner, key), seen, show_printed(value, seen))


def _class_data(key: str, value: Any) -> bool:
    """Whether a class namespace's ``key`` holds plain data a region may change: not a function,
    method, property or other descriptor, not a class, and not a dunder name."""
    return (is_module_state(key) and not isinstance(value, (type, types.ModuleType))
            and not callable(value) and not hasattr(type(value), "__get__"))


class InstanceRngRecord:
    """An RNG instance the region can draw from (``random.Random``, numpy's ``RandomState``,
    ``Generator`` or a bit generator), by its state: observed as ``rng``
    (``random.Random `self.rng```), put back with its own setter."""

    def __init__(self, name: str, obj: Any, kind: str) -> None:
        self.obj, self.kind = obj, kind
        self.subject = Subject("RNG instance", name, owner=kind)
        self.state = instance_state(obj, kind)
        self.print = rng_fingerprint(self.state)

    def unchanged(self) -> bool:
        return rng_fingerprint(instance_state(self.obj, self.kind)) == self.print

    def restore(self) -> None:
        if not self.unchanged():
            set_instance_state(self.obj, self.kind, self.state)

    def observe(self) -> tuple[Observed]:
        state = instance_state(self.obj, self.kind)
        return (Observed("rng", self.subject, rng_fingerprint(state), rng_summary(state)),)


def _record_name(record: Any) -> str:
    """How :meth:`Snapshot.notes` names what ``record`` holds."""
    subject = getattr(record, "subject", None)
    if subject:
        return str(subject)
    owner = getattr(record, "owner", None)
    if isinstance(owner, type):
        return f"attributes created on class `{owner.__qualname__}`"
    module = getattr(record, "module", None)
    if module is not None:
        return f"attributes created on `{module or 'self'}`"
    return type(record).__name__


class _NoRecord:
    """Stands for an object whose slots have records of their own (its key marks it found)."""

    def unchanged(self) -> bool:
        return True

    def restore(self) -> None:
        pass

    def observe(self) -> tuple[()]:
        return ()


_NO_RECORD = _NoRecord()

#: at most this many notes name what a snapshot cannot put back (one more counts the rest)
_MAX_NOTES = 8

#: at most this many values are looked into for held state in one snapshot (besides the depth and
#: items a container bounds, as fingerprints have): the search stays bounded on any model
_MAX_HELD = 1 << 16

#: exact types never looked into for held state: immutable values, and what the snapshot records
#: otherwise (modules, tensors, generators) or never holds state of its own (functions, classes)
_NOT_HOLDERS = frozenset({bool, int, float, complex, str, bytes, type(None), torch.dtype, torch.device,
                          torch.Size, range, slice, types.FunctionType, types.BuiltinFunctionType,
                          types.MethodType, functools.partial, type, types.ModuleType, torch.Tensor,
                          torch.nn.Parameter, frozenset})

#: types whose objects a held search does not look into: what the snapshot records by other means
#: (modules, tensors, torch's generators, a training loop's optimizer) and values without state
_SKIPPED_HOLDERS = (torch.nn.Module, torch.Tensor, torch.Generator, torch.optim.Optimizer, type,
                    types.ModuleType, enum.Enum)


class DefaultDtypeRecord:
    """``torch.get_default_dtype()``: a region that sets it and does not reset it changes every
    later factory call (and no checkpoint restores it for the recompute)."""

    def __init__(self) -> None:
        self.dtype = torch.get_default_dtype()

    def unchanged(self) -> bool:
        return torch.get_default_dtype() == self.dtype

    def restore(self) -> None:
        if torch.get_default_dtype() != self.dtype:
            torch.set_default_dtype(self.dtype)

    def observe(self) -> Iterator[Observed]:
        dtype = torch.get_default_dtype()
        yield Observed("context", DEFAULT_DTYPE_SUBJECT, str(dtype), str(dtype).removeprefix("torch."))


def _made_name(key: tuple, make: Any) -> str:
    """How a note names the record ``make`` was to make (its subject, where it was given one)."""
    subject = next((arg for arg in getattr(make, "args", ()) if type(arg) is Subject), None)
    return str(subject) if subject is not None else f"a {key[0]} the region reaches"


# -- the snapshot -------------------------------------------------------------------------------


class Snapshot:
    """An ordered set of records; restore puts every record back, last added first."""

    def __init__(self, rng: RngRecord) -> None:
        self.rng = rng
        self.records: list[Any] = []
        self.keys: set[Any] = set()
        #: the gradient records, apart: cleared before each run, put back last
        self.grads: list[GradRecord] = []
        #: the records the last observe did not find as captured, until the next restore
        self._changed: list[Any] | None = None
        #: what was found and cannot be put back, by its name in backticks: why (see :meth:`notes`)
        self.unrestorable: dict[str, str] = {}
        self._held_left = _MAX_HELD  # values a held search may still look into
        #: values :meth:`hold` is still to look into, as a heap: (-depth, rank first, order, rank, name,
        #: value, depth, held)
        self._pending: list[tuple[int, int, int, int, str, Any, int, bool]] = []
        self._searching = False
        self._order = itertools.count()
        #: 1 while a model's modules are held (what they hold is looked into after what the step's
        #: own objects, globals and closures hold at the same depth), else 0
        self._rank = 0
        #: plain objects and RNG instances found below the depth a held search looks, by id: (name, object)
        self._deeper: dict[int, tuple[str, Any]] = {}
        #: iterators the step reads its data from (a generator, ``iter(data)`` in its closure or a
        #: global), by name: their position can be neither read nor set, so a check cannot put them
        #: back (see :meth:`refuse_iterators`; one held deeper, a module's counter, is a note)
        self.iterators: dict[str, Any] = {}

    def add(self, key: Any, make: Any) -> bool:
        """Add ``make()`` under ``key`` unless a record for ``key`` exists; True when added."""
        if key in self.keys:
            return False
        self.keys.add(key)
        try:
            record = make()
        except Exception as exc:  # noqa: BLE001 - the value's own code raised when read: named, not raised
            self.unrestorable.setdefault(_made_name(key, make), f"reading it raised {error_line(exc)}")
            return False
        (self.grads if type(record) is GradRecord else self.records).append(record)
        return True

    def track(self, reach: Reach, param_kind: str = "param_version") -> dict[str, torch.Tensor]:
        """Add records for everything ``reach`` knows that the snapshot does not hold yet.

        Modules (parameters with their grads, buffers, every attribute, the bindings of their
        parameter, buffer and submodule dicts, attributes created later), globals read and
        written, tensors held outside modules, plain objects' attributes, explicit generators,
        and what all these values hold (see :meth:`hold`): plain objects' attributes, class
        attributes of the classes whose code runs, RNG instances.
        Parameters are recorded as ``param_kind`` (``param_version`` for a region, whose
        parameters must not change; ``state`` for a step, whose optimizer changes them).
        Returns the parameters newly tracked, by dotted name.
        """
        with _one_pass(), self._breadth_first():
            return self._track(reach, param_kind)

    def _track(self, reach: Reach, param_kind: str) -> dict[str, torch.Tensor]:
        add = self.add
        found: dict[str, torch.Tensor] = {}
        for name, generator in reach.generators.items():
            self.rng.add_generator(name, generator)

        def parameter(name: str, tensor: torch.Tensor) -> None:
            if add(("param", id(tensor)), functools.partial(TensorRecord, param_kind, parameter_subject([name]), tensor)):
                found[name] = tensor
                add(("grad", id(tensor)), functools.partial(GradRecord, name, tensor))

        self._rank = 1  # (see :meth:`hold`)
        for prefix, module in list(reach.modules.values()):
            if not add(("module", id(module)), functools.partial(ModuleRecord, module, prefix)):
                continue
            dotted = (prefix + ".") if prefix else ""
            for name, param in module._parameters.items():
                if param is not None:
                    parameter(dotted + name, param)
            for name, buffer in module._buffers.items():
                if buffer is not None:
                    add(("buffer", id(buffer)), functools.partial(
                        TensorRecord, "buffer", buffer_subject(prefix, name), buffer))
            attributes = module.__dict__
            for key in itertools.filterfalse(MODULE_INTERNALS.__contains__, list(attributes)):  # (most: in C)
                if is_module_state(key) and add(("attr", id(module), key), functools.partial(
                        ValueRecord, "state", attribute_subject(prefix, key), attributes, key)) \
                        and type(attributes.get(key)) not in _NOT_HOLDERS:  # (most: flags and sizes)
                    self.hold(f"{prefix or 'self'}.{key}", attributes.get(key))
            self._classes(type(module))
        self._rank = 0
        for place, ref in list(reach.writes.items()) + list(reach.reads.items()):
            if _is_iterator(ref.namespace.get(ref.name)):
                self.iterators.setdefault(f"`{ref.display}` (a global)", ref.namespace.get(ref.name))
            elif add(("global", place), functools.partial(ValueRecord, "state", ref.subject, ref.namespace, ref.name)):
                self.hold(ref.display, ref.namespace.get(ref.name))
        for name, tensor in list(reach.tensors.items()):
            if tensor.requires_grad and tensor.is_leaf:  # a parameter held outside a module
                parameter(name, tensor)
            else:
                add(("tensor", id(tensor)), functools.partial(TensorRecord, "state", Subject("tensor", name), tensor))
        for name, obj in list(reach.objects.items()):
            self.hold(name, obj, held=False)
        return found

    def closures(self, step: Any) -> None:
        """Records for the variables the closures of ``step`` keep, and of the functions, bound
        methods and partials those hold or its code names as globals (``get_batch = loader(data)``):
        a batch list the step pops from, a ``losses`` list it appends to, a ``nonlocal`` counter.  Each is put back (the cell rebound, a container's
        content restored) and compared between runs like a global; the plain objects, modules and
        tensors found there are the reach's.  An iterator found there is named in :attr:`iterators`.
        """
        with self._breadth_first():
            self._closures(step)

    def _closures(self, step: Any) -> None:
        seen: set[int] = set()
        todo = [step]
        # (a batch list's tensors are the reach's, each a TensorRecord: its content is not copied twice)
        tracked = frozenset(key[1] for key in self.keys if key[0] in ("tensor", "param", "buffer"))
        while todo:
            function = todo.pop()
            if isinstance(function, functools.partial):
                todo.append(function.func)
                continue
            if isinstance(function, types.MethodType):
                function = function.__func__
            if not isinstance(function, types.FunctionType) or id(function) in seen \
                    or is_library(function.__module__):
                continue
            seen.add(id(function))
            names = function.__globals__
            todo += [names[name] for name in code_globals(function.__code__)[0]
                     if isinstance(names.get(name), (types.FunctionType, types.MethodType, functools.partial))]
            for name, cell in zip(function.__code__.co_freevars, function.__closure__ or ()):
                value = _Cell(cell).get(name, MISSING)
                where = f"{name}` (closure of {function.__qualname__})"
                if isinstance(value, (types.FunctionType, types.MethodType, functools.partial)):
                    todo.append(value)
                elif _is_iterator(value):
                    self.iterators.setdefault(f"`{where}", value)
                elif value is MISSING or is_immutable(value) or _is_container(value) \
                        and not isinstance(value, torch.Tensor):
                    if self.add(("cell", id(cell)), functools.partial(
                            ValueRecord, "state", Subject("closure variable", name, owner=function.__qualname__),
                            _Cell(cell), name, tracked)):
                        self.hold(name, value)

    def refuse_iterators(self) -> None:
        """Refuse, before anything runs, a step that reads an iterator: its twin would read other data.

        Raises:
            RuntimeError: naming each iterator, its type, and what to do instead.
        """
        if self.iterators:
            named = ", ".join(f"iterator {name}, a {type(value).__qualname__}"
                              for name, value in itertools.islice(self.iterators.items(), _MAX_NOTES))
            raise RuntimeError(
                f"recheck cannot put back {named}: an iterator's position can be neither read nor set, so "
                "the step's uncheckpointed twin would run on other data and the check would leave it advanced; "
                "pass the batch in (a step that reads its data from a list, a dict or a tensor is put back), "
                "or use recheck.watch() around the real step")

    # -- what values hold ------------------------------------------------------------------------

    def hold(self, name: str, value: Any, depth: int = _MAX_DEPTH, held: bool = True) -> None:
        """Records for the state ``value`` (reached as ``name``) holds, ``depth`` levels down.

        A plain object's attributes (and those created later) and its class's plain data, a
        ``__slots__`` object's slots, an RNG instance's state; lists, tuples, deques and dicts
        are looked into for them (their own content is put back by the record that holds
        them).  Modules, tensors and torch's generators are the reach's, recorded by
        :meth:`track` once.  ``held``: the value is itself recorded (a module's attribute, a
        global), whose fingerprint shows its object's attributes; the attributes' records then
        only put back.  What cannot be put back is named in :attr:`unrestorable`.

        Values are looked into breadth first, across everything held in one :meth:`track`, and
        at each depth what the step's own objects, globals and closures hold before what a
        model's modules hold: what the search's bound (:data:`_MAX_HELD` values) leaves out is
        the deepest, never a metrics object's list because a model's attributes hold many values.
        """
        if type(value) in _NOT_HOLDERS or issubclass(type(value), _SKIPPED_HOLDERS):  # (its type, not its __class__)
            return
        first = self._rank if depth < _MAX_DEPTH else 0  # (what is held directly: in the order given)
        heapq.heappush(self._pending, (-depth, first, next(self._order), self._rank, name, value, depth, held))
        if not self._searching:  # (inside a search, the search looks into it in its turn)
            with self._breadth_first():
                pass

    @contextlib.contextmanager
    def _breadth_first(self) -> Iterator[None]:
        """Values :meth:`hold` is given in the block are looked into after it, in turn, each
        value's own before any of theirs (the outermost block only)."""
        if self._searching:
            yield
            return
        self._searching = True
        try:
            yield
            while self._pending:
                *_, self._rank, name, value, depth, held = heapq.heappop(self._pending)
                self._hold(name, value, depth, held)
        finally:
            self._searching, self._rank = False, 0
            self._pending.clear()

    def _hold(self, name: str, value: Any, depth: int, held: bool) -> None:
        try:
            self._look_into(name, value, depth, held)
        except Exception as exc:  # noqa: BLE001 - the value's own code raised when read: named, the search goes on
            self.unrestorable.setdefault(f"`{name}`", f"looking into it raised {error_line(exc)}")

    def _look_into(self, name: str, value: Any, depth: int, held: bool) -> None:
        cls = type(value)
        if depth <= 0:
            if id(value) not in self._deeper and (instance_kind(value) is not None or not is_library(cls.__module__)
                                                  and instance_dict(value) is not None):
                self._deeper[id(value)] = (name, value)  # named in the notes unless recorded by another way
            return
        self._held_left -= 1
        if self._held_left < 0:
            self.unrestorable.setdefault(f"what lies beyond the first {_MAX_HELD:,} values the region reaches",
                                         "recheck looks no further for state held in them")
            return
        kind = instance_kind(value)
        if kind is not None:
            self._rng_instance(name, value, kind)
        elif issubclass(cls, (list, tuple, collections.deque)):
            items = items_of(value, cls)[1] if issubclass(cls, (list, tuple)) else itertools.islice(value, _MAX_ITEMS)
            for index, item in enumerate(items):
                if type(item) not in _NOT_HOLDERS:
                    self.hold(f"{name}[{index}]", item, depth - 1)
        elif issubclass(cls, dict):
            for key, item in itertools.islice(dict.items(value), _MAX_ITEMS):
                if type(item) not in _NOT_HOLDERS:  # (a key of another type is not asked for its repr)
                    self.hold(f"{name}[{key!r}]" if type(key) in (str, int) else f"{name}[...]", item, depth - 1)
        elif issubclass(cls, (set, frozenset)) or is_library(cls.__module__) and not hasattr(cls, "__next__"):
            return  # (a set holds hashable values; torch's, numpy's and Python's own objects keep no project state)
        elif instance_dict(value) is not None:
            self._object(name, value, depth, held)
        elif not self._slots(name, value, depth):
            what = f"{cls.__module__}.{cls.__qualname__}"
            self.unrestorable.setdefault(f"`{name}`", (
                f"an iterator ({what}), whose position cannot be read" if hasattr(cls, "__next__") else
                f"a {what} object without attributes recheck can read "
                "(a compiled extension's, or one whose `__dict__` raises)"))

    def _object(self, name: str, obj: Any, depth: int, held: bool) -> None:
        """A plain object's attributes, those it creates later, and its classes' plain data."""
        attributes = instance_dict(obj)
        assert attributes is not None  # (the caller found it)
        if not self.add(("object", id(obj)), functools.partial(HeldKeysRecord if held else NewKeysRecord,
                                                               attributes, name)):
            return
        value_record = HeldValueRecord if held else ValueRecord
        for key in list(attributes):
            if is_module_state(key) and self.add(("object-attr", id(obj), key), functools.partial(
                    value_record, "state", attribute_subject(name, key), attributes, key)):
                self.hold(f"{name}.{key}", attributes.get(key), depth - 1)
        self._classes(type(obj))

    def _slots(self, name: str, obj: Any, depth: int) -> bool:
        """Records for the ``__slots__`` of an object without a ``__dict__``; False where it has none."""
        descriptors = []
        for klass in type(obj).__mro__:
            slots = klass.__dict__.get("__slots__", ())
            for slot in (slots,) if isinstance(slots, str) else slots:
                mangled = f"_{klass.__name__.lstrip('_')}{slot}" if slot.startswith("__") and not slot.endswith("__") \
                    else slot
                descriptor = klass.__dict__.get(mangled)
                if isinstance(descriptor, types.MemberDescriptorType):
                    descriptors.append((slot, descriptor))
        if not descriptors:
            return False
        if self.add(("object", id(obj)), lambda: _NO_RECORD):
            for slot, descriptor in descriptors:
                if self.add(("slot", id(obj), slot), functools.partial(
                        SlotRecord, attribute_subject(name, slot), obj, descriptor)):
                    self.hold(f"{name}.{slot}", self.records[-1].value, depth - 1)
            self._classes(type(obj))
        return True

    def _classes(self, cls: type) -> None:
        """The plain data in the namespaces of ``cls`` and its bases (the project's, not a library's)."""
        for klass in cls.__mro__:
            if klass is object or is_library(klass.__module__):
                continue
            if not self.add(("class", id(klass)), functools.partial(ClassKeysRecord, klass)):
                continue
            namespace = klass.__dict__
            for key, value in list(namespace.items()):
                if _class_data(key, value) and self.add(("class-attr", id(klass), key),
                                                        functools.partial(ClassValueRecord, klass, key)):
                    self.hold(f"{klass.__qualname__}.{key}", value)

    def _rng_instance(self, name: str, obj: Any, kind: str) -> None:
        try:
            self.add(("rng-instance", id(obj)), functools.partial(InstanceRngRecord, name, obj, kind))
        except Exception as exc:  # noqa: BLE001 - a state that cannot be read
            self.keys.discard(("rng-instance", id(obj)))
            self.unrestorable.setdefault(f"{kind} `{name}`", f"its state cannot be read ({error_line(exc)})")

    def notes(self) -> list[str]:
        """One note per piece of state the region reaches that this snapshot cannot put back
        (the check may leave it changed), the first :data:`_MAX_NOTES` and a count of the rest;
        none where everything found is put back."""
        found = dict(self.unrestorable)
        for key, (name, value) in self._deeper.items():
            if ("object", key) not in self.keys and ("rng-instance", key) not in self.keys:
                found.setdefault(f"`{name}`", f"it is held more than {_MAX_DEPTH} levels down, where recheck "
                                              f"does not look ({type(value).__qualname__})")
        notes = [f"{name} cannot be put back: {why}; the check may have left it changed"
                 for name, why in itertools.islice(found.items(), _MAX_NOTES)]
        if len(found) > _MAX_NOTES:
            notes.append(f"{len(found) - _MAX_NOTES} more pieces of state the check reaches cannot be put back")
        return notes

    def unchanged(self, except_rng: frozenset[str] = frozenset()) -> bool:
        """True when every piece of state is as captured, RNG streams in ``except_rng`` aside (right
        after :meth:`observe`, only what it did not find as captured is read again)."""
        if self.rng.changed_streams() - except_rng:
            return False
        for record in self.records if self._changed is None else self._changed:  # a loop, not all() over a generator: hundreds of records
            if not record.unchanged():
                return False
        return True

    def restore(self, trust_observed: bool = False) -> None:
        """Put everything back; a record that fails is named in :meth:`notes` and the rest still
        put back (recheck's own failure is never raised into the user's run).

        ``trust_observed`` (right after :meth:`observe`, nothing run since): what it found as
        captured is left as it is.
        """
        records = self.records if self._changed is None or not trust_observed else self._changed
        self._changed = None
        # gradients last: a parameter's dtype goes back first (check_step's float64 rerun)
        for record in [*reversed(records), *reversed(self.grads)]:
            try:
                record.restore()
            except Exception as exc:  # noqa: BLE001 - named in the notes; the rest is still put back
                self.unrestorable.setdefault(_record_name(record),
                                             f"putting it back raised {error_line(exc)}")
        self.rng.restore()

    def observe(self, reference: Mapping[tuple[str, str], Observed] | None = None,
                lean: bool = False) -> dict[tuple[str, str], Observed]:
        """The current value of every recorded piece of state, keyed by (kind, subject).

        ``reference``: another run's observation; a tensor holding the bytes it holds there is
        that run's :class:`Observed` itself, not a copy; ``lean``: a changed tensor other than
        a buffer is kept as its digest (see :func:`shared_or_copied`).  Buffers are copied:
        small, and where a step's twins differ it is mostly there (BatchNorm's statistics,
        updated again by a recompute), which a digest would only tell by running again.
        """
        seen: dict[tuple[str, str], Observed] = {}
        changed: list[Any] = []  # what the observe did not find as captured (see :meth:`restore`)
        for item in self.rng.observe():
            seen[(item.kind, item.subject)] = item
        with _one_pass():
            for record in self.records:
                kind = type(record)
                # the most common records, inline where they are as captured (most are: a module's
                # flags and sizes, its dicts of parameters, buffers and submodules)
                if kind is ValueRecord and record._immutable \
                        and record.namespace.get(record.key, MISSING) is record.value:
                    item = record._seen or record.observe()[0]
                    seen[(item.kind, item.subject)] = item
                    continue
                if kind is ModuleRecord and record.namespace.keys() <= record.keys and record.bound():
                    continue
                if (reference is not None or lean) and kind is TensorRecord:
                    items: Any = record.observe(None if reference is None else
                                                reference.get((record.kind, record.subject)),
                                                lean and record.kind != "buffer")
                else:
                    items = record.observe()
                for item in items:
                    seen[(item.kind, item.subject)] = item
                if not (kind is TensorRecord and record._verified):
                    changed.append(record)
        self._changed = changed
        return seen
