"""Loading the regions named on the command line.

A target is ``file.py`` (every module-level callable named ``region_*``), ``file.py:name`` or
``pkg.module:name``; a named callable takes no argument and returns ``(region, args)`` or
``(region, args, kwargs)``, and ``CHECK_OPTIONS = {name: {option: value}}`` gives an example's
``check()`` options.  A file inside a package is imported by its dotted name with the first folder
above it without an ``__init__.py`` on ``sys.path``, as pytest's rootdir logic does; the current
folder is importable, as with ``python -m``.

Every face runs user code through :func:`run_user_code`: what it raises or an exit (``sys.exit(0)``
included) becomes that target's error, with the user's frames only; ``KeyboardInterrupt`` passes."""

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

__all__ = ["Region", "Target", "TargetError", "UserCodeFailed", "build_region", "failure_text", "load_target",
           "run_user_code", "user_frames"]

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
    here = str(Path(__file__).resolve().parent) + os.sep  # recheck's own package, nothing beside it
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if not f.filename.startswith(here) and "importlib" not in f.filename
              and not f.filename.startswith("<frozen")]
    lines = ["Traceback (most recent call last):\n"]
    lines += traceback.format_list(frames)
    lines += traceback.format_exception_only(type(exc), exc)
    return "".join(lines)


def failure_text(exc: BaseException) -> str:
    """How user code ended: ``ValueError: bad``, or ``SystemExit (sys.exit(0))`` for an exit."""
    if isinstance(exc, SystemExit):
        return f"SystemExit (sys.exit({'' if exc.code is None else repr(exc.code)}))"
    return f"{type(exc).__name__}: {exc}"


class UserCodeFailed(TargetError):
    """User code ended with an exception or an exit (``error``); the message is :func:`failure_text`'s."""

    def __init__(self, exc: BaseException) -> None:
        super().__init__(failure_text(exc), user_frames(exc))
        self.error = exc


def run_user_code(fn: Callable[..., Any], /, *args: Any, own: tuple[type[BaseException], ...] = (),
                  **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``, which runs the user's code: what it raises becomes :class:`UserCodeFailed`.

    The one gate between a face and the user's code: ``SystemExit`` is the user code's error too,
    so ``sys.exit(0)`` in a region is reported, never a silent exit 0 that drops the other targets.
    ``KeyboardInterrupt`` and the types in ``own`` (recheck's own errors) pass through.
    """
    try:
        return fn(*args, **kwargs)
    except KeyboardInterrupt:
        raise
    except own:
        raise
    except BaseException as exc:
        raise UserCodeFailed(exc) from None


_LOADED: dict[str, ModuleType] = {}


def _package_name(path: Path) -> tuple[Path, str] | None:
    """Where a file inside a package is imported from, as pytest's rootdir logic finds it.

    The first folder above ``path`` without an ``__init__.py`` is the root that goes on
    ``sys.path``; the file's dotted name is read from there (``mymodel/train.py`` with
    ``mymodel/__init__.py`` is ``mymodel.train``).  None for a file outside any package.
    """
    folder = path.parent
    parts = [] if path.name == "__init__.py" else [path.stem]
    while (folder / "__init__.py").is_file():
        parts.insert(0, folder.name)
        folder = folder.parent
    if folder == path.parent or not all(part.isidentifier() for part in parts):
        return None
    return folder, ".".join(parts)


def _not_found_hint(path: Path, exc: BaseException) -> str:
    """For ``No module named 'mymodel'`` where mymodel is a folder above the file: what to do."""
    if not isinstance(exc, ModuleNotFoundError) or not exc.name:
        return ""
    top = exc.name.partition(".")[0]
    for folder in path.parents:
        if folder.name == top:
            dotted = ".".join(path.relative_to(folder.parent).with_suffix("").parts)
            return (f" (`{top}` is the folder {folder}: run recheck from {folder.parent}, where "
                    f"`import {top}` finds it, and name the target {dotted}:NAME, or install the "
                    f"project with `pip install -e .`)")
    return ""


def _import_file(path: Path) -> ModuleType:
    resolved_path = path.resolve()
    resolved = str(resolved_path)
    if resolved in _LOADED:
        return _LOADED[resolved]
    _cwd_importable()
    package = _package_name(resolved_path)
    if package is not None:
        module = _import_in_package(path, resolved_path, *package)
    else:
        module = _import_loose_file(path, resolved_path)
    _LOADED[resolved] = module
    return module


def _import_in_package(path: Path, resolved: Path, root: Path, dotted: str) -> ModuleType:
    """Import a file inside a package by its dotted name, its root kept on sys.path (as pytest does)."""
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    try:
        module = run_user_code(importlib.import_module, dotted)
    except UserCodeFailed as exc:
        raise TargetError(f"importing {path} (as {dotted}) failed: {exc}"
                          f"{_not_found_hint(resolved, exc.error)}", exc.user_traceback) from None
    found = getattr(module, "__file__", None)
    if found is None or Path(found).resolve() != resolved:
        raise TargetError(f"{path} is the module {dotted} (from {root}), but `import {dotted}` finds "
                          f"{found or 'a module without a file'}: another {dotted.partition('.')[0]} "
                          f"comes first on sys.path (installed, or imported already)")
    return module


def _import_loose_file(path: Path, resolved: Path) -> ModuleType:
    """Import a file outside any package under its own name, its folder on sys.path meanwhile."""
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
    directory = str(resolved.parent)
    sys.path.insert(0, directory)
    try:
        run_user_code(spec.loader.exec_module, module)
    except BaseException as exc:  # the file's error, or Ctrl-C
        sys.modules.pop(name, None)
        if not isinstance(exc, UserCodeFailed):
            raise
        raise TargetError(f"importing {path} failed: {exc}{_not_found_hint(resolved, exc.error)}",
                          exc.user_traceback) from None
    finally:
        if directory in sys.path:
            sys.path.remove(directory)
    return module


def _cwd_importable() -> None:
    """Like ``python -m``: the current folder is importable, so a file in a folder of the project
    imports its siblings as ``mymodel.layers`` from the project root."""
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())


def _import_module(dotted: str) -> ModuleType:
    _cwd_importable()
    try:
        return run_user_code(importlib.import_module, dotted)
    except UserCodeFailed as exc:
        missing = exc.error
        if isinstance(missing, ModuleNotFoundError) and missing.name and dotted.startswith(missing.name):
            raise TargetError(f"no module named {dotted!r}") from None
        raise TargetError(f"importing {dotted} failed: {exc}", exc.user_traceback) from None


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
        built = run_user_code(target.factory)
    except UserCodeFailed as exc:
        raise TargetError(f"{target.label} raised {exc}", exc.user_traceback) from None
    if isinstance(built, tuple) and len(built) in (2, 3) and callable(built[0]):
        args = built[1]
        kwargs = built[2] if len(built) == 3 else {}
        if isinstance(args, (list, tuple)) and isinstance(kwargs, dict):
            return Region(built[0], tuple(args), dict(kwargs))
    raise TargetError(f"{target.label} must return (region, args) or (region, args, kwargs), "
                      f"got {type(built).__name__}")
