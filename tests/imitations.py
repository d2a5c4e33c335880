"""The imitations of DeepSpeed, Megatron-core and fairscale in ``fixtures/implementations/``,
loaded under the real libraries' module names (shared test helper).

``with imitation("deepspeed") as ds:`` registers the fixture as
``deepspeed.runtime.activation_checkpointing.checkpointing`` (and its parent packages, whose
``__file__`` is the fixture's folder, as a real package's is its own), so that recheck finds
and patches it exactly as it patches the real library; on exit ``sys.modules`` is as before
(a real library installed beside stays untouched).
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
import types
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "fixtures" / "implementations"
FILES = {"deepspeed": "deepspeed_checkpointing.py", "megatron": "megatron_random.py",
         "fairscale": "fairscale_checkpointing.py"}


@contextlib.contextmanager
def imitation(library: str) -> Iterator[types.ModuleType]:
    path = FOLDER / FILES[library]
    spec = importlib.util.spec_from_file_location(f"recheck_imitation_{library}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    name = module.IMITATES
    parts = name.split(".")
    saved = {n: sys.modules.get(n) for n in (".".join(parts[:i]) for i in range(1, len(parts) + 1))}
    try:
        for package in list(saved)[:-1]:
            stub = types.ModuleType(package)
            stub.__file__ = str(FOLDER / "__init__.py")
            stub.__path__ = [str(FOLDER)]
            sys.modules[package] = stub
        module.__name__ = name
        sys.modules[name] = module
        yield module
    finally:
        for key, value in saved.items():
            if value is None:
                sys.modules.pop(key, None)
            else:
                sys.modules[key] = value
