"""The rules, one module each, found by their file names (``rc<NNN>_<name>.py``).

A rule module defines ``CODE`` and one subclass of :class:`~recheck.lint.rules.base.Rule`,
whose hooks the engine calls (see :mod:`recheck.lint.rules.base`); nothing outside this
package names a rule.  Each module also keeps its own table of cases (Fixit's style), which
``tests/lint`` runs for every rule found here: ``INVALID``, a list of ``(source, [(line,
column, message part)])``, and ``VALID``, a list of sources it must leave alone; a source is
a region body when the module says ``TABLE = "body"`` (the harness checkpoints it), else a
whole module.  Adding a rule is two files: its module here and its document in ``rules/``
(``RC<NNN>-<name>.md``, which gives the rule its name, summary and advice).
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from types import ModuleType

from recheck.catalogue import FIXABLE
from recheck.lint.rules.base import Rule

__all__ = ["ALL_CODES", "FIXABLE", "RULES", "RULE_MODULES", "Rule"]

_MODULE_RE = re.compile(r"^rc(\d{3})_[a-z0-9_]+$")


def _discover() -> tuple[ModuleType, ...]:
    found = []
    for info in pkgutil.iter_modules(__path__):
        match = _MODULE_RE.match(info.name)
        if not match:
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        if getattr(module, "CODE", None) != f"RC{match.group(1)}":
            raise ImportError(f"{module.__name__}: CODE must be 'RC{match.group(1)}', as its file name says")
        found.append(module)
    return tuple(sorted(found, key=lambda m: m.CODE))


def _rule(module: ModuleType) -> Rule:
    classes = [c for _, c in inspect.getmembers(module, inspect.isclass)
               if issubclass(c, Rule) and c is not Rule and c.__module__ == module.__name__]
    if len(classes) != 1 or classes[0].CODE != module.CODE:
        raise ImportError(f"{module.__name__}: must define one Rule subclass with CODE = {module.CODE!r}")
    return classes[0]()


#: every rule module, by code
RULE_MODULES: tuple[ModuleType, ...] = _discover()
#: every rule, by code
RULES: tuple[Rule, ...] = tuple(_rule(m) for m in RULE_MODULES)
ALL_CODES: tuple[str, ...] = tuple(r.CODE for r in RULES)
