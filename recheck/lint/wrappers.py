"""What a library's checkpointing base class does to the arguments of the layer it checkpoints.

transformers' ``GradientCheckpointingLayer`` checkpoints a subclass's ``forward`` with some
keyword arguments replaced (the KV cache set to ``None``, ``use_cache`` to ``False``) so that
the recompute does not write the cache a second time.  Which keywords, under which class
flag, and whether it checkpoints ``forward`` or ``super().__call__`` changed from release to
release, so it is read from the wrapper's own source, never listed by version:

1. the class in the linted tree, when it is defined there;
2. else the installed package's source, found on the import path without importing
   anything (:class:`importlib.machinery.PathFinder` per package level; re-exports followed
   through ``from .x import C`` and ``_import_structure["x"] = ["C"]``), read as text and
   parsed;
3. else a built-in assumption, which ``--statistics`` names as one.

The reading (:func:`read_wrapper`) is general: in any function of the class (a method, or
a function nested in one, as a wrapper installed by ``__init_subclass__``) that passes its
``**kwargs`` to a checkpoint call, every ``kwargs["k"] = None``/``False``, ``kwargs.pop("k")``,
``del kwargs["k"]``, ``kwargs.update(k=None)`` and ``for k in ("a", "b"): ... kwargs[k] =
None`` before that call clears ``k``; one under ``if not self.<flag>:`` clears it unless
the layer class sets ``<flag> = True``.
"""

from __future__ import annotations

import ast
import os
import sys
from dataclasses import dataclass
from importlib.machinery import PathFinder
from typing import Iterable, Iterator, Mapping

from recheck.lint.imports import import_aliases
from recheck.lint.targets import ENTRY_ATTRIBUTES, ENTRY_POINTS, PARTIALS

__all__ = ["ASSUMED", "Wrapper", "find_wrapper", "installed", "installed_class", "installed_source", "read_wrapper",
           "unchanged"]


@dataclass(frozen=True)
class Wrapper:
    """What a checkpointing base class passes the function it checkpoints."""

    qualified: str
    #: keyword arguments it sets to None or False (or drops), each with the class flag that
    #: keeps it when true ("" when always cleared)
    cleared: tuple[tuple[str, str], ...]
    #: "forward" or "__call__" (hooks run inside the region), "" when not seen
    checkpoints: str
    #: where it was read: "path/to/file.py", or "" for the built-in assumption
    source: str

    def cleared_for(self, flags: Mapping[str, bool]) -> set[str]:
        """The keywords cleared for a layer class whose lineage sets ``flags``."""
        return {name for name, flag in self.cleared if not (flag and flags.get(flag))}


#: The fallback when a wrapper's source is nowhere to be read: the union of the spellings of
#: transformers' releases (4.5x ``past_key_value(s)``, 5.2x ``cache``), cleared unless the
#: layer sets ``_can_checkpoint_with_cache``.
ASSUMED: dict[str, Wrapper] = {
    "GradientCheckpointingLayer": Wrapper(
        "GradientCheckpointingLayer",
        tuple((name, "_can_checkpoint_with_cache")
              for name in ("cache", "layer_past", "past_key_value", "past_key_values")) + (("use_cache", ""),),
        "forward", ""),
}

MAX_REEXPORTS = 4
MAX_FILES = 32


def _dotted(node: ast.AST) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    elif isinstance(node, ast.Call):
        parts.append(_dotted(node.func) + "()")
    return ".".join(reversed(parts))


def _is_checkpoint(call: ast.Call, imports: Mapping[str, str]) -> bool:
    func = call.func
    if isinstance(func, ast.Attribute) and func.attr in ENTRY_ATTRIBUTES:
        return True
    name = _dotted(func)
    head, _, rest = name.partition(".")
    qualified = imports.get(head, head) + (f".{rest}" if rest else "")
    return qualified in ENTRY_POINTS


def _splats(call: ast.Call, kwargs: str) -> bool:
    """Whether ``call`` (or the ``partial`` it is handed) passes ``**kwargs`` on."""
    nodes = [call, *(a for a in call.args if isinstance(a, ast.Call))]
    return any(k.arg is None and isinstance(k.value, ast.Name) and k.value.id == kwargs
               for node in nodes for k in node.keywords)


def _region_kind(call: ast.Call, imports: Mapping[str, str]) -> str:
    if not call.args:
        return ""
    region = call.args[0]
    if isinstance(region, ast.Call) and region.args and (
            imports.get(_dotted(region.func), _dotted(region.func)) in PARTIALS or _dotted(region.func) in PARTIALS):
        region = region.args[0]
    name = _dotted(region)
    last = name.rsplit(".", 1)[-1]
    return last if last in ("forward", "__call__") else ""


def _constant_names(node: ast.AST) -> list[str]:
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return []


def _cleared(body: list[ast.stmt], kwargs: str, flag: str, loop: Mapping[str, list[str]],
             found: dict[str, str]) -> None:
    """Record in ``found`` the keywords ``body`` clears in the dict ``kwargs`` (name -> flag)."""

    def keys(node: ast.AST) -> list[str]:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return [node.value]
        if isinstance(node, ast.Name):
            return list(loop.get(node.id, ()))
        return []

    def is_kwargs(node: ast.AST) -> bool:
        return isinstance(node, ast.Name) and node.id == kwargs

    def clear(names: Iterable[str]) -> None:
        for name in names:
            if found.get(name) != "":  # cleared unconditionally somewhere wins
                found[name] = flag

    for statement in body:
        if isinstance(statement, ast.Assign) and isinstance(statement.value, ast.Constant) \
                and statement.value.value in (None, False):
            for target in statement.targets:
                if isinstance(target, ast.Subscript) and is_kwargs(target.value):
                    clear(keys(target.slice))
        elif isinstance(statement, ast.Delete):
            for target in statement.targets:
                if isinstance(target, ast.Subscript) and is_kwargs(target.value):
                    clear(keys(target.slice))
        elif isinstance(statement, ast.If):
            test = statement.test
            gate = flag
            if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not) and isinstance(test.operand, ast.Attribute) \
                    and isinstance(test.operand.value, ast.Name) and test.operand.value.id == "self":
                gate = test.operand.attr
            _cleared(statement.body, kwargs, gate, loop, found)
            _cleared(statement.orelse, kwargs, flag, loop, found)
            continue
        elif isinstance(statement, ast.For) and isinstance(statement.target, ast.Name):
            names = _constant_names(statement.iter)
            _cleared(statement.body, kwargs, flag, {**loop, statement.target.id: names} if names else loop, found)
            continue
        elif isinstance(statement, (ast.With, ast.Try)):
            _cleared(statement.body, kwargs, flag, loop, found)
            continue
        for node in ast.walk(statement) if isinstance(statement, ast.Expr) or isinstance(statement, ast.Assign) else ():
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and is_kwargs(node.func.value):
                if node.func.attr == "pop" and node.args:
                    clear(keys(node.args[0]))
                elif node.func.attr == "update":
                    clear(k.arg for k in node.keywords
                          if k.arg and isinstance(k.value, ast.Constant) and k.value.value in (None, False))


def _functions(node: ast.AST) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    for child in ast.walk(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield child


def _own_calls(function: ast.AST) -> Iterator[ast.Call]:
    """The calls in ``function``'s body, not in the functions nested in it."""
    stack = list(ast.iter_child_nodes(function))
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        if isinstance(node, ast.Call):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def read_wrapper(cls: ast.ClassDef, imports: Mapping[str, str], qualified: str, source: str) -> Wrapper | None:
    """What ``cls`` does to the arguments it checkpoints with, or None when no function of
    it passes its ``**kwargs`` to a checkpoint entry point."""
    for function in _functions(cls):
        kwargs = function.args.kwarg.arg if function.args.kwarg is not None else None
        if kwargs is None:
            continue
        calls = [c for c in _own_calls(function) if _is_checkpoint(c, imports) and _splats(c, kwargs)]
        if not calls:
            continue
        found: dict[str, str] = {}
        _cleared(function.body, kwargs, "", {}, found)
        return Wrapper(qualified, tuple(sorted(found.items())), _region_kind(calls[0], imports), source)
    return None


def _find(parts: list[str], path: list[str] | None) -> tuple[str, bool] | None:
    """The file of module ``parts`` (and whether it is a package), found level by level
    with :class:`PathFinder`, which imports nothing."""
    origin, is_package = None, False
    for depth, part in enumerate(parts):
        try:
            spec = PathFinder.find_spec(part, path)
        except (ImportError, ValueError, OSError):
            return None
        if spec is None:
            return None
        path = list(spec.submodule_search_locations or [])
        origin, is_package = spec.origin, bool(spec.submodule_search_locations)
        if depth < len(parts) - 1 and not path:
            return None
    if origin is None or not origin.endswith(".py") or not os.path.isfile(origin):
        return None
    return origin, is_package


def _lazy_exports(tree: ast.Module, name: str) -> Iterator[str]:
    """``_import_structure["x"] = ["C"]`` / ``{"x": ["C"]}``: the submodules that define ``name``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, (ast.List, ast.Tuple)) \
                and name in _constant_names(node.value):
            for target in node.targets:
                if isinstance(target, ast.Subscript) and isinstance(target.slice, ast.Constant) \
                        and isinstance(target.slice.value, str):
                    yield target.slice.value
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values):
                if isinstance(key, ast.Constant) and isinstance(key.value, str) and name in _constant_names(value):
                    yield key.value


def installed_source(qualified: str, search: list[str] | None = None,
                     visited: list[str] | None = None) -> tuple[ast.ClassDef, dict[str, str], str, str] | None:
    """The class ``qualified`` as defined in the installed package's source on the import path
    (``search``, default ``sys.path``): its node, its module's imports, its qualified name
    where it is defined and the file; None when it cannot be found.  Nothing is imported.
    Re-exports are followed (``from .x import C``, ``_import_structure["x"] = ["C"]``, ``from
    .x import *``), at most :data:`MAX_REEXPORTS` deep and :data:`MAX_FILES` files in all.
    ``visited`` collects the files read."""
    return _defined(qualified, search if search is not None else _search(), visited, set(), 0)


def _defined(qualified: str, search: list[str], visited: list[str] | None, seen: set[str],
             depth: int) -> tuple[ast.ClassDef, dict[str, str], str, str] | None:
    module, _, name = qualified.rpartition(".")
    if not module or module in seen or depth > MAX_REEXPORTS or len(seen) >= MAX_FILES:
        return None
    seen.add(module)
    found = _find(module.split("."), search)
    if found is None:
        return None
    origin, is_package = found
    if visited is not None:
        visited.append(origin)
    try:
        with open(origin, "rb") as handle:
            tree = ast.parse(handle.read(), origin)
    except (OSError, SyntaxError, ValueError, RecursionError):
        return None
    imports = import_aliases(ast.walk(tree), module, is_package)
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node, imports, f"{module}.{name}", origin
    target = imports.get(name)  # from .modeling_layers import GradientCheckpointingLayer
    lazy = next(_lazy_exports(tree, name), None) if target is None and is_package else None
    if target is not None or lazy is not None:
        return _defined(target or f"{module}.{lazy}.{name}", search, visited, seen, depth + 1)
    for alias, source in imports.items():  # from .modules import *
        if alias[:1] == "*":
            found_there = _defined(f"{source}.{name}", search, visited, seen, depth + 1)
            if found_there is not None:
                return found_there
    return None


def _search() -> list[str]:
    """The import path of the interpreter running the lint (``""`` is the working folder)."""
    return [p or os.getcwd() for p in sys.path]


def installed(package: str) -> bool:
    """Whether the top-level ``package`` is on the import path (nothing is imported)."""
    return _find([package], _search()) is not None


def installed_class(qualified: str, read: dict[str, list[str]]) -> tuple[str, str, str] | None:
    """Where the installed package defines the class ``qualified`` (followed through its
    re-exports, see :func:`installed_source`): its file, its module and its qualified name
    there; None when it is not installed or does not define it.  ``read`` records the
    stamps of the files read (see :func:`unchanged`)."""
    visited: list[str] = []
    found = installed_source(qualified, _search(), visited)
    read[qualified] = _stamps(visited)
    if found is None:
        return None
    defined, origin = found[2], found[3]
    return origin, defined.rpartition(".")[0], defined


def _class_node(tree: ast.Module, qualname: str) -> ast.ClassDef | None:
    body: list[ast.stmt] = tree.body
    node = None
    for part in qualname.split("."):
        node = next((n for n in body if isinstance(n, ast.ClassDef) and n.name == part), None)
        if node is None:
            return None
        body = node.body
    return node


def find_wrapper(qualified: str, in_tree: tuple[str, str, str, str] | None,
                 read: dict[str, list[str]] | None = None) -> Wrapper | None:
    """What the checkpointing base class ``qualified`` does to its arguments: read from
    ``in_tree`` (path, module, class qualname and text of its file in the linted tree) when
    given, else from the installed package (None when neither has it).  ``read`` collects,
    for an installed lookup, the stamps of the files it read (see :func:`unchanged`)."""
    if in_tree is not None:
        path, module, qualname, text = in_tree
        try:
            tree = ast.parse(text, path)
        except (SyntaxError, ValueError, RecursionError):
            return None
        node = _class_node(tree, qualname)
        is_package = os.path.basename(path) == "__init__.py"
        return read_wrapper(node, import_aliases(ast.walk(tree), module, is_package), qualified, path) if node is not None else None
    search = tuple(_search())
    cached = _INSTALLED.get((qualified, search))
    if cached is None or _stamps(cached[1]) != list(cached[1]):
        visited: list[str] = []
        found = installed_source(qualified, list(search), visited)
        cached = (read_wrapper(*found) if found is not None else None, tuple(_stamps(visited)))
        _INSTALLED[(qualified, search)] = cached
    if read is not None:
        read[qualified] = list(cached[1])
    return cached[0]


#: installed lookups of this process, with the stamps of the files each read (a file that
#: changed since, as on an upgrade, makes it look again)
_INSTALLED: dict[tuple[str, tuple[str, ...]], tuple[Wrapper | None, tuple[str, ...]]] = {}


def _stamps(files: Iterable[str]) -> list[str]:
    """``path|mtime_ns|size`` of each file (``path|-`` when it is gone); a stamp given back
    is taken apart again."""
    stamps = []
    for entry in files:
        path = entry.split("|", 1)[0]
        try:
            status = os.stat(path)
        except OSError:
            stamps.append(f"{path}|-")
            continue
        stamps.append(f"{path}|{status.st_mtime_ns}|{status.st_size}")
    return stamps


def unchanged(read: Mapping[str, list[str]]) -> bool:
    """Whether installed lookups recorded by :func:`find_wrapper` would read the same now:
    every file they read is unchanged, and a package that was not found is still not."""
    for qualified, stamps in read.items():
        if stamps:
            if _stamps(stamps) != stamps:
                return False
        elif installed(qualified.split(".", 1)[0]):
            return False
    return True
