"""Other checkpoint implementations, intercepted and bypassed like torch's own.

DeepSpeed, Megatron-core and fairscale each ship their own activation checkpointing, none
of which calls ``torch.utils.checkpoint``: an ``autograd.Function`` that runs the region under
``no_grad`` in its forward and again in its backward (or, for DeepSpeed's
``non_reentrant_checkpoint``, saved-tensor hooks; for Megatron's ``CheckpointWithoutOutput``,
a grad hook of a later tensor).  Each entry point has one small adapter here, an
:class:`Adapter` that says

* where it lives (``module``, ``target``): it is patched only when its library is already
  imported (recheck never imports it), and put back ``is``-identically;
* where the region function is among the entry point's arguments, and how to call the region
  directly instead (:meth:`Adapter.direct`, the bypass ``check_step``'s twin and ``recheck
  cost`` use), returning what the entry point would have returned;
* its semantics: ``reentrant`` (forward under ``no_grad``), ``needs_input_grad``,
  ``preserves_rng``.

Where each entry point lives and its semantics are records of :data:`recheck.entry_points.TABLE`,
which the linter reads too; :data:`ADAPTERS` is derived from it.

The patched entry point hands every call to the installed hooks' :meth:`~recheck.intercept.
hooks.Interceptor.foreign`; from there on it is a :class:`~recheck.intercept.hooks.CheckpointCall`
like torch's: ``watch()`` verifies its recomputes, a bypassing interceptor calls its region.
**Adding an implementation is one record in** :data:`recheck.entry_points.TABLE` (and an adapter
class in :data:`ADAPTER_CLASSES` when the plain :class:`Adapter` does not describe it).

The functions a project lists in ``checkpoint-functions`` (``[tool.recheck]``, the linter's key:
functions that checkpoint their first argument) are intercepted the same way by
:func:`declared_adapter`.  How a function is patched (each case is held by
``tests/intercept/test_implementations.py``):

* a plain function without free variables gets its ``__code__`` swapped for a trampoline: the
  function *object* stays the same, so every reference to it is covered (names imported
  earlier with ``from lib import ckpt``, default arguments, ``functools.partial`` objects,
  attributes of other objects);
* a decorated function (``functools.wraps``: a closure with ``__wrapped__``) gets the code of
  the innermost closure-free function it wraps swapped, which its wrappers call;
* anything else (a closure without ``__wrapped__``, a callable object) is rebound where it is
  bound: its module attribute and every module global holding it.  References made before
  (partials, attributes, closures) are missed, and the installation says so.
"""

from __future__ import annotations

import functools
import os
import sys
import types
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import torch

from recheck.entry_points import TABLE, EntryPoint
from recheck.intercept.hooks import CHECKPOINT_OPTIONS

__all__ = ["ADAPTERS", "ADAPTER_CLASSES", "Adapter", "AttributePatch", "CodePatch", "Patch", "adapters",
           "declared_adapter", "install", "install_declared", "resolve"]


# -- patches ----------------------------------------------------------------------------------------

_ABSENT = object()


@dataclass
class AttributePatch:
    """``owner.name`` replaced; :meth:`undo` puts back the original (or deletes an inherited one)."""

    owner: Any
    name: str
    original: Any
    replacement: Any
    what: str = ""

    def undo(self) -> None:
        if vars(self.owner).get(self.name, _ABSENT) is not self.replacement:
            return  # someone rebound it since: theirs stays
        if self.original is _ABSENT:
            delattr(self.owner, self.name)
        else:
            setattr(self.owner, self.name, self.original)


@dataclass
class CodePatch:
    """A function's ``__code__`` swapped for a trampoline; :meth:`undo` swaps it back."""

    function: types.FunctionType
    original: types.CodeType
    replacement: types.CodeType
    what: str = ""

    def undo(self) -> None:
        _CODE_TARGETS.pop(id(self.replacement), None)
        if self.function.__code__ is self.replacement:
            self.function.__code__ = self.original


@dataclass
class GlobalsPatch:
    """Every module global bound to an object rebound to a replacement (the fallback)."""

    bindings: list[tuple[dict, str, Any, Any]] = field(default_factory=list)
    what: str = ""

    def undo(self) -> None:
        for namespace, name, original, replacement in reversed(self.bindings):
            if namespace.get(name) is replacement:
                namespace[name] = original


Patch = AttributePatch | CodePatch | GlobalsPatch


# -- adapters ---------------------------------------------------------------------------------------


@dataclass
class Adapter:
    """One entry point of a checkpoint implementation (see the module docstring).

    ``target`` is a dotted attribute path inside ``module``: ``"CheckpointFunction.apply"`` (a
    class attribute, a staticmethod replacement) or ``"CheckpointWithoutOutput.checkpoint"`` (an
    instance method: ``self`` is the first argument) or ``"non_reentrant_checkpoint"`` (a plain
    function, patched by its code).  ``function_index`` is where the region function is among
    the positional arguments; the region is called with those after it, but for the first
    ``options_after``, which are the implementation's own (Megatron's
    ``distribute_saved_activations``).
    """

    name: str
    library: str
    module: str
    target: str
    reentrant: bool | None = True
    needs_input_grad: bool | None = True
    preserves_rng: bool | None = True
    function_index: int = 0
    options_after: int = 0
    skip_dirs: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        """Subclasses set up what they keep between calls here."""

    # -- what the interceptor asks ----------------------------------------------------------
    def region(self, args: tuple, kwargs: dict) -> tuple[Any, Any]:
        if len(args) <= self.function_index:
            return None, None
        function = args[self.function_index]
        return function, self.named(function, args, kwargs)

    def named(self, function: Any, args: tuple, kwargs: dict) -> Any:
        """The callable that names the region (and whose reach watch follows)."""
        return function

    def with_function(self, args: tuple, kwargs: dict, function: Any) -> tuple[tuple, dict]:
        index = self.function_index
        return (*args[:index], function, *args[index + 1:]), kwargs

    def direct(self, run: Callable[[Any, tuple, dict], Any], args: tuple, kwargs: dict) -> Any:
        index = self.function_index
        return run(args[index], tuple(args[index + 1 + self.options_after:]), dict(kwargs))

    # -- installing ----------------------------------------------------------------------------
    def loaded(self) -> types.ModuleType | None:
        """The adapter's module, when its library is imported (never imported here)."""
        return sys.modules.get(self.module)

    def install(self, hooks: Any) -> list[Patch]:
        """Patch the entry point in the imported module; ``[]`` when its layout is not the expected one."""
        module = self.loaded()
        if module is None:
            return []
        self.skip_dirs = _package_dirs(self.library)
        owner, name = _owner_of(module, self.target)
        if owner is None:
            return []
        return [patch] if (patch := patch_callable(owner, name, self, hooks)) is not None else []


def _package_dirs(library: str) -> tuple[str, ...]:
    package = sys.modules.get(library)
    path = getattr(package, "__file__", None)
    return (os.path.dirname(os.path.realpath(path)) + os.sep,) if path else ()


def _owner_of(root: Any, dotted: str) -> tuple[Any, str]:
    *path, name = dotted.split(".")
    owner = root
    for part in path:
        owner = getattr(owner, part, None)
        if owner is None:
            return None, name
    return (owner, name) if hasattr(owner, name) else (None, name)


def _closure_value(function: Any, name: str) -> Any:
    code = getattr(function, "__code__", None)
    closure = getattr(function, "__closure__", None) or ()
    if code is None or name not in code.co_freevars:
        return _ABSENT
    try:
        return closure[code.co_freevars.index(name)].cell_contents
    except ValueError:  # an empty cell
        return _ABSENT


class DeepSpeedCheckpoint(Adapter):
    """``deepspeed.checkpointing.checkpoint`` = ``CheckpointFunction.apply(function, all_outputs, *args)``.

    Patched at ``CheckpointFunction.apply``, which every binding of ``checkpoint`` calls (the
    module attribute, ``from ... import checkpoint``, PipelineModule's default
    ``activation_checkpoint_func``).  ``checkpoint`` returns what the forward appended to
    ``all_outputs``; the direct call appends the same.  Keyword arguments are folded into a
    closure ``function_with_kwargs`` that holds the user's callable as ``run_function``: that
    names the region.
    """

    def named(self, function: Any, args: tuple, kwargs: dict) -> Any:
        inner = _closure_value(function, "run_function")
        return function if inner is _ABSENT or getattr(function, "__name__", "") != "function_with_kwargs" else inner

    def direct(self, run: Callable[[Any, tuple, dict], Any], args: tuple, kwargs: dict) -> Any:
        function, all_outputs, *rest = args
        outputs = run(function, tuple(rest), {})
        all_outputs += [outputs] if torch.is_tensor(outputs) else list(outputs)
        return outputs


class FairscaleCheckpoint(Adapter):
    """fairscale's ``CheckpointFunction.apply(dummy, run_function, parent_ctx_dict, kwarg_keys, *flat_args)``.

    ``checkpoint_wrapper(module)`` sets ``module.forward`` to a partial of
    ``_checkpointed_forward``, which calls this with ``run_function = type(module).forward``
    and ``flat_args = (module, *args, *kwarg values)``: the region is that forward bound to the
    module.  The direct call fills ``parent_ctx_dict`` as the forward does (the output keeps
    its graph; non-tensor outputs go back through ``packed_non_tensor_outputs``).
    """

    def named(self, function: Any, args: tuple, kwargs: dict) -> Any:
        flat = args[4:]
        if flat and isinstance(flat[0], torch.nn.Module) and isinstance(function, types.FunctionType):
            return types.MethodType(function, flat[0])
        return function

    def direct(self, run: Callable[[Any, tuple, dict], Any], args: tuple, kwargs: dict) -> Any:
        module = self.loaded()
        assert module is not None, "a fairscale call reached recheck with fairscale not imported"
        _dummy, run_function, parent_ctx_dict, kwarg_keys, *flat_args = args
        region_args, region_kwargs = module.unpack_kwargs(kwarg_keys, tuple(flat_args))
        outputs = run(run_function, tuple(region_args), dict(region_kwargs))
        parent_ctx_dict["output_requires_grad"] = True
        if not isinstance(outputs, torch.Tensor):
            outputs, parent_ctx_dict["packed_non_tensor_outputs"] = module.split_non_tensors(outputs)
        return outputs


class MegatronWithoutOutput(Adapter):
    """Megatron's ``CheckpointWithoutOutput().checkpoint(run_function, *args)``.

    The forward runs in ``CheckpointWithoutOutputFunction`` under ``no_grad``; the output's
    storage is freed by ``discard_output_and_register_recompute(hook_tensor)``, and the
    recompute runs in a grad hook of ``hook_tensor`` through ``self.run_function``, which
    ``checkpoint`` sets to the function it is given (so the wrapped one).  Bypassed,
    ``checkpoint`` calls the region and ``discard_output_and_register_recompute`` does nothing
    for that object (the output is the region's own, with its graph).
    """

    def __post_init__(self) -> None:
        self._bypassed: weakref.WeakSet[Any] = weakref.WeakSet()

    def direct(self, run: Callable[[Any, tuple, dict], Any], args: tuple, kwargs: dict) -> Any:
        self._bypassed.add(args[0])
        return super().direct(run, args, kwargs)

    def install(self, hooks: Any) -> list[Patch]:
        patches = super().install(hooks)
        owner, name = _owner_of(self.loaded(), "CheckpointWithoutOutput.discard_output_and_register_recompute")
        if not patches or owner is None:
            return patches
        real = vars(owner).get(name)
        bypassed = self._bypassed

        @functools.wraps(real, updated=())
        def discard_output_and_register_recompute(self: Any, *args: Any, **kwargs: Any) -> Any:
            if self in bypassed:
                bypassed.discard(self)
                return None
            return real(self, *args, **kwargs)

        setattr(owner, name, discard_output_and_register_recompute)
        return [*patches, AttributePatch(owner, name, real, discard_output_and_register_recompute,
                                         f"{self.module}.CheckpointWithoutOutput.{name}")]


#: Adapter classes by the adapter name of their :class:`recheck.entry_points.Intercept`; any other
#: adapter is a plain :class:`Adapter`.
ADAPTER_CLASSES: dict[str, type[Adapter]] = {
    "deepspeed": DeepSpeedCheckpoint,
    "megatron-without-output": MegatronWithoutOutput,
    "fairscale": FairscaleCheckpoint,
}


def adapters(table: Iterable[EntryPoint]) -> tuple[Adapter, ...]:
    """One adapter per record of ``table`` that an adapter intercepts, its semantics read from the record."""
    made = []
    for record in table:
        intercept = record.intercept
        if intercept is None or not intercept.adapter:
            continue
        made.append(ADAPTER_CLASSES.get(intercept.kind, Adapter)(
            intercept.kind, intercept.module.split(".")[0], intercept.module, intercept.target,
            reentrant=record.reentrant, needs_input_grad=intercept.needs_input_grad,
            preserves_rng=record.restores_rng, function_index=intercept.function_index,
            options_after=intercept.options_after))
    return tuple(made)


#: Every known entry point that an adapter intercepts, from :data:`recheck.entry_points.TABLE`.
ADAPTERS: tuple[Adapter, ...] = adapters(TABLE)


def install(hooks: Any, done: set[str]) -> list[Patch]:
    """Patch every known entry point whose library is imported and that ``done`` does not name yet."""
    patches: list[Patch] = []
    for adapter in ADAPTERS:
        if adapter.name not in done and adapter.loaded() is not None:
            installed = adapter.install(hooks)
            if installed:
                done.add(adapter.name)
                patches.extend(installed)
    return patches


# -- patching one callable ----------------------------------------------------------------------------


def patch_callable(owner: Any, name: str, adapter: Adapter, hooks: Any) -> Patch | None:
    """Route ``owner.name`` to ``hooks.foreign(adapter, ...)``; None when it cannot be patched."""
    what = f"{getattr(owner, '__module__', '')}.{getattr(owner, '__qualname__', getattr(owner, '__name__', ''))}.{name}"
    if isinstance(owner, types.ModuleType):
        what = f"{owner.__name__}.{name}"
    raw = vars(owner).get(name, _ABSENT) if hasattr(owner, "__dict__") else _ABSENT
    if isinstance(owner, types.ModuleType):
        function = raw
        if isinstance(function, types.FunctionType):
            return _patch_code(function, adapter, hooks, what)
        return None
    replacement: Any
    if raw is _ABSENT or isinstance(raw, (staticmethod, classmethod)):
        # a bound classmethod (Function.apply) or the static function
        replacement = staticmethod(_foreign_entry(getattr(owner, name), adapter, hooks))
    elif isinstance(raw, types.FunctionType):  # an instance method: ``self`` comes first
        replacement = _foreign_entry(raw, adapter, hooks)
    else:
        return None
    setattr(owner, name, replacement)
    return AttributePatch(owner, name, raw, replacement, what)


def _trampoline(*args: Any, **kwargs: Any) -> Any:
    # Runs as the patched function's code, with that function's globals: import what it needs.
    import sys as _sys

    from recheck.intercept.implementations import _enter_code

    return _enter_code(_sys._getframe(0).f_code, args, kwargs)


@dataclass
class _CodeTarget:
    hooks: Any
    adapter: Adapter
    real: Callable[..., Any]


#: id of a trampoline code object -> what calls through it go to (the code objects are held by
#: their :class:`CodePatch`, so an id cannot be reused while it is here)
_CODE_TARGETS: dict[int, _CodeTarget] = {}


def _enter_code(code: types.CodeType, args: tuple, kwargs: dict) -> Any:
    target = _CODE_TARGETS.get(id(code))
    if target is None:  # cannot happen while the patch is installed
        raise RuntimeError("recheck: a checkpoint function's patch outlived its installation")
    if torch.compiler.is_compiling():
        target.hooks.compiled()
        return target.real(*args, **kwargs)
    return target.hooks.foreign(target.adapter, target.real, args, kwargs)


def _patch_code(function: types.FunctionType, adapter: Adapter, hooks: Any, what: str) -> CodePatch | None:
    """Swap the code of ``function`` (or of the closure-free function it wraps) for a trampoline."""
    inner = function
    for _ in range(16):
        if not inner.__closure__:
            break
        wrapped = getattr(inner, "__wrapped__", None)
        if not isinstance(wrapped, types.FunctionType):
            return None
        inner = wrapped
    if inner.__closure__:
        return None
    original = inner.__code__
    real = types.FunctionType(original, inner.__globals__, inner.__name__, inner.__defaults__, None)
    real.__kwdefaults__ = inner.__kwdefaults__
    real.__qualname__, real.__module__, real.__doc__ = inner.__qualname__, inner.__module__, inner.__doc__
    replacement = _trampoline.__code__.replace(co_name=original.co_name)
    if sys.version_info >= (3, 11):  # co_qualname names the frame in tracebacks from 3.11 on
        replacement = replacement.replace(co_qualname=original.co_qualname)
    _CODE_TARGETS[id(replacement)] = _CodeTarget(hooks, adapter, real)
    inner.__code__ = replacement
    return CodePatch(inner, original, replacement, what)


# -- checkpoint-functions: declared by the project ----------------------------------------------------


class _Declared(Adapter):
    """A function a project declares in ``checkpoint-functions``: it checkpoints its first
    argument (after ``self`` for a method); bypassed, that argument is called with the others,
    the keyword arguments torch's checkpoint takes for itself left out."""

    def direct(self, run: Callable[[Any, tuple, dict], Any], args: tuple, kwargs: dict) -> Any:
        index = self.function_index
        return run(args[index], tuple(args[index + 1:]),
                   {k: v for k, v in kwargs.items() if k not in CHECKPOINT_OPTIONS})


def declared_adapter(dotted: str, function_index: int = 0, skip: tuple[str, ...] = ()) -> Adapter:
    """The adapter of a ``checkpoint-functions`` entry: semantics unknown (found at run time)."""
    return _Declared(dotted, "declared", "", dotted, reentrant=None, needs_input_grad=None, preserves_rng=None,
                     function_index=function_index, skip_dirs=skip)


def resolve(dotted: str) -> tuple[Any, str, Any] | str:
    """``(owner, attribute, value)`` of an imported dotted name, or why it cannot be found.

    The longest prefix that names a module in ``sys.modules`` is the module (nothing is
    imported); the rest are attributes (``pkg.mod.func``, ``pkg.mod.Class.method``).
    """
    parts = dotted.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        module = sys.modules.get(".".join(parts[:cut]))
        if module is None:
            continue
        owner: Any = module
        for part in parts[cut:-1]:
            owner = getattr(owner, part, _ABSENT)
            if owner is _ABSENT:
                return f"{dotted}: {'.'.join(parts[:cut])} has no attribute path {'.'.join(parts[cut:])}"
        value = getattr(owner, parts[-1], _ABSENT)
        if value is _ABSENT:
            return f"{dotted}: {'.'.join(parts[:-1])} has no attribute {parts[-1]!r}"
        return owner, parts[-1], value
    return f"{dotted}: not imported (recheck patches checkpoint functions of modules already imported)"


def install_declared(dotted: str, hooks: Any) -> tuple[list[Patch], str]:
    """Patch one ``checkpoint-functions`` entry; returns the patches and how it was patched.

    How: ``"code"`` (every reference covered), ``"rebound"`` (the module attribute and the module
    globals bound to it: earlier references missed), or why nothing was patched.
    """
    found = resolve(dotted)
    if isinstance(found, str):
        return [], found
    owner, name, value = found
    raw = vars(owner).get(name, value) if hasattr(owner, "__dict__") else value
    method = isinstance(owner, type) and isinstance(raw, (types.FunctionType, classmethod))
    function = raw.__func__ if isinstance(raw, (staticmethod, classmethod)) else raw
    if isinstance(function, types.FunctionType):
        adapter = declared_adapter(dotted, 1 if method else 0, (function.__code__.co_filename,))
        patch = _patch_code(function, adapter, hooks, dotted)
        if patch is not None:
            return [patch], "code"
    if not callable(value):
        return [], f"{dotted}: not callable ({type(value).__name__})"
    adapter = declared_adapter(dotted, 1 if method else 0)
    if method:  # a method whose code cannot be swapped: replace it on the class
        on_class = patch_callable(owner, name, adapter, hooks)
        return ([on_class], "rebound") if on_class is not None else ([], f"{dotted}: cannot be patched")
    return [_rebind(value, adapter, hooks, dotted)], "rebound"


def _foreign_entry(real: Any, adapter: Adapter, hooks: Any) -> Callable[..., Any]:
    """What a patched entry point runs: ``hooks.foreign`` for ``real``, except while compiling
    (dynamo traces ``real`` itself, and the hooks only hear that compiled code ran)."""

    @functools.wraps(real, updated=())
    def entry(*args: Any, **kwargs: Any) -> Any:
        if torch.compiler.is_compiling():
            hooks.compiled()
            return real(*args, **kwargs)
        return hooks.foreign(adapter, real, args, kwargs)

    return entry


def _rebind(value: Any, adapter: Adapter, hooks: Any, what: str) -> GlobalsPatch:
    patch = GlobalsPatch(what=what)
    patch.bindings.extend(rebind_everywhere(value, _foreign_entry(value, adapter, hooks)))
    return patch


def rebind_everywhere(original: Any, replacement: Any) -> list[tuple[dict, str, Any, Any]]:
    """Every module global bound to ``original`` rebound to ``replacement``; returns the
    ``(namespace, name, original, replacement)`` bindings made, for undoing them.

    The fallback where an object cannot be patched in place: references made other than by
    a module global (a ``functools.partial``, a default argument) keep the original.
    """
    made = []
    for module in list(sys.modules.values()):
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict):
            continue
        for key, bound in list(namespace.items()):
            if bound is original:
                namespace[key] = replacement
                made.append((namespace, key, original, replacement))
    return made
