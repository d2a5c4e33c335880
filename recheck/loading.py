"""Loading the regions named on the command line.

A target is ``file.py`` (every module-level callable whose name starts with
``region_``), ``file.py:name`` or ``pkg.module:name``.  A named callable takes no
argument and returns ``(region, args)`` or ``(region, args, kwargs)``.  A module may
define ``CHECK_OPTIONS = {name: {option: value}}`` with the ``check()`` options an
example needs (for instance ``preserve_rng_state=False``).

Errors raised by the user's code (importing the file, building the region) become a
:class:`TargetError` whose ``user_traceback`` shows the user's frames only.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

__all__ = ["Region", "Target", "TargetError", "build_region", "load_target", "user_frames"]

_OPTION_NAMES = frozenset({"use_reentrant", "preserve_rng_state", "early_stop", "grad_outputs",
                           "atol", "rtol", "max_ulp"})


class TargetError(Exception):
    """A target cannot be loaded or built; ``user_traceback`` is the user's part, if any."""

    def __init__(self, message: str, user_traceback: str = "") -> None:
        super().__init__(message)
        self.user_traceback = user_traceback


@dataclass(frozen=True)
class Target:
    """One region factory: ``label`` is ``file.py:name``; ``options`` come from CHECK_OPTIONS."""

    label: str
    factory: Callable[[], Any]
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Region:
    """A built region ready for :func:`recheck.checker.check`."""

    fn: Callable[..., Any]
    args: tuple
    kwargs: dict


def user_frames(exc: BaseException) -> str:
    """The traceback of ``exc`` without recheck's and importlib's frames."""
    here = str(Path(__file__).resolve().parent.parent)
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if not f.filename.startswith(here) and "importlib" not in f.filename
              and not f.filename.startswith("<frozen")]
    lines = ["Traceback (most recent call last):\n"]
    lines += traceback.format_list(frames)
    lines += traceback.format_exception_only(type(exc), exc)
    return "".join(lines)


_LOADED: dict[str, ModuleType] = {}


def _import_file(path: Path) -> ModuleType:
    resolved = str(path.resolve())
    if resolved in _LOADED:
        return _LOADED[resolved]
    stem = path.stem if path.stem.isidentifier() else "target"
    # Named after the file (``zoo``) so that findings say ``zoo.SCALE``; another name
    # when a different module already has it.
    name = next(n for n in (stem, *(f"recheck_{stem}_{i}" for i in range(1, 10_000)))
                if n not in sys.modules)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise TargetError(f"cannot import {path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    directory = str(path.resolve().parent)
    sys.path.insert(0, directory)
    try:
        spec.loader.exec_module(module)
    except BaseException as exc:
        del sys.modules[name]
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise TargetError(f"importing {path} failed: {type(exc).__name__}: {exc}",
                          user_frames(exc)) from None
    finally:
        if directory in sys.path:
            sys.path.remove(directory)
    _LOADED[resolved] = module
    return module


def _import_module(dotted: str) -> ModuleType:
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        return importlib.import_module(dotted)
    except ModuleNotFoundError as exc:
        if exc.name and dotted.startswith(exc.name):
            raise TargetError(f"no module named {dotted!r}") from None
        raise TargetError(f"importing {dotted} failed: {exc}", user_frames(exc)) from None
    except Exception as exc:
        raise TargetError(f"importing {dotted} failed: {type(exc).__name__}: {exc}",
                          user_frames(exc)) from None


def _options(module: ModuleType, name: str) -> dict[str, Any]:
    table = getattr(module, "CHECK_OPTIONS", None)
    options = dict(table.get(name, {})) if isinstance(table, dict) else {}
    unknown = set(options) - _OPTION_NAMES
    if unknown:
        raise TargetError(f"CHECK_OPTIONS[{name!r}] has unknown option(s): {', '.join(sorted(unknown))}")
    return options


def load_target(spec: str) -> list[Target]:
    """The region factories a target names (see the module docstring)."""
    location, _, name = spec.partition(":")
    if location.endswith(".py") or os.sep in location or "/" in location:
        path = Path(location)
        if not path.is_file():
            raise TargetError(f"no such file: {location}")
        module = _import_file(path)
    else:
        if not name:
            raise TargetError(f"{spec!r}: expected file.py, file.py:name or pkg.module:name")
        module = _import_module(location)
    if name:
        factory = getattr(module, name, None)
        if factory is None:
            raise TargetError(f"{location} has no attribute {name!r}")
        if not callable(factory):
            raise TargetError(f"{spec} is not callable")
        return [Target(spec, factory, _options(module, name))]
    names = [n for n, v in vars(module).items() if n.startswith("region_") and callable(v)]
    if not names:
        raise TargetError(f"{location} defines no callable named region_*")
    return [Target(f"{location}:{n}", getattr(module, n), _options(module, n)) for n in names]


def build_region(target: Target) -> Region:
    """Call the factory and check the shape of what it returns."""
    try:
        built = target.factory()
    except Exception as exc:
        raise TargetError(f"{target.label} raised {type(exc).__name__}: {exc}",
                          user_frames(exc)) from None
    if isinstance(built, tuple) and len(built) in (2, 3) and callable(built[0]):
        args = built[1]
        kwargs = built[2] if len(built) == 3 else {}
        if isinstance(args, (list, tuple)) and isinstance(kwargs, dict):
            return Region(built[0], tuple(args), dict(kwargs))
    raise TargetError(f"{target.label} must return (region, args) or (region, args, kwargs), "
                      f"got {type(built).__name__}")
