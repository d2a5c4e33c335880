"""Interception of every entry point of ``torch.utils.checkpoint``, installed at any time.

What is patched (as torch 2.13 lays it out, see the research notes §2.3):

1. ``torch.utils.checkpoint.checkpoint`` is ``torch._disable_dynamo``'s ``inner`` closure,
   which calls the real function held in its free variable ``fn``.  Swapping that cell
   catches every holder of the exported object at once: the module attribute, names bound
   by ``from torch.utils.checkpoint import checkpoint`` before the patch, and
   ``functools.partial`` objects stored earlier (transformers'
   ``_gradient_checkpointing_func``, ``CheckpointWrapper.checkpoint_fn``), and it keeps
   ``torch.compile``'s identity test (``obj is torch.utils.checkpoint.checkpoint``) true.
   ``checkpoint_sequential`` and timm call the module attribute, so they are caught too.
   If the layout is not the expected one, the module attribute and every module global
   bound to it are replaced instead, with a warning naming what that misses.
2. ``_checkpoint_without_reentrant_generator`` (``..._impl`` on torch 2.14), in
   ``torch.utils.checkpoint`` and in ``torch.distributed._composable.checkpoint_activation``,
   which imported it by name: the composable ``checkpoint(module)`` API (and torch 2.14's
   decorator form ``checkpoint(use_reentrant=False)(fn)``) drive it without calling
   ``checkpoint()``.
3. ``CheckpointFunction.forward``, for code that calls ``CheckpointFunction.apply`` itself.
4. The entry points of the other checkpoint implementations that are imported (DeepSpeed,
   Megatron-core, fairscale: :mod:`recheck.intercept.implementations`), and the functions a
   project declares in ``checkpoint-functions`` (``acquire(hooks, extra_functions=[...])``).

The patches only route calls to a :class:`Hooks` object; what is recorded is decided
there (``recheck.watcher.dispatch``).  :func:`acquire` / :func:`release` count nested
users, and the last release puts every original object back (``is`` identity).  Every
:func:`acquire` also patches the implementations imported since the first one, and the
declared functions it is given that are not patched yet.
"""

from __future__ import annotations

import functools
import sys
import threading
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Generator, Iterable, Iterator, Protocol

import torch
import torch.utils.checkpoint as torch_checkpoint

from recheck.intercept import implementations

__all__ = [
    "CELL_VARIABLE",
    "COMPOSABLE_MODULE",
    "Hooks",
    "Installation",
    "LayoutWarning",
    "acquire",
    "closure_cell",
    "installed",
    "release",
]

#: The free variable of ``torch._compile._disable_dynamo.<locals>.inner`` holding the function.
CELL_VARIABLE = "fn"
#: The module of the composable ``checkpoint(module)`` API, which imports the generator by name.
COMPOSABLE_MODULE = "torch.distributed._composable.checkpoint_activation"

#: The non-reentrant choke point, newest name first: torch 2.14 added ``..._impl`` (which
#: the composable API imports) and kept the old name as a shim that calls it.
GENERATOR_NAMES = ("_checkpoint_without_reentrant_generator_impl", "_checkpoint_without_reentrant_generator")


class LayoutWarning(UserWarning):
    """torch's checkpoint has a layout recheck does not know; some calls are not observed."""


class Hooks(Protocol):
    """What the patches call; ``recheck.watcher.dispatch`` implements it."""

    def checkpoint(self, original: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        """A call of ``torch.utils.checkpoint.checkpoint(*args, **kwargs)``."""

    def generator(self, original: Callable[..., Generator[None, None, None]], args: tuple, kwargs: dict) -> Iterator[None]:
        """A call of ``_checkpoint_without_reentrant_generator(*args, **kwargs)``."""

    def reentrant_forward(self, original: Callable[..., Any], ctx: Any, run_function: Any, preserve: bool, args: tuple) -> Any:
        """``CheckpointFunction.forward(ctx, run_function, preserve_rng_state, *args)``."""

    def foreign(self, implementation: Any, original: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        """A call of another implementation's entry point (``recheck.intercept.implementations``)."""

    def compiled(self) -> None:
        """A checkpoint call was passed through untouched because torch.compile was tracing."""


def closure_cell(exported: Any) -> Any | None:
    """The closure cell of ``exported`` that holds the real checkpoint function, or None.

    The layout relied on: ``exported.__wrapped__`` (set by ``functools.wraps``) is the
    real function and the closure variable :data:`CELL_VARIABLE` holds the same object.
    """
    code = getattr(exported, "__code__", None)
    closure = getattr(exported, "__closure__", None)
    wrapped = getattr(exported, "__wrapped__", None)
    if code is None or not closure or wrapped is None or CELL_VARIABLE not in code.co_freevars:
        return None
    cell = closure[code.co_freevars.index(CELL_VARIABLE)]
    try:
        contents = cell.cell_contents
    except ValueError:  # an empty cell
        return None
    return cell if contents is wrapped else None


@dataclass
class Installation:
    """Every object replaced, so that :meth:`undo` can put back exactly the originals."""

    hooks: Hooks
    exported: Any
    cell: Any | None = None
    real_checkpoint: Any = None
    replaced_globals: list[tuple[dict, str, Any, Any]] = field(default_factory=list)
    original_generator: Any = None
    generator_replacement: Any = None
    original_forward: Any = None
    missed: list[str] = field(default_factory=list)
    #: patches of other implementations and declared functions, in the order made
    foreign: list[Any] = field(default_factory=list)
    #: the names of the known implementations' entry points patched (``"deepspeed"`` ...)
    implementations: set[str] = field(default_factory=set)
    #: each declared function given to :func:`acquire`: ``"code"``, ``"rebound"``, or why not patched
    declared: dict[str, str] = field(default_factory=dict)

    def undo(self) -> None:
        """Restore every patched object (``is`` identity with the originals)."""
        for patch in reversed(self.foreign):
            patch.undo()
        if self.cell is not None:
            self.cell.cell_contents = self.real_checkpoint
        for namespace, name, original, replacement in reversed(self.replaced_globals):
            if namespace.get(name) is replacement:
                namespace[name] = original
        # A module imported while watching may have bound the replacement generator
        # by name (the composable API does): give it the original as well.
        composable = sys.modules.get(COMPOSABLE_MODULE)
        for name in GENERATOR_NAMES:
            if composable is not None and getattr(composable, name, None) is self.generator_replacement:
                setattr(composable, name, self.original_generator)
        if self.original_forward is not None:
            torch_checkpoint.CheckpointFunction.forward = self.original_forward  # type: ignore[method-assign]


_lock = threading.RLock()
_installation: Installation | None = None
_users = 0


def installed() -> Installation | None:
    """The active installation, or None when nothing is patched."""
    return _installation


def acquire(hooks: Hooks, extra_functions: Iterable[str] = ()) -> Installation:
    """Install the patches (first user) or count one more user of the installed ones.

    ``extra_functions``: dotted names of functions that checkpoint their first argument (the
    ``checkpoint-functions`` key of ``[tool.recheck]``), intercepted like the known
    implementations when their module is imported; ``Installation.declared`` says how each
    was patched, or why it was not.  They stay patched until the last :func:`release`.
    """
    global _installation, _users
    with _lock:
        if _installation is None:
            _installation = _install(hooks)
            for what in _installation.missed:
                warnings.warn(what, LayoutWarning, stacklevel=3)
        installation = _installation
        installation.foreign += implementations.install(installation.hooks, installation.implementations)
        for name in extra_functions:
            if installation.declared.get(name) not in ("code", "rebound"):
                made, how = implementations.install_declared(name, installation.hooks)
                installation.foreign += made
                installation.declared[name] = how
        _users += 1
        return installation


def release() -> None:
    """Drop one user; the last one restores every original object."""
    global _installation, _users
    with _lock:
        if _users == 0:
            raise RuntimeError("recheck: patches released more often than acquired")
        _users -= 1
        if _users == 0 and _installation is not None:
            installation, _installation = _installation, None
            installation.undo()


def _install(hooks: Hooks) -> Installation:
    exported = torch_checkpoint.checkpoint
    installation = Installation(hooks=hooks, exported=exported)
    cell = closure_cell(exported)
    if cell is not None:
        real = cell.cell_contents
        installation.cell, installation.real_checkpoint = cell, real
        cell.cell_contents = _checkpoint_replacement(real)
    else:
        _rebind_exported(installation, exported)
    _patch_generator(installation)
    _patch_reentrant_forward(installation)
    return installation


#: the replacement functions made so far, one per patched original for the life of the process,
#: so that what torch caches on a replacement (``_disable_dynamo``'s ``inner`` wraps it in
#: ``torch._dynamo.disable`` at its first call and keeps that on it) is made once, not in every
#: ``watch()`` block.  A replacement holds no hooks object: it calls the installed one's, or the
#: original when nothing is installed (a replacement bound by name somewhere the undo missed).
_REPLACEMENTS: dict[tuple[str, Any], Callable[..., Any]] = {}


def _replacement(kind: str, original: Any, make: Callable[[Any], Callable[..., Any]]) -> Callable[..., Any]:
    """``make(original)``, made once per ``(kind, original)`` (the key holds the original, so
    its id is not reused while the entry lives; there are a handful of originals)."""
    key = (kind, original)
    replacement = _REPLACEMENTS.get(key)
    if replacement is None:
        replacement = _REPLACEMENTS[key] = make(original)
    return replacement


def _hooks() -> Hooks | None:
    """The installed patches' hooks (None: nothing is installed)."""
    installation = _installation
    return installation.hooks if installation is not None else None


def _checkpoint_replacement(real: Callable[..., Any]) -> Callable[..., Any]:
    return _replacement("checkpoint", real, functools.partial(_routed, route="checkpoint"))


def _routed(original: Callable[..., Any], route: str) -> Callable[..., Any]:
    """What replaces ``checkpoint`` or the non-reentrant generator: the call goes to the installed
    hooks' method of that name (``route``), or to ``original`` while torch.compile traces or
    when nothing is installed."""
    # ``updated=()``: ``inner`` caches ``torch._dynamo.disable(fn)`` as an attribute of
    # ``fn``; copying the real function's ``__dict__`` would copy that cache and route
    # every call around the replacement.
    @functools.wraps(original, updated=())
    def replacement(*args: Any, **kwargs: Any) -> Any:
        hooks = _hooks()
        if hooks is None:
            return original(*args, **kwargs)
        if torch.compiler.is_compiling():
            hooks.compiled()
            return original(*args, **kwargs)
        return getattr(hooks, route)(original, args, kwargs)

    return replacement


def _rebind_exported(installation: Installation, exported: Any) -> None:
    """Fallback: replace the module attribute and every module global bound to it."""
    replacement = _checkpoint_replacement(exported)
    installation.replaced_globals.extend(implementations.rebind_everywhere(exported, replacement))
    installation.missed.append(
        "recheck: torch.utils.checkpoint.checkpoint does not have the layout recheck expects "
        f"(a torch._disable_dynamo closure whose {CELL_VARIABLE!r} cell holds __wrapped__); "
        "falling back to replacing the module attribute and names bound by import. Not observed: "
        "functools.partial objects made before watch() started (transformers' "
        "gradient_checkpointing_enable(), FSDP's checkpoint_wrapper) and torch.compile's "
        "identity check may see a different object."
    )


def _patch_generator(installation: Installation) -> None:
    name = next((n for n in GENERATOR_NAMES if callable(getattr(torch_checkpoint, n, None))), None)
    if name is None:
        installation.missed.append(
            f"recheck: none of torch.utils.checkpoint.{{{', '.join(GENERATOR_NAMES)}}} was found; "
            "saved tensors are not compared and torch.distributed._composable.checkpoint(module) "
            "calls are not observed"
        )
        return
    original = getattr(torch_checkpoint, name)
    watched_generator = _replacement("generator", original, functools.partial(_routed, route="generator"))
    installation.original_generator = original
    installation.generator_replacement = watched_generator
    namespaces = [vars(torch_checkpoint)]
    composable = sys.modules.get(COMPOSABLE_MODULE)
    if composable is not None:
        namespaces.append(vars(composable))
    for namespace in namespaces:
        for bound_name in GENERATOR_NAMES:
            if namespace.get(bound_name) is original:
                namespace[bound_name] = watched_generator
                installation.replaced_globals.append((namespace, bound_name, original, watched_generator))


def _patch_reentrant_forward(installation: Installation) -> None:
    function_class = torch_checkpoint.CheckpointFunction
    original = function_class.__dict__.get("forward")
    if not isinstance(original, staticmethod):
        installation.missed.append(
            "recheck: CheckpointFunction.forward is not a staticmethod; direct "
            "CheckpointFunction.apply calls are observed only through checkpoint()"
        )
        return
    watched_forward = _replacement("forward", original.__func__, _make_forward_replacement)
    installation.original_forward = original
    function_class.forward = staticmethod(watched_forward)  # type: ignore[method-assign]


def _make_forward_replacement(real_forward: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(real_forward, updated=())
    def watched_forward(ctx: Any, run_function: Any, preserve_rng_state: bool, *args: Any) -> Any:
        hooks = _hooks()
        if hooks is None:
            return real_forward(ctx, run_function, preserve_rng_state, *args)
        return hooks.reentrant_forward(real_forward, ctx, run_function, preserve_rng_state, args)

    return watched_forward
