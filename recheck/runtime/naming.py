"""Naming a checkpointed region: what function it runs, where it is defined, who called it.

A region is keyed by the qualified name of the checkpointed callable with its
``file:line`` and by the ``file:line`` of the code that called checkpoint (the first
frame outside torch, functools, contextlib and recheck).  The callable is unwrapped
through ``functools.partial`` (transformers checkpoints ``partial(forward, self)``),
bound methods and modules (``checkpoint_wrapper`` checkpoints the module itself), which
also gives the module that owns the region, when there is one.  A call of a module
(``layer.__call__``, ``partial(super().__call__, **kwargs)`` as transformers 5.16's
``GradientCheckpointingLayer`` checkpoints itself, torch's ``_wrapped_call_impl`` or
``_call_impl`` bound to it) runs its ``forward``, and is named by it: the layer's class and
its ``forward``'s ``file:line``, never torch's ``module.py``.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
import types
from pathlib import Path
from typing import Any, Callable

import torch

from recheck.findings import Subject
from recheck.runtime.holds import Hold

__all__ = ["DEFAULT_DTYPE_SUBJECT", "GRAD_MODE_SUBJECT", "RegionKey", "attribute_subject", "autocast_subject",
           "buffer_subject", "call_site", "describe", "grad_subject", "hold_cwd", "parameter_subject", "region_name",
           "relative", "release_cwd", "unwrap"]

_SKIPPED_DIRS = tuple(
    str(Path(str(module.__file__)).resolve().parent) + os.sep
    for module in (torch, functools, sys.modules["recheck"])
    if getattr(module, "__file__", None)
)
_SKIPPED_FILES = {functools.__file__, sys.modules["contextlib"].__file__}


#: a place in code as a key holds it before it is worded: the file as the code names it, its line
Place = tuple[str, int]


class RegionKey:
    """The identity of a region: callable and the place that checkpoints it.

    ``defined_at`` and ``callsite`` read ``file:line`` (None: not known).  A key :func:`describe`
    makes holds :data:`Place` s and words them when first read, from the working directory of its
    making: every invocation makes its region's key, few are shown, and wording a file costs more
    than the rest of the key.  Keys are equal by qualified name and places, an unworded place by
    the file as the code names it (a key :func:`describe` made equals none made of texts).
    """

    __slots__ = ("qualname", "_places", "_cwd", "_worded", "_hash")

    def __init__(self, qualname: str, defined_at: str | Place | None, callsite: str | Place | None,
                 cwd: str | None = None) -> None:
        self.qualname = qualname
        self._places = (defined_at, callsite)
        self._cwd = cwd
        self._worded: tuple[str | None, str | None] | None = None
        self._hash = hash((qualname, defined_at, callsite))  # made once: hashed several times an invocation

    defined_at = property(lambda self: self._texts()[0])
    callsite = property(lambda self: self._texts()[1])

    def _texts(self) -> tuple[str | None, str | None]:
        if self._worded is None:
            self._worded = tuple(place if place is None or isinstance(place, str)  # type: ignore[assignment]
                                 else f"{relative(place[0], self._cwd)}:{place[1]}" for place in self._places)
        return self._worded  # type: ignore[return-value]

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return type(other) is RegionKey and self._hash == other._hash and self.qualname == other.qualname \
            and self._places == other._places

    def __reduce__(self) -> tuple[type[RegionKey], tuple[str, str | None, str | None]]:
        # worded, and made again where it is unpickled: a string's hash differs from process to process
        return RegionKey, (self.qualname, self.defined_at, self.callsite)

    def __repr__(self) -> str:
        return f"RegionKey({self.qualname!r}, {self.defined_at!r}, {self.callsite!r})"

    def __str__(self) -> str:
        return f"{self.qualname} ({self.defined_at})" if self.defined_at else self.qualname


#: the names of the functions that call a module (its ``forward``): ``nn.Module.__call__`` is
#: torch's ``_wrapped_call_impl``, which calls ``_call_impl``; a layer may define ``__call__``
_MODULE_CALLS = frozenset({"__call__", "_wrapped_call_impl", "_call_impl"})


def unwrap(function: Any) -> tuple[Callable[..., Any] | None, Any]:
    """The plain Python function behind ``function`` and the object it is bound to, if any.

    A module, or a call of one (its ``__call__``, bound or given the module as first argument
    of a ``partial``), stands for its class's ``forward``: what the call runs."""
    owner = None
    seen = 0
    while seen < 16:
        seen += 1
        if isinstance(function, functools.partial):
            if owner is None and function.args and isinstance(function.args[0], torch.nn.Module):
                owner = function.args[0]
            function = function.func
        elif isinstance(function, torch.nn.Module):
            owner = owner if owner is not None else function
            function = type(function).forward
        elif hasattr(function, "__func__") and hasattr(function, "__self__"):
            bound = function.__self__
            if isinstance(bound, torch.nn.Module) and getattr(function.__func__, "__name__", None) in _MODULE_CALLS:
                function = bound  # ``layer.__call__``, ``super().__call__``: the layer's forward
                continue
            owner = owner if owner is not None else bound
            function = function.__func__
        elif hasattr(function, "__code__"):
            if isinstance(owner, torch.nn.Module) and getattr(function, "__name__", None) in _MODULE_CALLS:
                function = owner  # ``partial(nn.Module.__call__, layer)``
                continue
            return function, owner
        elif type(function).__module__ == "unittest.mock" and callable(getattr(function, "side_effect", None)):
            function = function.side_effect  # ``Mock(side_effect=forward)``, as tests count a layer's runs
        elif callable(function) and hasattr(type(function), "__call__"):
            owner = owner if owner is not None else function
            function = type(function).__call__
        else:
            break
    return (function if hasattr(function, "__code__") else None), owner


def relative(path: str, cwd: str | None = None) -> str:
    """``path`` as findings show it: relative to the working directory when inside or beside it.

    The one rule every face uses for file names in messages (region definitions, checkpoint
    calls): a file of an installed package is shown from the folder it is imported from
    (``timm/models/_manipulate.py``); a path under the working directory, or in a sibling folder,
    relative; anything further away stays absolute.  ``cwd``: the working directory to start
    from (the one read now where None).
    """
    cwd = _working_directory() if cwd is None else cwd
    real = os.path.realpath(path)
    for root in _library_roots():
        if real.startswith(root):
            return real[len(root):]
    if not cwd:  # the working directory is gone
        return path
    try:
        rel = os.path.relpath(path, cwd)
    except ValueError:  # another drive on Windows
        return path
    return path if rel.startswith(".." + os.sep + "..") else rel


def _working_directory() -> str:
    held = _held_cwd[0]
    return held if held is not None else _getcwd()


def _getcwd() -> str:
    """The working directory, or "" where it is gone (deleted): paths then stay absolute."""
    try:
        return os.getcwd()
    except OSError:
        return ""


#: the working directory read when the first holder took it (None: not held)
_held_cwd: list[str | None] = [None]


def _take_cwd() -> None:
    _held_cwd[0] = _getcwd()


def _drop_cwd() -> None:
    _held_cwd[0] = None


_CWD_HOLD = Hold("hold_cwd", _take_cwd, _drop_cwd)


def hold_cwd() -> None:
    """Read the working directory once until :func:`release_cwd`: paths are made relative to
    it meanwhile.  A ``watch()`` block holds it: every invocation names its call site, and
    asking the system for the working directory each time cost more than naming the rest."""
    _CWD_HOLD.take()


def release_cwd() -> None:
    """Undo one :func:`hold_cwd`; after the last one the working directory is read at each use.
    Raises without a hold."""
    _CWD_HOLD.release()


@functools.lru_cache(maxsize=1)
def _library_roots() -> tuple[str, ...]:
    """The folders installed packages live in (this interpreter's ``purelib``/``platlib`` and
    site-packages, the user's too), longest first: read once, as asking ``site`` for them costs
    more than the rest of naming a file."""
    import site
    import sysconfig

    roots = {sysconfig.get_paths().get(name, "") for name in ("purelib", "platlib")}
    for found in (getattr(site, "getsitepackages", list), getattr(site, "getusersitepackages", str)):
        try:
            more: Any = found()
        except Exception:  # an embedded or unusual interpreter
            continue
        roots.update([more] if isinstance(more, str) else more)
    return tuple(sorted((os.path.join(os.path.realpath(r), "") for r in roots if r), key=len, reverse=True))


def call_site(depth: int = 2, skip: tuple[str, ...] = ()) -> Place | None:
    """The file and line of the nearest caller outside torch, functools, contextlib and recheck,
    unworded (see :class:`RegionKey`).

    ``skip`` adds folders (ending in a path separator) whose frames are passed over too: a
    checkpoint library's own package, so that the call site is the user's call of it.
    """
    frame: types.FrameType | None = sys._getframe(depth)
    skipped = _SKIPPED_DIRS + skip
    while frame is not None:
        filename = frame.f_code.co_filename
        if filename not in _SKIPPED_FILES and not filename.startswith(skipped) and not filename.startswith("<frozen"):
            return filename, frame.f_lineno
        frame = frame.f_back
    return None


def describe(function: Any, callsite: str | Place | None) -> RegionKey:
    """The :class:`RegionKey` of a checkpointed callable called from ``callsite``: what
    :func:`_named` names it, where it was called from."""
    return RegionKey(*_named(function), callsite, _working_directory())


def _named(function: Any, held: bool = True) -> tuple[str, Place | None]:
    """The qualified name of a checkpointed callable and where it is defined (``held``: a
    closure over layers of one class is named by that layer, see :func:`_held_layer`)."""
    plain, owner = unwrap(function)
    if plain is not None:
        try:
            plain = inspect.unwrap(plain)  # decorated forwards (transformers' deprecate_kwarg)
        except ValueError:  # a __wrapped__ cycle
            pass
        code = plain.__code__
        qualname = getattr(plain, "__qualname__", code.co_name)
        layer = _held_layer(plain) if owner is None and held else None
        if layer is not None:
            return _named(layer)
        if isinstance(owner, torch.nn.Module) and "." not in qualname:
            qualname = f"{type(owner).__qualname__}.{qualname}"
        return qualname, (code.co_filename, code.co_firstlineno)
    return getattr(function, "__qualname__", None) or type(function).__qualname__, None


def _held_layer(function: Any) -> torch.nn.Module | None:
    """The layer a closure runs, where the closure holds layers of one class and nothing else
    that is a module: timm's ``checkpoint_seq`` and torch's ``checkpoint_sequential`` checkpoint
    a closure over a segment of blocks, older transformers and diffusers a
    ``create_custom_forward(module)``.  Such a region is that layer's ``forward``.  A closure
    over ``self`` runs a part of the enclosing method and keeps its own name."""
    cells = getattr(function, "__closure__", None)
    if not cells or "<locals>" not in getattr(function, "__qualname__", ""):
        return None
    layers: list[torch.nn.Module] = []
    for name, cell in zip(function.__code__.co_freevars, cells):
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if isinstance(value, torch.nn.Module) and not isinstance(value, (torch.nn.ModuleList, torch.nn.Sequential)):
            if name == "self":
                return None
            layers.append(value)
        elif isinstance(value, (list, tuple, torch.nn.ModuleList, torch.nn.Sequential)):
            layers.extend(item for item in list(value)[:256] if isinstance(item, torch.nn.Module))
    return layers[0] if layers and len({type(layer) for layer in layers}) == 1 else None


def region_name(function: Any) -> str:
    """``Qual.name (file:line)``: how every face names the region a callable is.

    The same text as a :class:`RegionKey` without its call site: ``Block.forward
    (model.py:8)`` for a module, a bound method or ``partial(forward, self)``,
    ``make.<locals>.body (m.py:3)`` for a closure.
    """
    return str(describe(function, None))


def step_name(step: Any) -> str:
    """``Qual.name (file:line)`` of a step (what :func:`recheck.check_step` and the planner run):
    its own function, even a closure over one model, which :func:`region_name` names by the
    model's ``forward``; the step is the code that runs the model and steps the optimizer."""
    return str(RegionKey(*_named(step, held=False), None))


# -- subjects: what a finding says differs, the same words in every face ------------------------


def attribute_subject(module: str, name: str) -> Subject:
    """``attribute `self.calls``` (the region's own module) or ``attribute `gate.load```."""
    return Subject("attribute", name, owner=module)


def buffer_subject(module: str, name: str) -> Subject:
    """``buffer `bn.running_mean``` (``buffer `running_mean``` on the region's own module)."""
    return Subject("buffer", name, owner=module)


def parameter_subject(names: list[str]) -> Subject:
    """``parameter `fc.w``` (its module ``fc``, its name ``w``) or ``parameters `w`, `b```: the
    parameters a ``param_version`` names, the end state of a step's parameter."""
    owner, _, name = names[0].rpartition(".")
    return Subject("parameter", name, owner=owner, more=tuple(names[1:]))


#: the subject of a ``context`` finding about grad mode, and about the default dtype
GRAD_MODE_SUBJECT = Subject("context", "grad mode")
DEFAULT_DTYPE_SUBJECT = Subject("context", "default dtype")


def autocast_subject(device_type: str) -> Subject:
    """``autocast `cpu```: the subject of a ``context`` finding about one device type's autocast."""
    return Subject("context", "autocast", owner=device_type)


def grad_subject(name: str) -> Subject:
    """``grad of `fc1.weight``` for a parameter, ``grad of args[0]`` for an input (a path)."""
    return Subject("gradient", path=name) if name.startswith(("args", "kwargs")) else Subject("gradient", name)
