"""RC110: a reentrantly checkpointed region returns a dict, a list, a dataclass or a ModelOutput.

The reentrant implementation is an ``autograd.Function``: it runs the region under
``no_grad`` and links to the graph only the tensors that are its *direct* outputs (a tensor
or a tuple of them).  A tensor inside a dict, a list or a dataclass is returned as it was
computed, under ``no_grad``: it does not require grad, and nothing before the region gets a
gradient through it.  No error, no warning; the layers before the region simply stop
learning.  Non-reentrant checkpointing keeps the graph whatever the container.

Judged at the region's own function (what the checkpoint call runs): a ``return`` that builds
a dict or a list, or calls a class the tree declares a dataclass or a ``ModelOutput`` (or an
outside class named ``...Output``), or a return annotation naming one of them.  Only where
the call is known to run the reentrant implementation (``use_reentrant=True``, or left out on
an entry point whose default is reentrant).
"""

from __future__ import annotations

from typing import Callable, Iterator

from recheck.lint.facts import Hazard
from recheck.lint.rules.base import RegionHit, RegionView, Rule

CODE = "RC110"
#: outside container classes and annotations, by last name
CONTAINERS = frozenset({"dict", "Dict", "OrderedDict", "Mapping", "MutableMapping", "list", "List", "ModelOutput"})
THEN = ("the reentrant checkpoint links only the tensors it returns directly, so these are cut from the graph "
        "and what comes before the region gets no gradient; return a tensor or a tuple, or pass `use_reentrant=False`")

#: ``lookup(qualified)``: ``(is a dataclass, base names)`` of a class in the tree, None outside it
Lookup = Callable[[str], "tuple[bool, list[str]] | None"]


def _describe(qualified: str, lookup: Lookup) -> str | None:
    """What a returned class or annotation is when it is a container, else None."""
    short = qualified.rsplit(".", 1)[-1]
    if short in CONTAINERS:
        return f"a `{short}`"
    found = lookup(qualified)
    if found is None:
        return f"a `{short}`" if short.endswith("Output") and short != "Output" else None
    dataclass, bases = found
    if any(b.rsplit(".", 1)[-1] in ("tuple", "NamedTuple", "Tensor") for b in bases):
        return None  # a named tuple or a tensor subclass: autograd sees its tensors
    if dataclass:
        return f"dataclass `{short}`"
    if any(b.rsplit(".", 1)[-1] in CONTAINERS or b.endswith("Output") for b in bases):
        return f"`{short}` (a container)"
    return None


class ContainerOutput(Rule):
    CODE = CODE

    def region(self, view: RegionView) -> Iterator[RegionHit]:
        """Each ``return`` of the region's root function that builds a container, or the function
        when only its annotation says so; for reentrant regions only."""
        if not view.reentrant:
            return
        function, path, found = view.region.function, view.region.file.path, False
        for span, built in function.returned:
            what = {"dict": "a dict", "list": "a list"}.get(built) or _describe(built[len("call:"):], view.class_info)
            if what:
                found = True
                yield path, Hazard(CODE, span, f"the region returns {what} under reentrant checkpointing", THEN)
        if not found and function.returns_annotation:
            what = _describe(function.returns_annotation, view.class_info)
            if what:
                yield path, Hazard(CODE, function.span,
                                   f"the region is annotated to return {what} under reentrant checkpointing", THEN)


# -- cases: whole modules, run by tests/lint/test_rule_tables.py; INVALID gives (line, column,
# part of the message) per finding
_MOE = '''\
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


@dataclass
class GateOutput:
    hidden: torch.Tensor
    aux_loss: torch.Tensor


class MoEGate(nn.Module):
    def __init__(self):
        super().__init__()
        self.router = nn.Linear(16, 4)
        self.experts = nn.ModuleList(nn.Linear(16, 16) for _ in range(4))

    def forward(self, x):
        probs = self.router(x).softmax(-1)
        hidden = sum(p.unsqueeze(-1) * e(x) for p, e in zip(probs.unbind(-1), self.experts))
        return {returned}


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate = MoEGate()

    def forward(self, x):
        out = checkpoint(self.gate, x{keywords})
        return out
'''
_DATACLASS = "GateOutput(hidden, probs.var())"
_DICT = '{"hidden": hidden, "aux_loss": probs.var()}'
_TUPLE = "hidden, probs.var()"
_ANNOTATED = '''\
from typing import Dict

import torch
from torch.utils.checkpoint import checkpoint


def attend(q: torch.Tensor, k: torch.Tensor) -> Dict[str, torch.Tensor]:
    scores = q @ k.transpose(-1, -2)
    out = {}
    out["weights"] = scores.softmax(-1)
    return out


def run(q, k):
    return checkpoint(attend, q, k, use_reentrant=True)
'''
INVALID = [
    (_MOE.format(returned=_DATACLASS, keywords=", use_reentrant=True"),
     [(23, 16, "the region returns dataclass `GateOutput` under reentrant checkpointing")]),
    (_MOE.format(returned=_DICT, keywords=""),  # torch's default is reentrant
     [(23, 16, "the region returns a dict under reentrant checkpointing")]),
    (_ANNOTATED, [(7, 1, "the region is annotated to return a `Dict` under reentrant checkpointing")]),
]
VALID = [
    _MOE.format(returned=_DATACLASS, keywords=", use_reentrant=False"),
    _MOE.format(returned=_TUPLE, keywords=", use_reentrant=True"),
    _ANNOTATED.replace("use_reentrant=True", "use_reentrant=False"),
]
