"""Cheap name resolution: a file's module name and its table of import aliases.

This replaces libcst's QualifiedNameProvider/ScopeProvider (about six times the cost of
parsing) with one pass over the ``import`` statements: enough to see that ``ckpt`` in
``from torch.utils.checkpoint import checkpoint as ckpt`` is torch's checkpoint, and
that ``from ..llama.modeling_llama import LlamaDecoderLayer`` names a class in another
file of the linted tree.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Iterable

__all__ = ["dotted", "import_aliases", "module_name"]


def module_name(path: Path) -> tuple[str, bool]:
    """The dotted module name of ``path`` (following ``__init__.py`` folders upwards).

    Returns ``(name, is_package)``; ``is_package`` is true for an ``__init__.py``.
    """
    path = path.resolve()
    parts = [] if path.stem == "__init__" else [path.stem]
    folder = path.parent
    while (folder / "__init__.py").is_file() and folder.parent != folder:
        parts.append(folder.name)
        folder = folder.parent
    parts.reverse()
    return ".".join(parts) or path.stem, path.stem == "__init__"


def _absolute(module: str, is_package: bool, level: int, target: str | None) -> str:
    """Resolve a relative import (``level`` dots) against the importing module."""
    if level == 0:
        return target or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)] if level - 1 <= len(base) else []
    return ".".join([*base, *([target] if target else [])])


def import_aliases(nodes: Iterable[ast.AST], module: str, is_package: bool) -> dict[str, str]:
    """Every name the imports among ``nodes`` bind, mapped to its qualified name; a star
    import as ``"*<module>"`` mapped to the module."""
    aliases: dict[str, str] = {}
    for node in nodes:
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    aliases[alias.asname] = alias.name
                else:
                    head = alias.name.split(".")[0]
                    aliases[head] = head
        elif isinstance(node, ast.ImportFrom):
            source = _absolute(module, is_package, node.level, node.module)
            for alias in node.names:
                if alias.name == "*":  # ``from .blocks import *``: ``*<module>``, searched by the index
                    aliases[f"*{source}"] = source
                    continue
                qualified = f"{source}.{alias.name}" if source else alias.name
                aliases[alias.asname or alias.name] = qualified
    return aliases


def dotted(node: ast.AST) -> list[str] | None:
    """``a.b.c`` as ``["a", "b", "c"]``; None for anything that is not a plain name chain."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    parts.reverse()
    return parts
