"""The change that keeps a suggested plan in the user's code, for a model that does not checkpoint yet.

The first shape the code allows, in the order of docs/cost.md: ``recheck.apply_plan`` for a
selective plan (no one-line torch call spells its policy); the one line of the user's code that
calls the blocks, its call wrapped in ``checkpoint(...)`` (under a condition naming the planned
blocks when only some are); else torch's ``apply_activation_checkpointing`` once the model is
built.  A model that checkpoints already gets no change (the plan names which calls to keep).
"""

from __future__ import annotations

import ast
import linecache
import os
from dataclasses import asdict, dataclass
from typing import Any

import torch

from recheck.cost.planner.candidates import CONTAINERS, Candidate, Candidates, Site
from recheck.cost.planner.plans import Plan

__all__ = ["Change", "change_for"]

_TORCH = os.path.dirname(torch.__file__) + os.sep
_WRAPPER = "from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import apply_activation_checkpointing"


@dataclass(frozen=True)
class Change:
    """What to write: ``code`` (empty: nothing to change), replacing ``before`` at ``where`` when set."""

    how: str
    code: str
    imports: str = ""
    where: str | None = None
    before: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def change_for(candidates: Candidates, plan: Plan) -> Change | None:
    """The change that keeps ``plan``, or None when the step checkpoints already."""
    if any(c.written for c in candidates.items):
        return None
    variants = plan.variants
    chosen = [c for c in candidates.units if c.name in variants]
    if not {id(c.module) for c in chosen} <= {id(m) for m in candidates.root.modules()}:
        return None  # blocks of several models: a plan's paths name one
    if not chosen:
        return Change("the step fits the budget without checkpointing: change nothing", "")
    if "selective" in variants.values():
        return Change("the plan checkpoints selectively, saving the matrix products, which no one-line torch call "
                      "spells: write it with --save-plan plan.json and apply it once the model is built",
                      'recheck.apply_plan(model, "plan.json")', "import recheck")
    sites = [c.site for c in chosen]
    site = sites[0]
    if all(s is not None and s.file.startswith(_TORCH) for s in sites):
        owners = "/".join(sorted({type(s.owner).__name__ for s in sites if s is not None}))
        why = f"the blocks run inside torch's {owners}.forward, not a line of your code"
    elif site is None or any(s is None or _span(s) != _span(site) for s in sites):
        why = "the blocks are called from several places"
    elif any(part in site.file for part in ("site-packages", "dist-packages")):
        why = f"the blocks are called inside an installed library ({_shown(site.file)}:{site.line})"
    else:
        change = _in_the_line(candidates, chosen, site)
        if change is not None:
            return change
        why = f"the call of the blocks at {_shown(site.file)}:{site.line} is not one line a checkpoint can wrap"
    return _wrapped(candidates, chosen, why)


def _span(site: Site) -> tuple[str, int, int]:
    return site.file, site.line, site.column


def _shown(file: str) -> str:
    """``file`` relative to the working directory when under it, to its library's folder when installed."""
    for folder in ("site-packages", "dist-packages"):
        if f"{os.sep}{folder}{os.sep}" in file:
            return file.rpartition(f"{os.sep}{folder}{os.sep}")[2]
    relative = os.path.relpath(file) if os.path.isabs(file) else file
    return file if relative.startswith("..") else relative


def _expression(base: str, root: torch.nn.Module, path: str) -> str:
    """Python for the module at ``path`` under ``root``, which the code calls ``base``."""
    text, module = base, root
    for part in path.split(".") if path else ():
        child = module.get_submodule(part)
        if isinstance(module, torch.nn.ModuleDict):
            text += f"[{part!r}]"
        elif isinstance(module, CONTAINERS):
            text += f"[{list(module._modules).index(part)}]"
        elif part.isidentifier():
            text += f".{part}"
        else:
            return f"{base}.get_submodule({path!r})"
        module = child
    return text


def _condition(name: str, chosen: list[Candidate], candidates: Candidates, owner: torch.nn.Module | None) -> str | None:
    """``block in self.layers[0:3:2]``: true for exactly the chosen blocks of one container."""
    parents = {id(child): parent for parent in candidates.root.modules() for child in parent.children()}
    containers = {id(parents.get(id(c.module))) for c in chosen}
    container = parents.get(id(chosen[0].module))
    if len(containers) != 1 or container is None:
        return None
    paths = {id(m): p for p, m in (owner or candidates.root).named_modules()}
    if id(container) not in paths:
        return None
    base = _expression("self" if owner is not None else "model", owner or candidates.root, paths[id(container)])
    members = list(container._modules.values())
    positions = sorted(next(i for i, m in enumerate(members) if m is c.module) for c in chosen)
    steps = {b - a for a, b in zip(positions, positions[1:])} or {1}
    if len(steps) == 1:
        step = steps.pop()
        return f"{name} in {base}[{positions[0]}:{positions[-1] + 1}{f':{step}' if step > 1 else ''}]"
    return f"{name} in ({', '.join(f'{base}[{p}]' for p in positions)})"


def _in_the_line(candidates: Candidates, chosen: list[Candidate], site: Site) -> Change | None:
    """The line calling the blocks, with that call checkpointed; None when it spans lines or is not a call."""
    line = linecache.getline(site.file, site.line).encode()
    original = line[site.column:site.end_column].decode(errors="replace")
    try:
        call = ast.parse(original, mode="eval").body if site.line == site.end_line else None
    except SyntaxError:
        return None
    if not isinstance(call, ast.Call):
        return None
    function = ast.get_source_segment(original, call.func) or ""
    arguments = [ast.get_source_segment(original, a) or "" for a in [*call.args, *call.keywords]]
    wrapped = f"checkpoint({', '.join([function, *arguments, 'use_reentrant=False'])})"
    if len(chosen) < sum(c.site is not None and _span(c.site) == _span(site) for c in candidates.units):
        condition = _condition(function, chosen, candidates, site.owner)
        if condition is None:
            return None
        wrapped = f"({wrapped} if {condition} else {original})"
    where = f"{_shown(site.file)}:{site.line}"
    code = (line[:site.column] + wrapped.encode() + line[site.end_column:]).decode(errors="replace").strip()
    return Change(f"the blocks are called from one line of your code, {where}", code,
                  "from torch.utils.checkpoint import checkpoint", where, line.decode(errors="replace").strip())


def _wrapped(candidates: Candidates, chosen: list[Candidate], why: str) -> Change:
    """``apply_activation_checkpointing`` on the chosen blocks, by class when that names exactly them."""
    classes = list(dict.fromkeys(type(c.module) for c in chosen))
    chosen_ids = {id(c.module) for c in chosen}
    by_class = {id(m) for m in candidates.root.modules() if isinstance(m, tuple(classes))}
    if by_class == chosen_ids:
        names = ", ".join(cls.__name__ for cls in classes)
        check = f"isinstance(m, {names if len(classes) == 1 else f'({names})'})"
    else:
        check = f"m in {{{', '.join(_expression('model', candidates.root, c.name) for c in chosen)}}}"
    return Change(f"{why}, so wrap them once the model is built (model is your {candidates.root_name})",
                  f"apply_activation_checkpointing(model, check_fn=lambda m: {check})", _WRAPPER)
