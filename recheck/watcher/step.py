"""``recheck check --step file.py:fn``: run one zero-argument training step under ``watch()``."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any, Callable

from recheck.findings import Report
from recheck.watcher.session import watch

__all__ = ["StepError", "load_step", "run_step"]


class StepError(ValueError):
    """The ``file.py:fn`` target cannot be loaded or is not a zero-argument callable."""


def load_step(target: str) -> Callable[[], Any]:
    """The callable named by ``path/to/file.py:function`` (the file is run as a module)."""
    path_text, sep, name = target.rpartition(":")
    if not sep or not path_text or not name:
        raise StepError(f"expected FILE.py:FUNCTION, got {target!r}")
    path = Path(path_text)
    if not path.is_file():
        raise StepError(f"{path}: no such file")
    module_name = f"_recheck_step_{path.stem}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise StepError(f"{path}: cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    sys.path.insert(0, str(path.resolve().parent))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(path.resolve().parent))
    step = getattr(module, name, None)
    if step is None:
        raise StepError(f"{path} defines no {name!r}")
    if not callable(step):
        raise StepError(f"{path}:{name} is not callable")
    return step


def run_step(target: str, **watch_options: Any) -> Report:
    """Load ``file.py:fn``, call it once inside ``watch(**watch_options)`` and return the report.

    ``raise_on_finding`` defaults to False here: the caller prints the report and
    chooses the exit code.  Exceptions raised by the step itself propagate.
    """
    step = load_step(target)
    watch_options.setdefault("raise_on_finding", False)
    with watch(**watch_options) as watcher:
        step()
    return watcher.report
