"""What a region can touch: modules, explicit generators, and module globals.

:class:`Reach` accumulates what is found; :func:`static_reach` fills it from the
callable itself (an ``nn.Module``, bound ``self``, ``functools.partial`` arguments,
closure cells, globals its code reads) and its arguments (generators; tensors held
outside modules, such as a ``partial``'s weight, land in ``Reach.tensors``); :class:`ModuleRecorder`
adds every module whose ``forward`` runs while it is active (a global forward
pre-hook), calling ``on_new`` before that module's forward executes.

Globals are found by walking code objects: ``LOAD_GLOBAL`` names are *read*,
``STORE_GLOBAL`` / ``DELETE_GLOBAL`` names are *written*, through nested code
objects and through functions of the same module that the code names.  The
methods of reached modules whose classes live outside torch are walked too.
"""

from __future__ import annotations

import collections
import dis
import functools
import operator
import sys
import types
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import torch

from recheck.findings import Subject
from recheck.runtime.rng import instance_kind

__all__ = ["GlobalRef", "ModuleRecorder", "Reach", "ReachCache", "cell_values", "code_globals", "dereferenced",
           "is_library", "put_to_sleep", "reach_of", "static_reach"]

_LIBRARY_PREFIXES = ("torch", "numpy", "functools", "logging", "random", "typing", "builtins",
                     "collections", "contextlib", "warnings", "abc", "enum", "dataclasses")

#: exact types of module attributes that cannot be a ``torch.Generator``
_NOT_GENERATORS = frozenset({dict, collections.OrderedDict, bool, int, float, str, tuple, list, set, type(None),
                              types.FunctionType, torch.dtype, torch.device, torch.Tensor, torch.nn.Parameter})


def _is_generator(value: Any) -> bool:
    """``isinstance(value, torch.Generator)``, without torch's ``isinstance`` hook for the types
    that never are one (torch 2.14 gives ``Generator`` a metaclass whose hook is a Python call:
    a ``partial`` of transformers' layers binds a tensor, a tuple and flags, asked every invocation)."""
    return type(value) not in _NOT_GENERATORS and isinstance(value, torch.Generator)


@dataclass(frozen=True)
class GlobalRef:
    """A module-level global: ``namespace`` is the module's globals dict."""

    namespace: dict = field(compare=False, hash=False, repr=False)
    module: str
    name: str

    @property
    def display(self) -> str:
        """``module.NAME``."""
        return f"{self.module}.{self.name}"

    @functools.cached_property  # (a frozen dataclass's own __dict__: read four times a call)
    def subject(self) -> Subject:
        """How findings and state keys name it: ``global `module.NAME```."""
        return Subject("global", self.name, owner=self.module)


@functools.lru_cache(maxsize=8192)
def code_module_attributes(code: types.CodeType) -> frozenset[tuple[str, str]]:
    """``(global, attribute)`` pairs a code object (and the code nested in it) reads as
    ``name.attr`` on a global: state kept in another module (``parallel_state._TRACKER``,
    ``config.SCALE``) is reached this way.  Which globals are modules is decided by the caller.
    """
    pairs: set[tuple[str, str]] = set()
    previous = None
    for instruction in dis.get_instructions(code):
        if (instruction.opname in ("LOAD_ATTR", "LOAD_METHOD", "STORE_ATTR") and previous is not None
                and previous.opname == "LOAD_GLOBAL"):
            pairs.add((str(previous.argval), str(instruction.argval)))
        previous = instruction
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            pairs |= code_module_attributes(const)
    return frozenset(pairs)


@functools.lru_cache(maxsize=8192)
def code_globals(code: types.CodeType) -> tuple[frozenset[str], frozenset[str]]:
    """Global names a code object (and the code nested in it) reads and writes.

    Code objects are immutable, so the answer is cached per code object: watch() asks
    again for every region of every block.  ``LOAD_NAME`` counts as a read: a class
    statement inside the function loads the globals its body uses that way.
    """
    reads: set[str] = set()
    writes: set[str] = set()
    for instruction in dis.get_instructions(code):
        if instruction.opname in ("LOAD_GLOBAL", "LOAD_NAME"):
            reads.add(str(instruction.argval))
        elif instruction.opname in ("STORE_GLOBAL", "DELETE_GLOBAL"):
            writes.add(str(instruction.argval))
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            nested_reads, nested_writes = code_globals(const)
            reads |= nested_reads
            writes |= nested_writes
    return frozenset(reads), frozenset(writes)


#: The standard library's top-level modules: their globals (``sys.modules``, ``os.environ``) are
#: the interpreter's, not state a region keeps.
_STDLIB = frozenset(getattr(sys, "stdlib_module_names", ()))


def is_library(module_name: str | None) -> bool:
    """Whether ``module_name`` (a ``__module__``) is torch's, numpy's or the standard library's:
    code a region runs there keeps no state of the project's (its globals, its classes'
    attributes), and objects of its classes are no plain objects of the project's."""
    top = (module_name or "").split(".")[0]
    return top in _LIBRARY_PREFIXES or (top in _STDLIB and top != "__main__")


class Reach:
    """Modules, generators and globals reachable from a region, with display names."""

    def __init__(self) -> None:
        self.modules: dict[int, tuple[str, torch.nn.Module]] = {}
        self.generators: dict[str, torch.Generator] = {}
        self.tensors: dict[str, torch.Tensor] = {}  # outside modules: closures, partials, globals
        #: plain Python objects whose attributes a region can change (a cache passed in, a tracker),
        #: and RNG instances it can draw from (``random.Random``, numpy's; see ``rng.instance_kind``)
        self.objects: dict[str, Any] = {}
        #: callables and modules made by ``torch.compile`` that the region or step reaches
        self.compiled: list[str] = []
        #: the host RNG streams the code refers to (``"Python random"``, ``"numpy global RNG"``),
        #: following functions into other modules too
        self.host_rng: set[str] = set()
        #: (namespace, name, identities) of the globals whose objects (modules, generators,
        #: tensors, also inside containers) the reach took in: it describes the region only while
        #: each name still holds those very objects
        self.bound: list[tuple[dict, str, Any]] = []
        self._rng_scanned: set[int] = set()
        self.reads: dict[tuple[int, str], GlobalRef] = {}
        self.writes: dict[tuple[int, str], GlobalRef] = {}
        self._walked: set[int] = set()
        self._anonymous = 0
        #: what a layer above works out from the reach and keeps with it, by the layer's key
        #: (``recheck.watcher.capture``'s layouts); a copy starts without.  A dormant reach
        #: carries it to the reach it revives (see :class:`_Dormant`), so what is in it must
        #: hold none of the reach's objects
        self.derived: dict[str, Any] = {}
        #: what a layer above keeps with this reach while it lives (a forward's scope, last
        #: found): unlike ``derived`` it may hold the reach's objects, so a copy and a revived
        #: reach start without
        self.kept: dict[str, Any] = {}
        #: where the reach was revived from a dormant one: the pairs of its modules as revived,
        #: which other reaches revived from the same modules share while this one lives
        self.revived_modules: _Revived | None = None

    def copy(self) -> Reach:
        """A reach that can grow without changing this one (which a cache may share)."""
        other = Reach()
        other.modules, other.generators, other.tensors = dict(self.modules), dict(self.generators), dict(self.tensors)
        other.objects, other.compiled, other.host_rng = dict(self.objects), list(self.compiled), set(self.host_rng)
        other.bound, other._rng_scanned = list(self.bound), set(self._rng_scanned)
        other.reads, other.writes, other._walked = dict(self.reads), dict(self.writes), set(self._walked)
        other._anonymous = self._anonymous
        return other

    # modules ----------------------------------------------------------------------------------
    def add_module(self, prefix: str, module: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
        """Add ``module`` and its submodules; ``prefix`` is its dotted name ("" for the root).

        Returns the (name, module) pairs that were new.
        """
        added = []
        for sub_name, sub in module.named_modules(remove_duplicate=True):
            if id(sub) in self.modules:
                continue
            name = ".".join(p for p in (prefix, sub_name) if p)
            if type(sub).__name__ == "OptimizedModule" and type(sub).__module__.startswith("torch._dynamo"):
                self.compiled.append(f"{name or type(sub._orig_mod).__name__} (torch.compile of "
                                     f"{type(sub._orig_mod).__qualname__})")
            self.modules[id(sub)] = (name, sub)
            added.append((name, sub))
            self._walk_class(type(sub))
            self._scan_attributes(name, sub)
        return added

    def name_unknown(self, module: torch.nn.Module) -> str:
        """A display name (``Linear#1``) for a module found only by running the region."""
        self._anonymous += 1
        return f"{type(module).__name__}#{self._anonymous}"

    def _scan_attributes(self, name: str, module: torch.nn.Module) -> None:
        for attr, value in vars(module).items():
            if _is_generator(value):  # (a module's own dicts and flags without torch's hook)
                self.add_generator(f"{name}.{attr}" if name else f"self.{attr}", value)

    def _walk_class(self, cls: type) -> None:
        for klass in cls.__mro__:
            if is_library(klass.__module__):
                continue
            for value in vars(klass).values():
                function = value.__func__ if isinstance(value, (staticmethod, classmethod)) else value
                if isinstance(function, types.FunctionType):
                    self.walk_function(function)

    # generators -------------------------------------------------------------------------------
    def add_generator(self, name: str, generator: torch.Generator) -> None:
        """Track ``generator`` under ``name`` unless it is tracked already."""
        if all(g is not generator for g in self.generators.values()):
            self.generators[name] = generator

    # code -------------------------------------------------------------------------------------
    def walk_function(self, function: types.FunctionType) -> None:
        """Record the globals ``function`` reads and writes, following same-module calls."""
        if id(function.__code__) in self._walked:
            return
        self._walked.add(id(function.__code__))
        namespace = function.__globals__
        module_name = namespace.get("__name__", "?")
        if is_library(module_name):
            return
        reads, writes = code_globals(function.__code__)
        for name in writes:
            self.writes.setdefault((id(namespace), name), GlobalRef(namespace, module_name, name))
        for name, attr in code_module_attributes(function.__code__):
            module = namespace.get(name)
            if isinstance(module, types.ModuleType) and not is_library(module.__name__):
                self._add_module_attribute(module, attr)
        self._scan_host_rng(function)
        for name in reads:
            if name not in namespace:
                continue  # a builtin
            value = namespace[name]
            if isinstance(value, (types.ModuleType, type)):
                continue
            if isinstance(value, types.FunctionType):
                if value.__globals__ is namespace:
                    self.walk_function(value)
                continue
            self.reads.setdefault((id(namespace), name), GlobalRef(namespace, module_name, name))
            if not isinstance(value, (int, float, str, bytes, bool, type(None))) and not any(
                    bound is namespace and taken == name for bound, taken, _ in self.bound):
                # (once: another function of the region may read it too, and every watch() block
                # checks what the reach took)
                self.bound.append((namespace, name, _identities(value)))
            self.add_value(name, value)
        for cell_name, cell in zip(function.__code__.co_freevars, function.__closure__ or ()):
            contents = _cell_value(cell)
            if contents is not _EMPTY_CELL:
                self.add_value(cell_name, contents)

    def still_bound(self, found: dict[tuple[int, str], Any] | None = None) -> bool:
        """Whether every global the reach took objects from still holds the same object.

        ``found``: what each global holds now, by namespace and name, filled as they are read
        (a block's :class:`ReachCache`: the reaches of a model's layers take the same globals).
        """
        for namespace, name, taken in self.bound:
            if found is None:
                now = _identities(namespace.get(name, MISSING_VALUE))
            else:
                key = (id(namespace), name)
                now = found.get(key)
                if now is None:
                    now = found[key] = _identities(namespace.get(name, MISSING_VALUE))
            if now != taken:
                return False
        return True

    def _scan_host_rng(self, function: types.FunctionType) -> None:
        """Note whether ``function`` (or a function it names, in any module) uses Python's or
        numpy's global RNG: the ``random`` or ``numpy`` module, or a function taken from them."""
        if id(function.__code__) in self._rng_scanned or len(self.host_rng) == 2:
            return
        self._rng_scanned.add(id(function.__code__))
        namespace = function.__globals__
        for name in code_globals(function.__code__)[0]:
            value = namespace.get(name)
            stream = _host_stream(value)
            if stream is not None:
                self.host_rng.add(stream)
            elif isinstance(value, types.FunctionType) and not is_library(value.__module__):
                self._scan_host_rng(value)
        for value in cell_values(function):
            stream = _host_stream(value)
            if stream is not None:
                self.host_rng.add(stream)
            elif isinstance(value, types.FunctionType) and not is_library(value.__module__):
                self._scan_host_rng(value)

    def _add_module_attribute(self, module: types.ModuleType, attr: str) -> None:
        """``module.attr`` read by the region: a global of another module (its functions are walked)."""
        namespace = vars(module)
        if attr not in namespace:
            return
        value = namespace[attr]
        if isinstance(value, types.FunctionType):
            self.walk_function(value)  # a helper there may keep state in its own module
            return
        if isinstance(value, (types.ModuleType, type)) or callable(value) and not hasattr(value, "__dict__"):
            return
        self.reads.setdefault((id(namespace), attr), GlobalRef(namespace, module.__name__, attr))
        self.add_value(f"{module.__name__}.{attr}", value)

    def add_value(self, name: str, value: Any, depth: int = 2) -> None:
        """Take modules, generators and functions out of a value (closure cell, argument)."""
        if isinstance(value, torch.nn.Module):
            if id(value) not in self.modules:
                self.add_module(name, value)
        elif isinstance(value, torch.Generator):
            self.add_generator(name, value)
        elif isinstance(value, torch.Tensor):
            if all(t is not value for t in self.tensors.values()):
                self.tensors[name] = value
        elif isinstance(value, types.FunctionType):
            original = getattr(value, "_torchdynamo_orig_callable", None)
            if original is not None:
                self.compiled.append(f"{name} (torch.compile of {getattr(original, '__qualname__', original)!s})")
                self.add_value(name, original, depth)
                return
            self.walk_function(value)
        elif isinstance(value, types.MethodType):
            self.add_value(name, value.__self__, depth)
            self.add_value(name, value.__func__, depth)
        elif isinstance(value, functools.partial):
            self.add_value(name, value.func, depth)
            for index, arg in enumerate(value.args):
                self.add_value(f"{name}.args[{index}]", arg, depth)
            for key, arg in value.keywords.items():
                self.add_value(f"{name}.keywords[{key!r}]", arg, depth)
        elif depth > 0 and isinstance(value, (list, tuple)):
            for index, item in enumerate(value):
                self.add_value(f"{name}[{index}]", item, depth - 1)
        elif depth > 0 and isinstance(value, dict):
            for key, item in value.items():
                self.add_value(f"{name}[{key!r}]", item, depth - 1)
        elif _is_plain_object(value) or instance_kind(value) is not None:
            if all(o is not value for o in self.objects.values()):
                self.objects[name] = value


#: stands for a global that is gone (never the object a reach took in)
MISSING_VALUE = object()


def _identities(value: Any, depth: int = 2) -> Any:
    """The ids of ``value`` and of what :meth:`Reach.add_value` walks into (two levels of
    containers): equal exactly while the same objects are held at the same places.  An item
    that is no container is its id without a call (every ``watch()`` block checks the globals
    its reaches took: transformers' ``ACT2FN`` holds 24 classes and tuples)."""
    if depth <= 0:
        return id(value)
    inner = depth - 1
    if isinstance(value, (list, tuple)):
        return (id(value), tuple([_identities(v, inner) if inner and isinstance(v, _NESTED) else id(v)
                                  for v in value]))
    if isinstance(value, dict):
        return (id(value), tuple([(k, _identities(v, inner) if inner and isinstance(v, _NESTED) else id(v))
                                  for k, v in dict.items(value) if isinstance(k, (str, int))]))
    return id(value)


#: the containers :func:`_identities` looks into
_NESTED = (list, tuple, dict)


def _host_stream(value: Any) -> str | None:
    """``"Python random"`` or ``"numpy global RNG"`` when ``value`` draws from that global stream."""
    name = value.__name__ if isinstance(value, types.ModuleType) else getattr(value, "__module__", None)
    if not isinstance(name, str):
        owner = getattr(value, "__self__", None)  # random.random is a method of random._inst
        name = type(owner).__module__ if owner is not None else None
    if name == "random" or (isinstance(name, str) and name.startswith("_random")):
        return "Python random"
    if isinstance(name, str) and (name == "numpy" or name.startswith("numpy.random")):
        return "numpy global RNG"
    return None


def _is_plain_object(value: Any) -> bool:
    """An instance of a user class that keeps state in its ``__dict__`` (a KV cache, a tracker)."""
    attrs = getattr(value, "__dict__", None)
    return (isinstance(attrs, dict) and not isinstance(value, (type, types.ModuleType, torch.nn.Module))
            and not callable(value) and not is_library(type(value).__module__))


def static_reach(fn: Callable[..., Any], args: tuple, kwargs: dict) -> Reach:
    """Everything found from the callable and its arguments before anything runs."""
    reach = Reach()
    root: Any = fn
    if isinstance(root, torch.nn.Module):
        reach.add_module("", root)
    elif isinstance(root, types.MethodType) and isinstance(root.__self__, torch.nn.Module):
        reach.add_module("", root.__self__)
        reach.add_value("self", root.__func__)
    elif isinstance(root, functools.partial):
        first = root.args[0] if root.args else None
        if isinstance(first, torch.nn.Module):  # partial(forward, self), as HF does
            reach.add_module("", first)
        reach.add_value("partial", root)
    else:
        call = getattr(type(root), "__call__", None)
        if not isinstance(root, types.FunctionType) and isinstance(call, types.FunctionType):
            reach.walk_function(call)
            for attr, value in vars(root).items() if hasattr(root, "__dict__") else ():
                reach.add_value(attr, value)
        reach.add_value("fn", root)
    for index, arg in enumerate(args):
        reach.add_value(f"args[{index}]", arg)
    for key, arg in kwargs.items():
        reach.add_value(f"kwargs[{key!r}]", arg)
    for name in [n for n in reach.tensors if n.startswith(("args[", "kwargs["))]:
        del reach.tensors[name]  # inputs are the checker's own business
    return reach


class ModuleRecorder:
    """Record modules whose forward runs while active; ``on_new(module)`` fires before it runs."""

    def __init__(self, on_call: Callable[[torch.nn.Module], None]) -> None:
        self.on_call = on_call
        self._handle: Any = None

    def __enter__(self) -> ModuleRecorder:
        register = torch.nn.modules.module.register_module_forward_pre_hook
        self._handle = register(lambda module, _args: self.on_call(module))
        return self

    def __exit__(self, *exc: Any) -> None:
        self._handle.remove()


# -- the reach of a region, kept while it still describes it ---------------------------------

class ReachCache(dict):
    """A block's reaches by cache key (see :func:`reach_of`), and ``bound``: what the globals
    the reaches revived in the block took hold now (see :meth:`Reach.still_bound`), read once
    a block however many layers' regions take them (transformers' ``ACT2FN``: 24 entries)."""

    __slots__ = ("bound",)

    def __init__(self) -> None:
        super().__init__()
        self.bound: dict[tuple[int, str], Any] = {}


def reach_of(function: Any, cache: dict[Any, tuple[Reach, tuple]]) -> Reach:
    """The static reach of a checkpointed callable, cached by code object and bound objects.

    Walking a region's code is the costly part of the reach, and every invocation of a
    region runs the same code on the same modules.  The key is made of object ids.  ``cache``
    (which lives as long as the outermost block) holds the reach and the objects its key
    names, so an id cannot be reused meanwhile.  Where every object the key names can be
    weakly referenced (modules, functions), the reach is also kept across ``watch()`` blocks
    (a test suite watches each test in its own block), as a :class:`_Dormant` one that holds
    its objects weakly: it is valid only while the objects its key names are alive, and it
    keeps none of them alive (a test's model is freed when the test drops it).
    """
    key, holders = _cache_key(function)
    if key is None:
        return static_reach(function, (), {})
    entry = cache.get(key)
    if entry is not None:
        return entry[0]
    lasting = _LASTING.get(key)
    if lasting is not None:
        dormant, refs = lasting
        reach = dormant.revive() if all(ref() is holder for ref, holder in zip(refs, holders)) else None
        if reach is not None and reach.still_bound(cache.bound if type(cache) is ReachCache else None):
            _LASTING.move_to_end(key)
            cache[key] = (reach, holders)
            return reach
        del _LASTING[key]
    reach = static_reach(function, (), {})
    cache[key] = (reach, holders)
    weak = _weak(holders)
    kept = _Dormant.of(reach) if weak is not None else None
    if weak is not None and kept is not None:
        _LASTING[key] = (kept, weak)
        while len(_LASTING) > _LASTING_SIZE:
            _LASTING.popitem(last=False)
    return reach


def put_to_sleep(cache: dict[Any, tuple[Reach, tuple]]) -> None:
    """Before a block's cache of reaches (see :func:`reach_of`) is dropped: make the dormant
    copy of each reach that grew while the block ran (a module found only by running the region,
    transformers' kernel wrappers, with the globals its class reads) again, so that the next
    block revives it whole instead of finding the same modules again at every block."""
    for key, (reach, _) in cache.items():
        lasting = _LASTING.get(key)
        if lasting is None:
            continue
        dormant, weak = lasting
        if dormant.live() is reach and dormant.sizes != _sizes(reach):
            fresh = _Dormant.of(reach)
            if fresh is not None:
                _LASTING[key] = (fresh, weak)


def _sizes(reach: Reach) -> tuple[int, ...]:
    """How much a reach holds (it only grows): what tells that a dormant copy of it is behind."""
    return (len(reach.modules), len(reach.generators), len(reach.tensors), len(reach.objects), len(reach.reads),
            len(reach.writes), len(reach.bound), len(reach._walked), len(reach.compiled), len(reach.host_rng))


class _Dormant:
    """A reach kept between blocks without keeping its objects alive.

    The live reach (weakly: while a block's cache holds it, it is the one returned), and a
    copy of it as it was when walked whose modules, generators, tensors and plain objects
    are weak references: revived into a new :class:`Reach` of those still alive, which starts
    from what was ``derived`` from the first (the layouts of ``recheck.watcher.capture``).
    """

    __slots__ = ("live", "template", "modules", "refs", "derived", "sizes")

    def __init__(self, reach: Reach, template: Reach, modules: _SharedModules,
                 refs: dict[str, tuple[list[Any], list[Any]]]) -> None:
        self.live, self.template, self.modules, self.refs = weakref.ref(reach), template, modules, refs
        #: how much the reach held when this copy was made (see :func:`put_to_sleep`)
        self.sizes = _sizes(reach)
        #: the live reach's ``derived`` (the same dict): what a layer above worked out, which a
        #: revived reach starts from (it holds none of the reach's objects)
        self.derived = reach.derived

    @classmethod
    def of(cls, reach: Reach) -> _Dormant | None:
        """None where something the reach holds cannot be weakly referenced."""
        try:
            modules = _SharedModules.of(reach.modules)
            refs: dict[str, tuple[list[Any], list[Any]]] = {
                what: (list(held), [weakref.ref(v) for v in held.values()])
                for what, held in (("generators", reach.generators), ("tensors", reach.tensors),
                                   ("objects", reach.objects))}
        except TypeError:
            return None
        template = reach.copy()
        template.modules, template.generators, template.tensors, template.objects = {}, {}, {}, {}
        return cls(reach, template, modules, refs)

    def revive(self) -> Reach:
        """The live reach, or a new one from the template with the objects still alive.

        An object that died is left out: nothing the region holds refers to it any more
        (what its code, closure, ``partial`` and bound ``self`` hold stays alive with them; a
        ``partial`` of transformers' checkpointed layers holds the call's tensors, which die
        with the step).
        """
        live = self.live()
        if live is not None:
            return live
        reach = self.template.copy()
        reach.revived_modules = revived = self.modules.revive()
        reach.modules = dict(revived.modules)
        found = {what: _alive(keys, refs) for what, (keys, refs) in self.refs.items()}
        reach.generators, reach.tensors, reach.objects = found["generators"], found["tensors"], found["objects"]
        reach.derived = self.derived
        self.live = weakref.ref(reach)
        return reach


class _SharedModules:
    """The modules of a dormant reach, weakly: their keys, names and weak references, shared by
    every dormant reach that holds the very same modules under the same names (the regions
    timm's ``checkpoint_seq`` makes of one model's blocks, one per segment, each reaching every
    block), and the ``(name, module)`` pairs last revived from them while a reach revived from
    them lives.  A block per step revives every region's reach in each block: the pairs are
    made once for all of them, not once per region (a tuple holding a module is one more object
    for the garbage collector's oldest generation, and objects made per region and step make
    its full collections more frequent).
    """

    __slots__ = ("keys", "names", "refs", "last", "__weakref__")

    def __init__(self, keys: list[Any], names: list[str], refs: list[Any]) -> None:
        self.keys, self.names, self.refs = keys, names, refs
        self.last: Any = None  # a weak reference to the _Revived last made, while it lives

    @classmethod
    def of(cls, modules: dict[int, tuple[str, torch.nn.Module]]) -> _SharedModules:
        """The shared modules of a reach's ``modules``, the one already kept where it holds the very
        same modules under the same names.  ``TypeError`` where one cannot be weakly referenced."""
        keys, names = list(modules), [name for name, _ in modules.values()]
        held = [module for _, module in modules.values()]
        lookup = (tuple(keys), tuple(names))
        shared = _SHARED_MODULES.get(lookup)
        if shared is not None:
            alive, all_alive = dereferenced(shared.refs)
            if all_alive and all(map(operator.is_, alive, held)):
                return shared
        shared = cls(keys, names, [weakref.ref(module) for module in held])
        _SHARED_MODULES[lookup] = shared
        return shared

    def revive(self) -> _Revived:
        """The pairs of the modules still alive (the dead are left out): those last made while
        a reach revived from them lives, else made anew."""
        last = self.last() if self.last is not None else None
        if last is not None:
            return last
        revived = _Revived(_alive(self.keys, self.refs, self.names))
        self.last = weakref.ref(revived)
        return revived


class _Revived:
    """The ``(name, module)`` pairs revived from :class:`_SharedModules`, held by every reach
    revived from them (each reach copies the dict: it may grow)."""

    __slots__ = ("modules", "__weakref__")

    def __init__(self, modules: dict[int, tuple[str, torch.nn.Module]]) -> None:
        self.modules = modules


#: the shared modules of the dormant reaches, by their keys and names (an entry goes with the
#: last dormant reach that holds it)
_SHARED_MODULES: weakref.WeakValueDictionary[tuple[tuple[Any, ...], tuple[str, ...]], _SharedModules] = \
    weakref.WeakValueDictionary()


def _alive(keys: list[Any], refs: list[Any], names: list[str] | None = None) -> dict[Any, Any]:
    """``keys`` to the objects of the weak references ``refs`` still alive, or with ``names``
    to ``(name, object)`` pairs; the dead are left out.  In C-level passes where all are alive
    (a test suite revives its reaches in every test's block)."""
    alive, all_alive = dereferenced(refs)
    values: Iterable[Any] = alive if names is None else zip(names, alive)
    if all_alive:
        return dict(zip(keys, values))
    return {key: value for key, value, one in zip(keys, values, alive) if one is not None}


def cell_values(function: Any) -> list[Any]:
    """The values of ``function``'s closure cells, in order, an empty one (a name assigned later
    in the enclosing function) left out; none for a callable without a closure.  One list made
    in C where every cell is filled (a decorated forward closes over a dozen, and a region's key
    and direct modules read them at every invocation)."""
    closure = getattr(function, "__closure__", None)
    if not closure:
        return []
    try:
        return [cell.cell_contents for cell in closure]
    except ValueError:  # an empty cell among them
        return [value for value in map(_cell_value, closure) if value is not _EMPTY_CELL]


def _cell_value(cell: Any) -> Any:
    """A closure cell's value, or :data:`_EMPTY_CELL`."""
    try:
        return cell.cell_contents
    except ValueError:
        return _EMPTY_CELL


#: what :func:`_cell_value` gives for an empty cell
_EMPTY_CELL: Any = object()


def dereferenced(refs: Iterable[Any]) -> tuple[list[Any], bool]:
    """The objects of weak references ``refs`` (None for the dead) and whether all are alive,
    in C-level passes: no object is asked for ``==`` (``None in objects`` would ask each)."""
    alive = list(map(_DEREF, refs))
    return alive, not any(map(_IS_NONE, alive))


_DEREF = weakref.ref.__call__
_IS_NONE = functools.partial(operator.is_, None)

#: reaches kept across watch() blocks, by cache key, with weak references to their objects
_LASTING: collections.OrderedDict[Any, tuple[_Dormant, tuple]] = collections.OrderedDict()
_LASTING_SIZE = 512


def _weak(holders: tuple) -> tuple | None:
    try:
        return tuple(weakref.ref(holder) for holder in holders)
    except TypeError:  # a list, a tuple or another object without weak references
        return None


def _cache_key(function: Any) -> tuple[Any, tuple]:
    holders: list[Any] = []
    seen = 0
    while seen < 8:
        seen += 1
        # a module first: a missing attribute of a module is asked of its __getattr__, which raises
        if isinstance(function, torch.nn.Module):
            holders.append(function)
            return tuple(map(id, holders)), tuple(holders)
        if hasattr(function, "func") and hasattr(function, "args"):  # functools.partial
            bound = (*function.args, *getattr(function, "keywords", {}).values())
            holders.extend(a for a in bound if isinstance(a, torch.nn.Module) or _is_generator(a))
            function = function.func
        elif hasattr(function, "__self__") and hasattr(function, "__func__"):
            holders.append(function.__self__)
            function = function.__func__
        else:
            break
    code = getattr(function, "__code__", None)
    if code is None:
        return None, ()
    scalars: list[Any] = []
    for value in cell_values(function):
        if value is None or isinstance(value, (bool, int, float, str, bytes)):
            scalars.append((type(value).__name__, value))  # by value: nothing to reach in it
            continue
        # timm's checkpoint_seq closes over a new list of the same modules each call
        holders.extend(value if isinstance(value, (list, tuple)) else (value,))
    # by identity: code objects compare equal by content, and a module imported again (a test
    # file under pytester) has equal code over another namespace; the reach keeps that namespace
    # alive (its globals), so its id is not reused while the entry exists
    holders.insert(0, code)
    return (id(function.__globals__), *map(id, holders), *scalars), tuple(holders)
