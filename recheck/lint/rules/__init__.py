"""The rules, one module each, found by their file names (``rc<NNN>_<name>.py``).

A rule module exposes ``CODE`` and one of:

* ``NODES`` and ``check(node, ctx)``: a *body rule* (RC101-RC108), which yields
  :class:`~recheck.lint.facts.Hazard` for one AST node of a function body; the hazards count
  only if the function turns out to be checkpointed;
* ``check_site``: a call-site rule (RC001, RC002);
* ``check_class``: RC003, which judges ``autograd.Function`` classes wherever they are.

A body rule also carries its own table of cases (Fixit's style), which ``tests/lint`` runs for
every rule found here: ``INVALID``, a list of ``(region body, [(line, column, message part)])``,
and ``VALID``, a list of region bodies it must leave alone.  Adding a body rule is two files:
its module here and its document in ``rules/`` (``RC<NNN>-<name>.md``, which gives the rule
its name, summary and advice).
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from types import ModuleType

from recheck.catalogue import FIXABLE

__all__ = ["ALL_CODES", "BODY_RULES", "FIXABLE", "RULE_MODULES"]

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


#: every rule module, by code
RULE_MODULES: tuple[ModuleType, ...] = _discover()
#: the rules that judge one node of a function body
BODY_RULES: tuple[ModuleType, ...] = tuple(m for m in RULE_MODULES if hasattr(m, "NODES") and hasattr(m, "check"))
ALL_CODES: tuple[str, ...] = tuple(m.CODE for m in RULE_MODULES)
