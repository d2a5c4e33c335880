"""Snapshots a record takes around a forward and its recomputations.

Built on the checker's lower modules: ``recheck.runtime.reach`` finds what a region can
touch (its modules with their names, explicit generators, the globals its code reads)
and ``recheck.runtime.fingerprints`` reads RNG streams and fingerprints values.  What is added here is specific to
watching many invocations: module state
(own buffers as prints, every attribute as a shallow print) keyed by the subjects findings use.
"""

from __future__ import annotations

import functools
import itertools
import operator
import sys
import weakref
from typing import Any, ItemsView, Iterable, Iterator, KeysView, Mapping, TypeGuard, ValuesView

import torch

from recheck.findings import Subject, one_line_pair
from recheck.runtime.naming import buffer_subject
from recheck.runtime.reach import GlobalRef, Reach, cell_values
from recheck.runtime.fingerprints import (AS_IS, MISSING, items_of, module_state_names, shallow, show, show_printed,
                                          show_shallow)
from recheck.runtime.rng import CPU_STREAM, cpu_fingerprint, only_cpu, rng_fingerprints
from recheck.runtime.digests import Store, print_buffer

__all__ = ["BufferVersions", "ModuleState", "ParameterVersions", "buffer_versions", "changed_buffers",
           "direct_modules", "entry_state", "global_change", "module_state", "parameter_versions",
           "shown_change", "subtree", "with_submodules"]


def _is_module(value: Any) -> TypeGuard[torch.nn.Module]:
    """Whether ``value`` is a module, told by its type: ``isinstance`` would ask the value for its
    ``__class__``, which a user class may answer with code of its own, or an error."""
    return issubclass(type(value), torch.nn.Module)


def direct_modules(function: Any, reach: Reach) -> list[torch.nn.Module]:
    """Modules a checkpointed callable names directly: itself, its bound ``self``, a
    ``partial``'s arguments, its closure cells and the globals its code reads.

    Modules only inside a container (timm's ``checkpoint_seq`` closes over a tuple of
    every block) are left out: they count when their forward runs (``with_submodules``).
    """
    found: list[torch.nn.Module] = []
    for _ in range(8):
        if _is_module(function):
            found.append(function)
            function = None  # no closure to read (asked of a module, ``__closure__`` raises in its __getattr__)
            break
        if issubclass(type(function), functools.partial):  # not by its attributes: a Mock has every one
            found.extend(a for a in (*function.args, *getattr(function, "keywords", {}).values())
                         if _is_module(a))
            function = function.func
        elif hasattr(function, "__self__") and hasattr(function, "__func__"):
            if _is_module(function.__self__):
                found.append(function.__self__)
            function = function.__func__
        else:
            break
    for value in cell_values(function):
        if _is_module(value):
            found.append(value)
    for ref in list(reach.reads.values()):
        value = ref.namespace.get(ref.name)
        if _is_module(value):
            found.append(value)
    return found


def with_submodules(reach: Reach, ran: Iterable[torch.nn.Module],
                    walks: Subtrees | None = None) -> list[tuple[str, torch.nn.Module]]:
    """The given modules and all their submodules, each once, with its reach name (``walks``:
    the subtrees walked earlier in the forward, taken again where they still hold).

    Module state is compared for the modules a forward ran and those its callable names
    directly (issue 4: "the buffers and attributes of the modules it runs"), not for every
    module the region could reach statically: timm's ``checkpoint_seq`` closes over all
    blocks in each segment, and comparing the other segments' BatchNorm buffers cost time
    and blamed this region for their updates.  Submodules are included so that a buffer
    a parent updates without calling the child's forward
    (``F.batch_norm(x, self.bn.running_mean, ...)``) is still compared.
    """
    subs = _preorder(list(ran), {}, known=walks)  # each module once
    ids, named = list(map(id, subs)), reach.modules
    if not all(map(named.__contains__, ids)):  # one ran without being reachable statically
        for sub in subs:
            reach.add_found(sub)  # it ran without being reachable statically
    return list(map(named.__getitem__, ids))


#: per root's id, its subtree as walked and the children each of its modules had then
Subtrees = dict[int, tuple[list[torch.nn.Module], list[tuple[Any, ...]]]]
_MODULES = operator.attrgetter("_modules")
_VALUES = operator.methodcaller("values")


def _children(modules: list[torch.nn.Module]) -> list[tuple[Any, ...]]:
    """The children of each module (C-level passes): a subtree whose modules have the same
    children has the same modules in the same order."""
    return list(map(tuple, map(_VALUES, map(_MODULES, modules))))


def _preorder(roots: Iterable[torch.nn.Module], walked: dict[int, None], subtrees: Subtrees | None = None,
              known: Subtrees | None = None) -> list[torch.nn.Module]:
    """The modules of each root's ``modules()``, root after root, each once, in the same order,
    leaving out those in ``walked`` with their subtrees (and adding the rest to it).  Walked
    with a list for a stack: ``Module.modules()`` resumes a generator at every level for every
    module.  ``subtrees`` is told each root's subtree as walked, by the root's id; one of
    ``known`` is taken again while each of its modules has the same children (the scope of a
    forward's end is the subtrees of the modules told as they ran)."""
    found: list[torch.nn.Module] = []
    for root in roots:
        if id(root) in walked:
            continue
        kept = known.get(id(root)) if known is not None else None
        if kept is not None and _children(kept[0]) == kept[1]:
            modules = kept[0]
        else:
            modules = subtree(root)
            if subtrees is not None:
                subtrees[id(root)] = (modules, _children(modules))
        if walked.keys().isdisjoint(map(id, modules)):
            walked.update(dict.fromkeys(map(id, modules)))
            found += modules
        else:
            found += _walk((root,), walked)
    return found


def _walk(roots: Iterable[torch.nn.Module], walked: dict[int, None]) -> list[torch.nn.Module]:
    found: list[torch.nn.Module] = []
    stack = list(roots)
    stack.reverse()
    while stack:
        module = stack.pop()
        if id(module) in walked:
            continue
        walked[id(module)] = None
        found.append(module)
        if module._modules:  # (most modules are leaves)
            stack.extend(reversed([child for child in module._modules.values() if child is not None]))
    return found


def subtree(root: torch.nn.Module) -> list[torch.nn.Module]:
    """``root``'s subtree in preorder, each module once."""
    return _walk((root,), {})


#: (id(module), buffer name) -> (module, id(buffer tensor), its version, its print): which tensor
#: each buffer slot held and what it held when first seen in a forward
BufferVersions = dict[tuple[int, str], tuple[torch.nn.Module, int, int, Any]]


def buffer_versions(modules: Iterable[torch.nn.Module], into: BufferVersions,
                    walked: dict[int, None] | None = None, subtrees: Subtrees | None = None) -> None:
    """Add the buffers of ``modules`` and their submodules to ``into`` (those not in it yet).

    The bytes are kept (as a digest), not only the version counter: BatchNorm's kernel
    updates ``running_mean`` and ``running_var`` in place without bumping their versions.
    ``walked`` (ids of modules whose subtrees were walked, as keys) lets a forward walk each
    subtree once: it calls this for every module that runs (``intercept.module_calls``), and a
    module's subtree was walked with its parent's.  ``subtrees`` is told the subtree of each
    module walked, by its id.
    """
    found = _preorder(modules, {} if walked is None else walked, subtrees)
    if not any(map(len, map(_BUFFERS, found))):  # most modules hold none (transformers): one C-level pass
        return
    for module in found:
        buffers = module._buffers
        if not buffers:
            continue
        for name, buffer in buffers.items():
            key = (id(module), name)
            if buffer is not None and key not in into:
                into[key] = (module, id(buffer), buffer._version, print_buffer(buffer, "digest"))


def changed_buffers(versions: BufferVersions) -> list[tuple[torch.nn.Module, str]]:
    """The buffers written (in place, or rebound to another tensor) since ``versions`` saw them."""
    changed = []
    for (_, name), (module, tensor_id, version, before) in versions.items():
        buffer = module._buffers.get(name)
        if buffer is None:
            continue
        if id(buffer) != tensor_id or buffer._version != version or not before.same(print_buffer(buffer, "digest")):
            changed.append((module, name))
    return changed


class _Flat:
    """The slots of several dicts (modules' ``__dict__``, ``_buffers``, ``_parameters``): three
    parallel lists, which dict (its index in the list the layout was made from), the name in it
    and the state key of each slot (lists, not a tuple per slot: what a layout keeps adds few
    objects for the garbage collector to walk).  A layout holds no dict and no module: it is
    read against the dicts as they are now (:func:`_read`), so it can be kept with a dormant
    reach between ``watch()`` blocks without keeping a model alive.  It is valid while the
    dicts hold as many names, and the first ``keyed`` the same names.  Checking that takes a
    few C-level passes over the dicts, not a Python loop over the modules: a region may reach
    every block of a model (timm's ``checkpoint_seq`` closes over them all) and reads their
    parameters' versions twice per invocation."""

    __slots__ = ("sizes", "filled", "names", "owners", "slots", "parts", "_keys", "ids", "typed", "places", "tuples")

    def __init__(self, dicts: list[dict[str, Any]], keyed: int = 0) -> None:
        self.sizes = list(map(len, dicts))
        #: of the first ``keyed`` dicts (those only some of whose names are slots: a module's
        #: ``__dict__``), the indices of those that hold names, and their names (tuples of
        #: strings, which the collector does not track; an empty dict is checked by its size).
        #: A dict all of whose names are slots is checked by its size alone: the same number of
        #: names with one replaced leaves a slot whose name is gone, which raises ``KeyError``
        #: where it is read (see :func:`_read`)
        self.filled = [index for index, d in enumerate(dicts[:keyed]) if d]
        self.names = [tuple(dicts[index]) for index in self.filled]
        self.owners: list[int] = []
        self.slots: list[str] = []
        #: the key of each slot, or of a module state's slot its parts ``(what, owner, name)``,
        #: made a key (:attr:`keys`) only when an entry is asked for: a state is read three times
        #: an invocation and almost always compared as it was read, by its layout
        self.parts: list[Any] = []
        self._keys: list[Any] | None = None
        #: the ids of the modules the dicts belong to, where the caller's key does not say
        self.ids: list[int] = []
        #: the types of the values last read in the slots, and the indices of the slots among
        #: them that :func:`module_state` prints (see :class:`ModuleState`): worked out again
        #: only when a slot holds a value of another type (one tuple: threads may share a layout)
        self.typed: tuple[list[type], list[int]] | None = None
        #: the layout :meth:`places_in` last placed this one in, and the places
        self.places: tuple[_Flat, tuple[int, ...] | None] | None = None
        #: per slot that held a tuple of ints and strings when last read (a conv's kernel_size,
        #: stride, padding): the tuple and its entry in :class:`ModuleState`'s ``printed``, taken
        #: again while the slot holds the very same tuple (immutable through and through: a state
        #: read three times an invocation makes no tuples for it)
        self.tuples: dict[int, tuple[tuple[Any, ...], tuple[int, Any]]] = {}

    def extend(self, triples: list[tuple[int, str, Any]], worded: bool = True) -> None:
        """Add slots, each ``(index of its dict, slot, key)`` (not ``worded``: the key's parts):
        three list extensions, not a call per slot (a block's first invocation lays out every
        module it reaches)."""
        if triples:
            owners, slots, keys = zip(*triples)
            self.owners.extend(owners)
            self.slots.extend(slots)
            self.parts.extend(keys)
        if worded:
            self._keys = self.parts

    @property
    def keys(self) -> list[Any]:
        """The key of each slot: ``("param_version", dotted name)``, ``(what, subject)``."""
        keys = self._keys
        if keys is None:
            keys = self._keys = [(what, Subject(what, name, owner=owner)) for what, owner, name in self.parts]
        elif None in keys:  # some made by :meth:`key`
            keys[:] = [self.key(index) for index in range(len(keys))]
        return keys

    def key(self, index: int) -> Any:
        """The key of one slot, made (and kept) without the others' (a difference between two
        layouts asks for a few)."""
        keys = self._keys
        if keys is None:
            keys = self._keys = [None] * len(self.parts)
        key = keys[index]
        if key is None:
            what, owner, name = self.parts[index]
            key = keys[index] = what, Subject(what, name, owner=owner)
        return key

    def places_in(self, other: _Flat) -> tuple[int, ...] | None:
        """The index in ``other`` of each of this layout's slots, by key (None: a key it lacks);
        worked out once per pair of layouts (kept with the last ``other`` it was asked for: a
        forward's scope is placed in the layout of the whole reach, the same one every time)."""
        known = self.places
        if known is not None and known[0] is other:
            return known[1]
        index = {key: place for place, key in enumerate(other.keys)}
        places = tuple(index[key] for key in self.keys) if all(key in index for key in self.keys) else None
        self.places = (other, places)
        return places

    def valid(self, dicts: list[dict[str, Any]]) -> bool:
        return (list(map(len, dicts)) == self.sizes
                and list(map(tuple, map(dicts.__getitem__, self.filled))) == self.names)


def _read(flat: _Flat, dicts: list[dict[str, Any]]) -> list[Any]:
    """The value in every slot of ``flat`` in ``dicts``; ``KeyError`` where a slot's name is gone."""
    return list(map(operator.getitem, map(dicts.__getitem__, flat.owners), flat.slots))


#: the layout of no modules (shared: nothing is ever added to it)
_NO_SLOTS = _Flat([])
_PARAMETERS = operator.attrgetter("_parameters")
_BUFFERS = operator.attrgetter("_buffers")
_NAME = operator.itemgetter(0)
_MODULE = operator.itemgetter(1)
_WHAT = operator.itemgetter(0)


class _ReachLayouts:
    """A reach's layouts: its parameters, and the parameters and the module state of each set
    of modules (a forward's scope).  They hold no module and no dict (see :class:`_Flat`), so a
    dormant reach keeps them between ``watch()`` blocks (a test suite watches each test in its
    own block)."""

    __slots__ = ("tensors", "scoped", "states")

    def __init__(self) -> None:
        self.tensors: _Flat | None = None
        #: the parameter layouts of sets of the reach's modules (a forward's scope), keyed as
        #: ``states`` is
        self.scoped: dict[tuple[tuple[str, ...], tuple[int, ...]], _Flat] = {}
        #: by the names and ids of the modules (a tuple of ids is hashed without asking the
        #: modules; a layout is checked against the modules' dicts, and its keys are made of
        #: the names, so a new module with a dead one's id and name is laid out rightly)
        self.states: dict[tuple[tuple[str, ...], tuple[int, ...], int], _Flat] = {}


def _layouts_of(reach: Reach) -> _ReachLayouts:
    """The layouts kept with ``reach``, while it lives."""
    layouts = reach.kept.get("layouts")
    if layouts is None:
        layouts = reach.kept["layouts"] = _ReachLayouts()
    return layouts


def _parameter_key(module: str, name: str) -> tuple[str, str]:
    """The key of a module's parameter: ``("param_version", "fc.weight")``."""
    return "param_version", f"{module}.{name}" if module else name


#: per module whose parameters FSDP2 shards, its parameters' names and their sharded parameters
#: (``DTensor``), and the number of composable states they were read from and the last one's key
_SHARDED: tuple[weakref.WeakKeyDictionary[torch.nn.Module, dict[str, Any]], Any] = (weakref.WeakKeyDictionary(), 0)


def _sharded_parameters() -> weakref.WeakKeyDictionary[torch.nn.Module, dict[str, Any]] | None:
    """For each module whose parameters FSDP2 (``fully_shard``) manages, a dict like its
    ``_parameters`` holding the sharded parameters: the one an optimizer steps.  Around its
    forward and its recompute the module holds unsharded parameters that each all-gather writes
    anew, whose versions never move; the sharded parameter's do.  Read again when the composable
    states (FSDP2's, ``checkpoint``'s, ``replicate``'s) changed: their number or the last one made
    (a model made anew); None where there is no composable state (``torch.distributed`` never
    imported, or no module made composable)."""
    global _SHARDED
    states = sys.modules.get("torch.distributed._composable_state")
    mapping = getattr(states, "_module_state_mapping", None)
    held = getattr(mapping, "data", None)  # (the weak dict's own dict: its len() is a Python call)
    if mapping is None or not held:
        return None
    seen = (len(held), next(reversed(held), None))
    if seen != _SHARDED[1]:
        sharded: weakref.WeakKeyDictionary[torch.nn.Module, dict[str, Any]] = weakref.WeakKeyDictionary()
        for reference in list(mapping.values()):
            group = getattr(reference(), "_fsdp_param_group", None)
            for fsdp_param in getattr(group, "fsdp_params", ()):
                info = fsdp_param._module_info
                for module, name in ((info.module, info.param_name),
                                     *zip(info.shared_modules, info.shared_param_names)):
                    own = sharded.get(module)
                    if own is None:
                        own = sharded[module] = dict(module._parameters)
                    own[name] = fsdp_param.sharded_param
        _SHARDED = (sharded, seen)
    return _SHARDED[0] or None


def _tensor_slots(reach: Reach, stale: bool = False,
                  pairs: tuple[tuple[str, torch.nn.Module], ...] | None = None) -> tuple[_Flat, list[dict[str, Any]]]:
    """The parameter slots of every reached module: ``(dict, name, key)``, the key
    ``("param_version", dotted name)``, and the dicts they are read in.  ``stale``: the
    kept layout named a slot that is gone (made again).  ``pairs``: the own parameters of
    those (name, module) pairs of the reach only."""
    if pairs is None and not reach.modules or pairs is not None and not pairs:
        return _NO_SLOTS, []
    layouts = _layouts_of(reach)
    named = list(reach.modules.values()) if pairs is None else pairs
    modules = list(map(_MODULE, named))
    dicts = list(map(_PARAMETERS, modules))
    sharded = _sharded_parameters()
    if sharded:
        dicts = [sharded.get(module, own) for module, own in zip(modules, dicts)]
    if pairs is not None and not stale:
        # the very tuple of the last call (every recompute of a region asks for its scope's)
        last = reach.kept.get("parameters")
        if last is not None and last[0] is pairs and last[1].valid(dicts):
            return last[1], dicts
    key = None if pairs is None else (tuple(map(_NAME, pairs)), tuple(map(id, modules)))
    flat = None if stale else layouts.tensors if key is None else layouts.scoped.get(key)
    if flat is None or not flat.valid(dicts) or key is None and list(map(id, modules)) != flat.ids:
        flat = _Flat(dicts)
        flat.ids = list(map(id, modules))
        flat.extend([(index, param, _parameter_key(name, param))
                     for index, (name, module) in enumerate(named) for param in module._parameters])
        if key is None:
            layouts.tensors = flat
        else:
            if len(layouts.scoped) >= 64:  # sets of modules of one reach: one per distinct scope
                layouts.scoped.clear()
            layouts.scoped[key] = flat
    if pairs is not None:
        reach.kept["parameters"] = (pairs, flat)
    return flat, dicts


class ParameterVersions:
    """The version counters of a reach's parameters at one moment, in its layout's order.

    A list of integers (None for an empty slot) beside the layout it follows: a recompute's
    versions are compared with its forward's as two lists, in one C-level comparison, and
    paired by name only when the layout changed or a version moved (a region of timm's
    ``checkpoint_seq`` reaches every block's parameters, read twice per invocation).
    """

    __slots__ = ("layout", "versions")

    def __init__(self, layout: _Flat, versions: list[int | None]) -> None:
        self.layout, self.versions = layout, versions

    def items(self) -> list[tuple[tuple[str, str], int]]:
        """``(("param_version", dotted name), version)`` of each parameter (empty slots left out)."""
        return [(key, version) for key, version in zip(self.layout.keys, self.versions) if version is not None]

    def moved(self, now: ParameterVersions) -> list[tuple[str, int, int]]:
        """``(dotted name, version then, version now)`` of each parameter in both whose version moved.

        ``now`` may follow another layout (the parameters of a forward's scope only, see
        :func:`parameter_versions`): its slots are found in this one's by key, once per pair of
        layouts, and compared in one C-level comparison."""
        if now.layout is self.layout:
            then_versions = self.versions
        else:
            places = now.layout.places_in(self.layout)
            if places is None:
                before = dict(self.items())
                return [(key[1], before[key], version) for key, version in now.items()
                        if key in before and before[key] != version]
            then_versions = [self.versions[index] for index in places]
        if then_versions == now.versions:
            return []
        return [(key[1], then, version) for key, then, version in zip(now.layout.keys, then_versions, now.versions)
                if then is not None and version is not None and then != version]


_NO_VERSIONS = ParameterVersions(_NO_SLOTS, [])


def parameter_versions(reach: Reach, pairs: tuple[tuple[str, torch.nn.Module], ...] | None = None,
                       ) -> ParameterVersions:
    """The version counters of the own parameters of every reached module, or of the modules of
    ``pairs`` (names and modules of the reach: a forward's scope, whose parameters a recompute
    compares; a region of timm's ``checkpoint_seq`` reaches every block and runs a few)."""
    if pairs is None and not reach.modules or pairs is not None and not pairs:
        return _NO_VERSIONS
    flat, dicts = _tensor_slots(reach, pairs=pairs)
    try:
        versions = _versions(flat, dicts)
    except KeyError:  # a parameter's name replaced by another: lay the reach out again
        flat, dicts = _tensor_slots(reach, stale=True, pairs=pairs)
        versions = _versions(flat, dicts)
    return ParameterVersions(flat, versions)


def _versions(flat: _Flat, dicts: list[dict[str, Any]]) -> list[int | None]:
    """The version of the parameter in each of ``flat``'s parameter slots (None: empty);
    ``KeyError`` where a slot's name is gone.  One comprehension over the parameters only: a
    reach may hold the whole model (C-level passes, a list and four iterators, cost more
    instructions on a block's dozen parameters)."""
    return [None if (param := own[name]) is None else param._version
            for own, name in zip(map(dicts.__getitem__, flat.owners), flat.slots)]


def shown_change(then: Any, now: Any) -> tuple[str, str]:
    """How a ``state`` finding shows an attribute's entry before and after it changed (an entry is
    ``(print, value)``, None where absent): each one bounded line, cut around the first difference
    (:func:`recheck.findings.one_line_pair`)."""
    if then is None or now is None:
        return ("<absent>" if then is None else show(then[1]), "<absent>" if now is None else show(now[1]))
    fields = _changed_fields(then, now)
    if fields:  # one object changed in place: its repr now is its repr then too
        shown = fields[:3]
        more = f" and {len(fields) - 3} more" if len(fields) > 3 else ""
        return (f"{type(now[1]).__name__} with " + ", ".join(f".{path} = {a}" for _, path, a, _ in shown) + more,
                ", ".join(f".{path} = {b}" for _, path, _, b in shown) + more)
    return one_line_pair(show(then[1], 1 << 62), show(now[1], 1 << 62))


def _changed_fields(then: Any, now: Any) -> list[tuple[str, str, str, str]]:
    """The fields of one object changed in place between two of its entries, as (name, path to
    the first differing element, then, now), such as ``("cache", "cache['k']", "<absent>",
    "3")`` (empty where the entries are not one object's shallow prints): a print keeps plain
    values (numbers, strings, None) and the items of the containers it holds, so the first
    element that differs inside a field can still be named and its value then shown."""
    before, after = then[0], now[0]
    if then[1] is not now[1] or type(before) is not tuple or type(after) is not tuple or len(before) != 3 \
            or len(after) != 3 or before[0] != "object" or after[0] != "object":
        return []
    differing = _differing(dict(before[2]), dict(after[2]), now[1], ".")
    return [(key, path, was, shown) for key, path, was, shown in differing if isinstance(key, str)]


def _differing(old: dict, new: dict, holder: Any, how: str) -> Iterator[tuple[Any, str, str, str]]:
    """For each key whose print differs between ``old`` and ``new`` (the items of a print of
    ``holder``, read through ``how``: ``"."`` for attributes, ``"[]"`` for keys and indices):
    (key, the path to the first differing element below it, its text then, its text now)."""
    for key in dict.fromkeys([*old, *new]):
        if key in old and key in new and old[key] == new[key]:
            continue
        value = _member(holder, key, how)
        if how == "[]" and type(key) is int and value is MISSING and issubclass(type(holder), dict):
            return  # a key gone from a dict, printed as an int: maybe an object's id, not to be shown
        step = str(key) if how == "." else f"[{key!r}]"
        was, printed = old.get(key, MISSING), new.get(key, MISSING)
        inner = _items(was, printed)
        if inner is not None and value is not MISSING:
            for _, below, was_below, now_below in _differing(*inner, value, "[]"):
                yield key, step + below, was_below, now_below
                break
            else:
                yield key, step, "<another object>", show(value, 40)
            continue
        shown = "<absent>" if value is MISSING else \
            show_shallow(printed) if type(printed) is tuple and printed[:1] == ("tensor",) else show(value, 40)
        yield key, step, "<absent>" if was is MISSING else show_shallow(was), shown


def _items(before: Any, after: Any) -> tuple[dict, dict] | None:
    """The items of two prints of one container kind (a dict's by key, a list's or tuple's by
    index), to look for the first that differs; None for anything else."""
    if type(before) is not tuple or type(after) is not tuple or len(before) != 3 or len(after) != 3 \
            or before[0] != after[0] or before[0] not in ("dict", "list", "tuple"):
        return None
    if before[0] == "dict":
        return dict(before[2]), dict(after[2])
    return dict(enumerate(before[2])), dict(enumerate(after[2]))


def _member(holder: Any, key: Any, how: str) -> Any:
    """``holder``'s attribute or item ``key`` as it is now (MISSING where it has none)."""
    try:
        if how == ".":
            return getattr(holder, key, MISSING) if isinstance(key, str) else MISSING
        kind = type(holder)
        if issubclass(kind, dict):
            return dict.get(holder, key, MISSING)
        if issubclass(kind, (list, tuple)):
            size, items = items_of(holder, kind)
            return items[key] if 0 <= key < size and key < len(items) else MISSING
        return MISSING
    except Exception:  # noqa: BLE001 - a user's __getattr__: the value now is not shown
        return MISSING



def entry_state(reach: Reach, *, rng_only: bool = False, with_text: bool = True,
                ) -> tuple[dict[tuple[str, str], Any], dict[tuple[str, str], str]]:
    """RNG streams and globals read as comparable values; globals also as text (parameter
    versions: :func:`parameter_versions`).

    Keyed ``("rng", stream)`` and ``("global", subject)``; RNG states are
    compared in the one exact encoding of :func:`recheck.runtime.rng.rng_fingerprint` (every
    invocation reads them four times).  ``rng_only`` skips globals, and ``with_text=False`` skips the
    texts (a recompute only needs the text of what differs: :func:`global_change`).
    """
    shown: dict[tuple[str, str], str] = {}
    generators, host = reach.generators, reach.host_rng
    if only_cpu(generators, host):  # (the usual region: torch's CPU stream only)
        values: dict[tuple[str, str], Any] = {_CPU_RNG_KEY: cpu_fingerprint()}
    else:
        values = {}
        for name, fingerprint in rng_fingerprints(generators, host).items():
            values["rng", name] = fingerprint
    if rng_only:
        return values, shown
    for ref in list(reach.reads.values()):
        value = ref.namespace.get(ref.name, MISSING)
        key = "global", ref.subject
        values[key] = shallow(value)  # identity, version, length, numbers by bits: read 4 times a call
        if with_text:
            shown[key] = show_printed(value, values[key])  # made once while the value stays
    return values, shown


_CPU_RNG_KEY = ("rng", CPU_STREAM)


def global_change(reach: Reach, key: tuple[str, str], then: Any, then_text: str) -> tuple[str, str]:
    """How a ``global`` finding shows the global ``key`` at forward (its print ``then`` and text
    ``then_text``) and now: an object changed in place shows the attributes that changed, as a
    ``state`` finding does (its text now is its text then)."""
    kind, subject = key
    for ref in list(reach.reads.values()) if kind == "global" else ():
        if subject == ref.subject:
            value = ref.namespace.get(ref.name, MISSING)
            now = shallow(value)
            if then_text == show_printed(value, now) and _changed_fields((then, value), (now, value)):
                return shown_change((then, value), (now, value))
            return then_text, show(value)
    return then_text, "?"


#: what :func:`module_state` keeps of a bool attribute: its shallow print and the value
_BOOL_ENTRIES = {True: (("bool", True), True), False: (("bool", False), False)}


def _kept(value: Any) -> Any:
    """What a state entry keeps of a value to show it in a finding: a copy of a list, dict or
    set (they may grow later; a subclass's copied through the built-in type, whose methods are
    not the program's code), the object itself otherwise."""
    kind = type(value)
    if kind in (list, dict, set):
        return kind(value)
    if issubclass(kind, (list, dict, set)):
        base = next(b for b in (list, dict, set) if issubclass(kind, b))
        return base(dict.items(value)) if base is dict else base(base.__iter__(value))
    return value


def _state_layout(pairs: tuple[tuple[str, torch.nn.Module], ...], reach: Reach | None,
                  stale: bool = False, attributes_of: tuple[tuple[str, torch.nn.Module], ...] = (),
                  memo: list[Any] | None = None) -> tuple[_Flat, list[dict[str, Any]]]:
    """The attribute and buffer slots of ``pairs``' modules, then the attribute slots of
    ``attributes_of``'s (their own attributes only), with their state keys (see :func:`_layout`),
    and the dicts they are read in; ``stale``: the kept one named a buffer that is gone (made
    again).  ``memo`` (a caller's list of at most one ``(pairs, attributes_of, layout)``) keeps the
    layout last found for these very tuples: a region reads the same scope three times an
    invocation, and every invocation the same tuples (``Forward.scope``)."""
    if not pairs and not attributes_of:
        return _NO_SLOTS, []
    modules = list(map(_MODULE, pairs))
    others = list(map(_MODULE, attributes_of))
    # the __dicts__ first (only some of their names are slots: checked by name), the buffers after
    dicts = list(map(vars, modules)) + list(map(vars, others)) + list(map(_BUFFERS, modules))
    last = memo[0] if memo else None  # one read: threads running the region share the memo
    if last is not None and not stale and last[0] is pairs and last[1] is attributes_of and last[2].valid(dicts):
        return last[2], dicts
    flat, dicts = _laid_out(pairs, reach, stale, attributes_of, modules, others, dicts)
    if memo is not None:
        memo[:] = [(pairs, attributes_of, flat)]
    return flat, dicts


def _laid_out(pairs: tuple[tuple[str, torch.nn.Module], ...], reach: Reach | None, stale: bool,
              attributes_of: tuple[tuple[str, torch.nn.Module], ...], modules: list[torch.nn.Module],
              others: list[torch.nn.Module], dicts: list[dict[str, Any]]) -> tuple[_Flat, list[dict[str, Any]]]:
    """:func:`_state_layout` from the layouts kept with the reach, or made anew."""
    states = _layouts_of(reach).states if reach is not None else None
    modules_key = (tuple(map(_NAME, pairs)) + tuple(map(_NAME, attributes_of)),
                   tuple(map(id, modules)) + tuple(map(id, others)), len(pairs))
    flat = states.get(modules_key) if states is not None and not stale else None
    if flat is None or not flat.valid(dicts):
        keyed = len(modules) + len(others)
        flat = _Flat(dicts, keyed=keyed)
        triples: list[tuple[int, str, Any]] = []
        for index, (name, module) in enumerate(pairs):
            triples += [(keyed + index, buffer, ("buffer", name, buffer)) for buffer in module._buffers]
            triples += [(index, attr, ("attribute", name, attr)) for attr in module_state_names(module)]
        for index, (name, module) in enumerate(attributes_of, start=len(modules)):
            triples += [(index, attr, ("attribute", name, attr)) for attr in module_state_names(module)]
        flat.extend(triples, worded=False)
        if states is not None:
            if len(states) >= 64:  # sets of modules of one reach: one per distinct set that ran
                states.clear()
            states[modules_key] = flat
    return flat, dicts


class ModuleState(Mapping[tuple[str, str], Any]):
    """The compared state of a region's modules at one moment: ``(what, subject) -> entry``.

    An attribute's entry is ``(shallow print, value)``, a buffer's its tensor print, a written
    global's ``(shallow print, value)``.  A record reads the state three times per invocation
    (forward exit, recompute entry and exit) and almost always finds it unchanged, so the state
    is kept as it was read, in the slot order of its layout: the values of the slots that hold
    immutable values (ints, strings, bools, floats, None: a module's flags and sizes), the
    entries of the others (``printed``, with their slot index), and the entries of what is not
    in the layout (``extra``).  :meth:`same` tells two states of one layout equal in C-level
    passes, with no dict made; the mapping of entries is made when first asked for (a finding,
    a full replay's keys).
    """

    __slots__ = ("flat", "raw", "printed", "extra", "_entries")

    def __init__(self, flat: _Flat, raw: list[Any], printed: list[tuple[int, Any]],
                 extra: dict[tuple[str, str], Any]) -> None:
        self.flat, self.raw, self.printed, self.extra = flat, raw, printed, extra
        self._entries: dict[tuple[str, str], Any] | None = None

    def same(self, other: Any) -> bool:
        """Whether every entry equals ``other``'s (False: compare them one by one).

        Two states of one layout are equal when each immutable slot holds the very same object
        (an int or a float rebound to an equal one answers False, and is then compared by its
        print: ``0.0`` against ``-0.0`` is a change) and the printed entries and extras are
        equal.  A value whose ``==`` raises (an array kept in a list) answers False.
        """
        try:
            if type(other) is ModuleState and other.flat is self.flat:
                return (all(map(operator.is_, self.raw, other.raw)) and self.printed == other.printed
                        and self.extra == other.extra)
            found = self.differing(other)
            if found is not None:
                return found[0] == found[1]
            return bool(self.entries() == (other.entries() if type(other) is ModuleState else other))
        except Exception:  # noqa: BLE001 - a user's __eq__ or __bool__
            return False

    def entries(self) -> dict[tuple[str, str], Any]:
        """The state as a dict, in the order :func:`module_state` has always given it."""
        entries = self._entries
        if entries is None:
            entries = self._entries = self._slot_entries(range(len(self.raw)), dict(self.printed))
            for key, entry in self.extra.items():
                entries.setdefault(key, entry)
        return entries

    def _slot_entries(self, indices: Iterable[int], printed: dict[int, Any],
                      worded: bool = True) -> dict[tuple[str, str], Any]:
        """The entries of the slots at ``indices`` (in that order), ``printed`` being the printed
        entries by slot index; not ``worded``: the keys of these slots only are made."""
        entries: dict[tuple[str, str], Any] = {}
        raw, flat = self.raw, self.flat
        if worded:
            keys: Any = flat.keys
        else:
            indices = list(indices)
            keys = dict(zip(indices, map(flat.key, indices)))
        for index in indices:
            key = keys[index]
            entry = printed.get(index, _UNPRINTED)
            if entry is not _UNPRINTED:
                entries[key] = entry
            elif key[0] == "attribute":  # an immutable value: its entry as module_state made it
                value = raw[index]
                kind = type(value)
                entries[key] = _BOOL_ENTRIES[value] if kind is bool else (shallow(value), value) \
                    if kind is float else (value, value)
            # a buffer slot holding None: no entry
        return entries

    def differing(self, other: Mapping[tuple[str, str], Any]) -> tuple[dict[tuple[str, str], Any],
                                                                  dict[tuple[str, str], Any]] | None:
        """The entries of this state and ``other``'s that may differ, as two dicts in the order
        of :meth:`entries`; None where ``other`` is no state (compare all entries then).

        Left out are only the slots where both states hold the very same immutable object,
        whose entries are equal: a state of BatchNorm layers whose statistics changed is
        compared by its printed slots and extras, not by a dict of every flag and size of
        every module (a recompute's state is compared so at every invocation).  Two states of
        two layouts (a module found by running joined the scope) are paired slot by slot by
        the slots' parts, so that no key is worded for a slot left out.
        """
        if type(other) is not ModuleState or any(key[0] != "global" for key in (*self.extra, *other.extra)):
            return None  # (an extra buffer may stand for a slot's key: entries() decides which wins)
        mine, theirs = dict(self.printed), dict(other.printed)
        if other.flat is self.flat:
            moved = itertools.compress(itertools.count(), map(operator.is_not, self.raw, other.raw))
            indices = sorted({*moved, *mine, *theirs})
            before, after = self._slot_entries(indices, mine), other._slot_entries(indices, theirs)
        else:  # each of other's slots paired with this one's of the same parts (or with none, past the end)
            size = len(self.raw)
            places = list(map(dict(zip(self.flat.parts, range(size))).get, other.flat.parts, itertools.repeat(size)))
            alike = list(itertools.compress(itertools.count(), map(
                operator.is_, map([*self.raw, _UNPRINTED].__getitem__, places), other.raw)))
            # (a printed slot holds None, as an empty buffer's does: one left in gives no entry)
            left, right = set(map(places.__getitem__, alike)).difference(mine), set(alike).difference(theirs)
            before = self._slot_entries(itertools.filterfalse(left.__contains__, range(size)), mine, worded=False)
            after = other._slot_entries(itertools.filterfalse(right.__contains__, range(len(other.raw))), theirs,
                                        worded=False)
        before.update(self.extra)
        after.update(other.extra)
        return before, after

    # the mapping's reads go to the dict of entries at once (Mapping's own would call
    # ``__getitem__`` per key: a state with a difference is compared entry by entry)
    def __getitem__(self, key: tuple[str, str]) -> Any:
        return self.entries()[key]

    def __contains__(self, key: object) -> bool:
        return key in self.entries()

    def get(self, key: tuple[str, str], default: Any = None) -> Any:
        return self.entries().get(key, default)

    def keys(self) -> KeysView[tuple[str, str]]:
        return self.entries().keys()

    def items(self) -> ItemsView[tuple[str, str], Any]:
        return self.entries().items()

    def values(self) -> ValuesView[Any]:
        return self.entries().values()

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return iter(self.entries())

    def __len__(self) -> int:
        return len(self.entries())

    def __bool__(self) -> bool:  # whether there are entries, without making them
        return bool(self.printed or self.extra) or "attribute" in map(_WHAT, self.flat.parts)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ModuleState):
            return self.same(other)
        return self.entries() == other if isinstance(other, Mapping) else NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"ModuleState({self.entries()!r})"


#: a slot :class:`ModuleState` did not print
_UNPRINTED: Any = object()
#: the exact types whose values a state keeps as they are (immutable; ``bool`` and ``float``
#: get their prints only when a dict of entries is made)
_IMMUTABLE = AS_IS | {bool, float}


def module_state(modules: Iterable[tuple[str, torch.nn.Module]], store: Store,
                 written: Iterable[GlobalRef] = (), *,
                 attributes_of: Iterable[tuple[str, torch.nn.Module]] = (),
                 buffers: Iterable[tuple[str, torch.nn.Module, str]] = (),
                 reach: Reach | None = None, memo: list[Any] | None = None) -> ModuleState:
    """Every buffer (printed) and attribute (shallow print and value) of each module, and the
    globals the region writes, keyed by (what, subject) with the subjects findings use.

    ``attributes_of`` adds modules whose own attributes only are compared (not their buffers
    or submodules), ``buffers`` single buffers ``(module name, module, buffer name)``.  With
    the ``reach`` the modules belong to, their layout is cached with it (a record reads the
    same modules three times per invocation, and every invocation of a layer reads the same);
    ``memo``, a list the caller keeps, holds the layout last found for the same tuples of modules.
    What is read is kept as :class:`ModuleState` describes.
    """
    if not modules and not attributes_of and not buffers and not written:
        return _NO_STATE  # a region of plain functions: nothing to read (three times an invocation)
    # one object held by many modules (a transformers config on every layer) is printed once
    printed: dict[int, Any] = {}

    def entry(value: Any) -> tuple[Any, Any]:
        """The entry of a value of a type a state does not keep as it is (see ``_IMMUTABLE``)."""
        if issubclass(type(value), (int, str)):  # an enum's member: immutable, compared by ==
            return value, value
        key = id(value)
        if key not in printed:
            printed[key] = shallow(value)
        return printed[key], _kept(value)

    pairs, own = tuple(modules), tuple(attributes_of)
    flat, dicts = _state_layout(pairs, reach, attributes_of=own, memo=memo)
    try:
        values = _read(flat, dicts)
    except KeyError:  # a buffer's name replaced by another: lay the modules out again
        flat, dicts = _state_layout(pairs, reach, stale=True, attributes_of=own)
        values = _read(flat, dicts)
    types = list(map(type, values))
    typed = flat.typed
    if typed is None or typed[0] != types:  # a slot holds a value of another type than at the last read
        typed = flat.typed = (types, [index for index, kind in enumerate(types) if kind not in _IMMUTABLE])
    entries: list[tuple[int, Any]] = []
    parts, tuples = flat.parts, flat.tuples
    for index in typed[1]:
        value = values[index]
        values[index] = None  # kept as its entry only (a buffer's tensor is not held)
        if parts[index][0] == "attribute":
            if type(value) is tuple:
                known = tuples.get(index)
                if known is not None and known[0] is value:
                    entries.append(known[1])
                    continue
                if all(map(AS_IS.__contains__, map(type, value))):
                    # a tuple of ints and strings (a conv's kernel_size, stride, padding) is immutable
                    # through and through: itself, tagged so as to equal no other print
                    known = tuples[index] = (value, (index, (("tuple", value), value)))
                    entries.append(known[1])
                    continue
            entries.append((index, entry(value)))
        elif value is not None:
            entries.append((index, print_buffer(value, store)))
    extra: dict[tuple[str, str], Any] = {}
    for name, module, buffer_name in buffers:
        buffer = module._buffers.get(buffer_name)
        if buffer is not None:
            extra.setdefault(("buffer", buffer_subject(name, buffer_name)), print_buffer(buffer, store))
    for ref in written:
        value = ref.namespace.get(ref.name, MISSING)
        extra[("global", ref.subject)] = (shallow(value), _kept(value))
    return ModuleState(flat, values, entries, extra)


#: the state of no modules and no written globals (shared: nothing reads it but to compare)
_NO_STATE = ModuleState(_NO_SLOTS, [], [], {})
