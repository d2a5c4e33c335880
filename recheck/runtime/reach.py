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

import dis
import functools
import itertools
import types
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from recheck.findings import Subject, error_line
from recheck.runtime.fingerprints import MODULE_INTERNALS, by_identity, instance_dict, is_library, items_of, show
from recheck.runtime.rng import instance_kind

__all__ = ["GlobalRef", "ModuleRecorder", "Reach", "cell_values", "code_globals", "is_library",
           "keep_reach", "reach_of", "static_reach"]

#: exact types of values that hold no module, generator, tensor, function or state of their own
_SCALARS = frozenset({bool, int, float, complex, str, bytes, type(None)})
def _is_generator(value: Any) -> bool:
    """Whether ``value`` is a ``torch.Generator``, told by its type: ``isinstance`` would ask the
    value for its ``__class__`` (a user class may answer that, or raise) and run the hook torch
    2.14's metaclass for ``Generator`` has, a Python call for every attribute of every layer."""
    return issubclass(type(value), torch.Generator)


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
        #: values the walk could not look into, by name: why (their own code raised when read)
        self.unreadable: dict[str, str] = {}
        self._host_rng: set[str] = set()
        self._rng_scanned: set[int] = set()
        #: functions walked whose use of the host streams :attr:`host_rng` has not looked at yet
        self._rng_unscanned: list[types.FunctionType] = []
        #: functions whose closure cells were followed, for the walk and for the host streams: by
        #: function, not code (one decorator's inner code closes over every method it wraps), and
        #: held, so that an id stays theirs while the reach lives
        self._closed: dict[int, types.FunctionType] = {}
        self._rng_closed: dict[int, types.FunctionType] = {}
        self.reads: dict[tuple[int, str], GlobalRef] = {}
        self.writes: dict[tuple[int, str], GlobalRef] = {}
        self._walked: set[int] = set()
        #: the classes of the modules whose methods were walked
        self._classes: set[type] = set()
        self._anonymous = 0
        #: the modules found only by running the region (see :meth:`add_found`): ids of those in
        #: ``modules``, and the name each was given, kept while the module lives
        self._found_now: list[int] = []
        self._found_names: dict[int, tuple[str, weakref.ref]] = {}
        #: what a layer above works out from the reach and keeps while it lives, by the layer's
        #: key (``recheck.watcher.capture``'s layouts, a forward's last scope); a copy starts without
        self.kept: dict[str, Any] = {}

    def copy(self) -> Reach:
        """A reach that can grow without changing this one (which a cache may share)."""
        other = Reach()
        other.modules, other.generators, other.tensors = dict(self.modules), dict(self.generators), dict(self.tensors)
        other.objects, other.compiled, other._host_rng = dict(self.objects), list(self.compiled), set(self._host_rng)
        other.unreadable = dict(self.unreadable)
        other._rng_scanned, other._rng_unscanned = set(self._rng_scanned), list(self._rng_unscanned)
        other.reads, other.writes, other._walked = dict(self.reads), dict(self.writes), set(self._walked)
        other._classes = set(self._classes)
        other._closed, other._rng_closed = dict(self._closed), dict(self._rng_closed)
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
            name = f"{prefix}.{sub_name}" if prefix and sub_name else prefix or sub_name
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

    def add_found(self, module: torch.nn.Module) -> None:
        """Add a module found only by running the region (made in its forward, or reached through
        what is not walked), under the name it was given when first found, named alike while it
        lives.  Held until :meth:`let_go_of_found` when first found; found again by a later
        invocation, alive since, it was not made by a forward (a global the walk does not see, a
        plain object's attribute) and stays, with what a layer above keeps of the reach."""
        key = id(module)
        if key in self.modules:
            return
        known = self._found_names.get(key)
        if known is not None:
            self.add_module(known[0], module)
            return
        names = self._found_names
        names[key] = (self.name_unknown(module), weakref.ref(module, lambda _: names.pop(key, None)))
        self._found_now += [id(sub) for _, sub in self.add_module(names[key][0], module)]

    def let_go_of_found(self) -> None:
        """Drop the modules found by running the region, and what a layer above keeps of them
        (an invocation is done: a module its forward made must not live as long as the reach)."""
        if self._found_now:
            for key in self._found_now:
                self.modules.pop(key, None)
            self._found_now = []
            self.kept.clear()

    def _scan_attributes(self, name: str, module: torch.nn.Module) -> None:
        # torch's own bookkeeping (parameter dicts, hooks) holds no generator: the rest is asked
        state = vars(module)
        for attr in list(itertools.filterfalse(MODULE_INTERNALS.__contains__, state)):
            value = state[attr]
            if _is_generator(value):  # (a module's own dicts and flags without torch's hook)
                self.add_generator(f"{name}.{attr}" if name else f"self.{attr}", value)

    def _walk_class(self, cls: type) -> None:
        if cls in self._classes:  # (a model's layers are a few classes, many times over)
            return
        self._classes.add(cls)
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
        """Record the globals ``function`` reads and writes, following same-module calls.

        Note:
            A code object is read once, but the closure cells of every function made from it are
            followed: a library's decorator (``deprecate_kwarg``, a kernel hub's forward) is one
            inner code shared by every method it wraps, each closing over another original.
        """
        code = function.__code__
        if id(code) not in self._walked:
            self._walked.add(id(code))
            if not self._walk_code(function):
                return
        elif not function.__closure__ or is_library(function.__globals__.get("__name__")):
            return
        if function.__closure__ and id(function) not in self._closed:
            self._closed[id(function)] = function
            for cell_name, cell in zip(code.co_freevars, function.__closure__):
                contents = _cell_value(cell)
                if contents is not _EMPTY_CELL:
                    self.add_value(cell_name, contents)

    def _walk_code(self, function: types.FunctionType) -> bool:
        """Record the globals ``function``'s code reads and writes (False: library code, not walked)."""
        namespace = function.__globals__
        module_name = namespace.get("__name__", "?")
        if is_library(module_name):
            return False
        reads, writes = code_globals(function.__code__)
        for name in writes:
            self.writes.setdefault((id(namespace), name), GlobalRef(namespace, module_name, name))
        for name, attr in code_module_attributes(function.__code__):
            module = namespace.get(name)
            if isinstance(module, types.ModuleType) and not is_library(module.__name__):
                self._add_module_attribute(module, attr)
        self._rng_unscanned.append(function)
        for name in reads:
            if name not in namespace:
                continue  # a builtin
            value = namespace[name]
            kind = type(value)  # (not isinstance: it asks a value for its __class__, which a user class may answer)
            if issubclass(kind, (types.ModuleType, type)):
                continue
            if kind is types.FunctionType:
                if value.__globals__ is namespace:
                    self.walk_function(value)
                continue
            self.reads.setdefault((id(namespace), name), GlobalRef(namespace, module_name, name))
            self.add_value(name, value)
        return True

    @property
    def host_rng(self) -> set[str]:
        """The host RNG streams the code walked refers to (``"Python random"``, ``"numpy global
        RNG"``), following the functions it names into other modules too.  Looked for when asked,
        not while walking: ``watch()`` asks for a region's, ``check_step``'s snapshot keeps both
        streams whatever the step's code names, and never asks."""
        while self._rng_unscanned:
            self._scan_host_rng(self._rng_unscanned.pop())
        return self._host_rng

    def _scan_host_rng(self, function: types.FunctionType) -> None:
        """Note whether ``function`` (or a function it names, in any module) uses Python's or
        numpy's global RNG: the ``random`` or ``numpy`` module, or a function taken from them.
        Its code is looked at once, the cells of each function made from it (as in the walk)."""
        if len(self._host_rng) == 2:
            return
        values: list[Any] = []
        if id(function.__code__) not in self._rng_scanned:
            self._rng_scanned.add(id(function.__code__))
            namespace = function.__globals__
            values = [namespace.get(name) for name in code_globals(function.__code__)[0]]
        if function.__closure__ and id(function) not in self._rng_closed:
            self._rng_closed[id(function)] = function
            values += cell_values(function)
        for value in values:
            try:
                stream = _host_stream(value)
            except Exception:  # noqa: BLE001 - a value whose class raises on lookups draws from no host stream it names
                continue
            if stream is not None:
                self._host_rng.add(stream)
            elif type(value) is types.FunctionType and not is_library(value.__module__):
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
        """Take modules, generators and functions out of a value (closure cell, argument).

        A value whose own code raises when it is looked into (a ``__getattribute__``, a
        ``__dict__`` property, a container's overridden methods) is not looked into: it is named
        in :attr:`unreadable`, and the rest of the walk goes on.
        """
        if type(value) in _SCALARS or type(value) is type:  # (most of a layer's cells and globals)
            return
        try:
            self._add_value(name, value, depth)
        except Exception as exc:  # noqa: BLE001 - the user's object raised; named, never raised into the run
            self.unreadable.setdefault(name, error_line(exc))

    def _add_value(self, name: str, value: Any, depth: int) -> None:
        kind = type(value)  # (told by its type: ``isinstance`` would ask the value for ``__class__``)
        if issubclass(kind, torch.nn.Module):
            if id(value) not in self.modules:
                self.add_module(name, value)
        elif issubclass(kind, torch.Generator):
            self.add_generator(name, value)
        elif issubclass(kind, torch.Tensor):
            if all(t is not value for t in self.tensors.values()):
                self.tensors[name] = value
        elif kind is types.FunctionType:
            original = getattr(value, "_torchdynamo_orig_callable", None)
            if original is not None:
                self.compiled.append(f"{name} (torch.compile of {getattr(original, '__qualname__', original)!s})")
                self.add_value(name, original, depth)
                return
            self.walk_function(value)
        elif kind is types.MethodType:
            self.add_value(name, value.__self__, depth)
            self.add_value(name, value.__func__, depth)
        elif issubclass(kind, functools.partial):
            self.add_value(name, value.func, depth)
            for index, arg in enumerate(value.args):
                self.add_value(f"{name}.args[{index}]", arg, depth)
            for key, arg in value.keywords.items():
                self.add_value(f"{name}.keywords[{key!r}]", arg, depth)
        elif depth > 0 and issubclass(kind, (list, tuple)):
            for index, item in enumerate(items_of(value, kind)[1]):
                self.add_value(f"{name}[{index}]", item, depth - 1)
        elif depth > 0 and issubclass(kind, dict):
            for key, item in items_of(value, kind)[1]:
                self.add_value(f"{name}[{show(key, 40)}]", item, depth - 1)  # (a key's repr that raises: its type)
        elif kind.__module__.startswith("torch.distributed.pipelining."):
            # a schedule or a stage: the step runs its stages' modules, and every rank runs the step
            if all(o is not value for o in self.objects.values()):
                self.objects[name] = value
            for index, stage in enumerate(getattr(value, "_stages", None) or [getattr(value, "_stage", value)]):
                submodule = getattr(stage, "submod", None)
                if isinstance(submodule, torch.nn.Module) and id(submodule) not in self.modules:
                    self.add_module(f"{name}.stage{index}", submodule)
        elif _is_plain_object(value) or instance_kind(value) is not None:
            if all(o is not value for o in self.objects.values()):
                self.objects[name] = value


def _host_stream(value: Any) -> str | None:
    """``"Python random"`` or ``"numpy global RNG"`` when ``value`` draws from that global stream.
    Told by its type, never by asking the value (a user class's attribute hooks may raise)."""
    kind = type(value)
    if kind in _SCALARS:
        return None
    if issubclass(kind, types.ModuleType):
        name = value.__name__
    elif issubclass(kind, type) or is_library(kind.__module__) or kind.__getattribute__ is object.__getattribute__:
        # a class, a function, a builtin, an object without attribute hooks: asking runs none of its code
        name = getattr(value, "__module__", None)
        if not isinstance(name, str):
            owner = getattr(value, "__self__", None)  # random.random is a method of random._inst
            name = type(owner).__module__ if owner is not None else None
    else:  # an object whose class answers attribute lookups itself: its class's module, unasked
        name = kind.__module__
    if name == "random" or (isinstance(name, str) and name.startswith("_random")):
        return "Python random"
    if isinstance(name, str) and (name == "numpy" or name.startswith("numpy.random")):
        return "numpy global RNG"
    return None


def _is_plain_object(value: Any) -> bool:
    """An instance of a user class that keeps state in its ``__dict__`` (a KV cache, a tracker)."""
    kind = type(value)
    return (not issubclass(kind, (type, types.ModuleType, torch.nn.Module)) and not by_identity(value, kind)
            and not is_library(kind.__module__) and instance_dict(value) is not None)


def static_reach(fn: Callable[..., Any], args: tuple, kwargs: dict, walked: Reach | None = None) -> Reach:
    """Everything found from the callable and its arguments before anything runs (``walked``: what
    the callable alone reaches, found already: a copy of it is extended, the callable not walked again)."""
    reach = _root_reach(fn) if walked is None else walked.copy()
    for index, arg in enumerate(args):
        reach.add_value(f"args[{index}]", arg)
    for key, arg in kwargs.items():
        reach.add_value(f"kwargs[{key!r}]", arg)
    for name in [n for n in reach.tensors if n.startswith(("args[", "kwargs["))]:
        del reach.tensors[name]  # inputs are the checker's own business
    return reach


def _root_reach(root: Any) -> Reach:
    """What the checkpointed callable alone reaches."""
    reach = Reach()
    if isinstance(root, torch.nn.Module):
        reach.add_module("", root)
    elif isinstance(root, types.MethodType) and isinstance(root.__self__, torch.nn.Module):
        reach.add_module("", root.__self__)
        reach.add_value("self", root.__func__)
    elif isinstance(root, functools.partial):
        # partial(forward, self), as transformers does; partial(super().__call__), as 5.16 did
        first = root.args[0] if root.args else getattr(root.func, "__self__", None)
        if isinstance(first, torch.nn.Module):
            reach.add_module("", first)
        reach.add_value("partial", root)
    else:
        call = getattr(type(root), "__call__", None)
        if not isinstance(root, types.FunctionType) and isinstance(call, types.FunctionType):
            reach.walk_function(call)
            for attr, value in vars(root).items() if hasattr(root, "__dict__") else ():
                reach.add_value(attr, value)
        reach.add_value("fn", root)
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

def reach_of(function: Any, cache: dict[Any, tuple[Reach, tuple]]) -> Reach:
    """The static reach of a checkpointed callable, cached by code object and bound objects.

    Walking a region's code is the costly part of the reach, and every invocation of a
    region runs the same code on the same modules.  The key is made of object ids: ``cache``,
    which lives as long as the outermost ``watch()`` block and no longer, holds the reach and
    the objects its key names, so an id cannot be reused meanwhile.
    """
    key, holders = _cache_key(function)
    if key is None:
        return static_reach(function, (), {})
    entry = cache.get(key)
    if entry is not None:
        return entry[0]
    if not key[-1]:
        reach = static_reach(function, (), {})
    else:
        # regions that differ only by the numbers and strings their closures hold (the first and
        # last index of a segment of timm's checkpoint_seq) reach the same: walked once, each
        # region given a copy (what a layer above keeps with a reach is one region's)
        walked = cache.get(key[:-1])
        if walked is None:
            walked = cache[key[:-1]] = (static_reach(function, (), {}), holders)
            walked[0].host_rng  # looked for once, not by every copy
        reach = walked[0].copy()
    cache[key] = (reach, holders)
    return reach


def keep_reach(function: Any, reach: Reach, cache: dict[Any, tuple[Reach, tuple]]) -> None:
    """Give ``cache`` (:func:`reach_of`'s) ``reach`` as ``function``'s, walked already by the
    caller (``check()`` walks its region for its snapshot), unless it holds one."""
    key, holders = _cache_key(function)
    if key is not None:
        cache.setdefault(key, (reach, holders))


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


def _cache_key(function: Any) -> tuple[Any, tuple]:
    holders: list[Any] = []
    seen = 0
    while seen < 8:
        seen += 1
        # a module first: a missing attribute of a module is asked of its __getattr__, which raises
        if isinstance(function, torch.nn.Module):
            holders.append(function)
            return (*map(id, holders), ()), tuple(holders)
        if isinstance(function, functools.partial):  # not by its attributes: a Mock has every one
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
    return (id(function.__globals__), *map(id, holders), tuple(scalars)), tuple(holders)
