"""Turning test-made source text or a fixture file into a real module (shared test helper).

Code executed here behaves like imported code: ``inspect.getsource``, tracebacks and
recheck's ``file:line`` region names work (the text is registered in ``linecache``),
dataclasses and pickle find the module in ``sys.modules``.  ``tests/`` is on ``sys.path``
because of ``tests/conftest.py``, so every test directory imports this as ``source_modules``.
"""

from __future__ import annotations

import importlib.util
import itertools
import linecache
import sys
import types
from functools import cache
from pathlib import Path

__all__ = ["exec_source", "load_file"]

_numbers = itertools.count()


def exec_source(source: str, label: str, prefix: str = "recheck_test_module") -> types.ModuleType:
    """Execute ``source`` as a fresh module named ``<prefix>_<n>``, shown as file ``<label>``."""
    name = f"{prefix}_{next(_numbers)}"
    filename = f"<{label}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    module = types.ModuleType(name)
    module.__file__ = filename
    sys.modules[name] = module
    exec(compile(source, filename, "exec"), module.__dict__)  # noqa: S102 - test-made source
    return module


@cache
def load_file(path: Path, name: str) -> types.ModuleType:
    """Import the file at ``path`` once, registered in ``sys.modules`` as ``name``."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
