"""The change that keeps a suggested plan in the user's code, for a model that does not checkpoint yet.

The first shape the code allows:

* the plan checkpoints selectively: no one-line torch call spells its policy, so the plan is
  kept with ``recheck.apply_plan(model, "plan.json")`` (``--save-plan plan.json`` writes it);
* every planned block is called from one line of the user's code (a loop over ``self.layers``):
  that call becomes ``checkpoint(block, x, use_reentrant=False)``, under a condition naming the
  planned blocks when the plan checkpoints only some of that line's blocks;
* otherwise (the blocks run inside ``Sequential.forward``, or from several lines): torch's
  ``apply_activation_checkpointing`` once the model is built, with a ``check_fn`` naming the
  blocks by class when the plan checkpoints every module of those classes, else one by one.

A model that checkpoints already gets no change (the plan names which of its calls to keep).
"""

from __future__ import annotations

import ast
import linecache
import os
from dataclasses import asdict, dataclass
from typing import Any

import torch

from recheck.cost.planner.candidates import CONTAINERS, Candidate, Candidates
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
    if not chosen:
        return Change("the step fits the budget without checkpointing: change nothing", "")
    if "selective" in variants.values():
        return Change("the plan checkpoints selectively, saving the matrix products, which no one-line torch call "
                      "spells: write it with --save-plan plan.json and apply it once the model is built",
                      'recheck.apply_plan(model, "plan.json")', "import recheck")
    sites = {(c.site.file, c.site.line) for c in chosen if c.site is not None}
    if len(sites) == 1 and all(c.site is not None for c in chosen):
        file, line = sites.pop()
        if not file.startswith(_TORCH):
            change = _in_the_line(candidates, chosen, file, line)
            if change is not None:
                return change
            why = f"the line that calls them ({_shown(file)}:{line}) is not one call a checkpoint can wrap"
        else:
            container = candidates.root.get_submodule(chosen[0].container or "")
            why = f"the blocks run inside torch's {type(container).__name__}.forward, not a line of your code"
    else:
        why = "the blocks are called from several lines"
    return _wrapped(candidates, chosen, why)


def _shown(file: str) -> str:
    relative = os.path.relpath(file) if os.path.isabs(file) else file
    return file if relative.startswith("..") else relative


def _resolve(node: ast.expr, names: dict[str, Any]) -> Any:
    """The module ``node`` names in the frame whose ``names`` were kept, read without running user code."""
    if isinstance(node, ast.Name):
        return names.get(node.id)
    if isinstance(node, ast.Attribute):
        base = _resolve(node.value, names)
        return base._modules.get(node.attr) if isinstance(base, torch.nn.Module) else None
    if isinstance(node, ast.Subscript):
        base, index = _resolve(node.value, names), node.slice
        position = index.value if isinstance(index, ast.Constant) else _resolve(index, names)
        if isinstance(base, CONTAINERS) and isinstance(position, int) and not isinstance(position, bool):
            members = list(base._modules.values())
            return members[position] if -len(members) <= position < len(members) else None
    return None


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


def _condition(name: str, chosen: list[Candidate], candidates: Candidates, names: dict[str, Any]) -> str | None:
    """``block in self.layers[0:3:2]``: true for exactly the chosen blocks of one container."""
    if len({c.container for c in chosen}) != 1:
        return None
    container = candidates.root.get_submodule(chosen[0].container or "")
    owner = names.get("self")
    base = None
    if isinstance(owner, torch.nn.Module):
        path = next((p for p, m in owner.named_modules() if m is container), None)
        base = _expression("self", owner, path) if path is not None else None
    base = base or _expression("model", candidates.root, chosen[0].container or "")
    members = list(container._modules.values())
    positions = sorted(next(i for i, m in enumerate(members) if m is c.module) for c in chosen)
    if len(positions) == 1:
        return f"{name} is {base}[{positions[0]}]"
    steps = {b - a for a, b in zip(positions, positions[1:])}
    if len(steps) == 1:
        step = steps.pop()
        return f"{name} in {base}[{positions[0]}:{positions[-1] + 1}{f':{step}' if step > 1 else ''}]"
    return f"{name} in ({', '.join(f'{base}[{p}]' for p in positions)})"


def _in_the_line(candidates: Candidates, chosen: list[Candidate], file: str, line: int) -> Change | None:
    """The line calling the blocks, with that call checkpointed; None when it is not one plain call."""
    text = linecache.getline(file, line).strip()
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return None
    first = chosen[0]
    assert first.site is not None
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and _resolve(n.func, first.site.names) is first.module]
    if len(calls) != 1:
        return None
    call = calls[0]
    original, function = ast.get_source_segment(text, call), ast.get_source_segment(text, call.func)
    arguments = [ast.get_source_segment(text, a) for a in [*call.args, *call.keywords]]
    if original is None or function is None or None in arguments:
        return None
    wrapped = f"checkpoint({', '.join([function, *arguments, 'use_reentrant=False'])})"  # type: ignore[list-item]
    there = [c for c in candidates.units if c.site is not None and (c.site.file, c.site.line) == (file, line)]
    if len(chosen) < len(there):
        condition = _condition(function, chosen, candidates, first.site.names)
        if condition is None:
            return None
        wrapped = f"({wrapped} if {condition} else {original})"
    where = f"{_shown(file)}:{line}"
    return Change(f"the blocks are called from one line of your code, {where}", text.replace(original, wrapped, 1),
                  "from torch.utils.checkpoint import checkpoint", where, text)


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
    return Change(f"{why}: wrap them once the model is built (model: your {candidates.root_name})",
                  f"apply_activation_checkpointing(model, check_fn=lambda m: {check})", _WRAPPER)
