"""A small grammar of checkpointed region programs, with hypothesis strategies that build them.

A :class:`Program` is a list of statements on a hidden state ``h`` (shape ``[BATCH, WIDTH]``).
It is compiled to real Python source, either as an ``nn.Module`` class with a ``forward`` or as
a closure, and executed in a fresh module (registered in ``sys.modules`` and ``linecache``), so
the checker sees ordinary code: ``global`` statements, attribute writes, calls to ``logging``,
``random``, numpy and explicit generators.

Safe statements keep the region's recomputation exact.  Hazard statements are planted on
purpose and recorded: :meth:`Program.required_kinds` is what a check must report and
:meth:`Program.allowed_kinds` what it may report as well (consequences such as gradients).
"""

from __future__ import annotations

import itertools
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from hypothesis import strategies as st
from source_modules import exec_source

BATCH, WIDTH = 4, 6
ACTIVATIONS = ("torch.tanh", "torch.sigmoid", "torch.relu", "F.gelu", "F.silu")

# name -> (kinds a check must report, kinds it may also report)
HAZARDS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "dropout_unpreserved": (frozenset({"rng"}), frozenset({"recompute", "gradient"})),
    "batchnorm_train": (frozenset({"buffer"}), frozenset({"recompute"})),
    "counter": (frozenset({"state"}), frozenset()),
    "cache_append": (frozenset({"state"}), frozenset()),
    # A global the region rewrites is ``state``; the checker adds ``global`` (its read differs at
    # recompute) only when some computed value differs too.
    "global_write": (frozenset({"state"}), frozenset({"global"})),
    "global_flip": (frozenset({"state"}), frozenset({"global", "recompute", "gradient"})),
    "logging": (frozenset({"side_effect"}), frozenset()),
    "print": (frozenset({"side_effect"}), frozenset()),
    "python_random": (frozenset({"rng"}), frozenset({"recompute", "gradient"})),
    "numpy_random": (frozenset({"rng"}), frozenset({"recompute", "gradient"})),
    "generator": (frozenset({"rng"}), frozenset({"recompute", "gradient"})),
    "input_mutation": (frozenset({"input_mutation"}),
                       frozenset({"recompute", "gradient", "param_version"})),
}
SAFE = ("linear", "conv1d", "activation", "dropout", "batchnorm_eval", "layernorm", "inplace",
        "global_read")

_counter = itertools.count()


@dataclass(frozen=True)
class Statement:
    """One statement of a program: ``op`` is a name from SAFE or HAZARDS; ``arg`` picks a variant."""

    op: str
    arg: int = 0


@dataclass
class Program:
    """A region program; ``form`` is ``"module"`` or ``"closure"``."""

    statements: list[Statement]
    form: str = "module"
    hazards: frozenset[str] = field(default_factory=frozenset)

    @property
    def options(self) -> dict[str, Any]:
        """Extra ``check()`` options the planted hazards need."""
        return {"preserve_rng_state": False} if "dropout_unpreserved" in self.hazards else {}

    def required_kinds(self, use_reentrant: bool) -> frozenset[str]:
        """Kinds a check must report.  A non-reentrant input mutation makes torch raise in
        backward, which may end the step before other hazards show: only it is required then."""
        if "input_mutation" in self.hazards and not use_reentrant:
            return HAZARDS["input_mutation"][0]
        return frozenset().union(*(HAZARDS[h][0] for h in self.hazards))

    def allowed_kinds(self) -> frozenset[str]:
        """Every kind a correct check may report for this program."""
        return frozenset().union(*(HAZARDS[h][0] | HAZARDS[h][1] for h in self.hazards))

    def source(self) -> str:
        """The program as Python source defining ``build()``."""
        return _render(self)

    def build(self) -> tuple[Callable[..., Any], tuple[Any, ...], types.ModuleType]:
        """Compile the program afresh: returns ``(region, args, module)``, seeded."""
        return _build(self)

    def __repr__(self) -> str:  # what hypothesis prints for a failing example
        return f"Program(form={self.form!r}, hazards={sorted(self.hazards)})\n{self.source()}"


def _statement_lines(st_: Statement, index: int, owner: str) -> tuple[list[str], list[str]]:
    """(lines of the region body, lines of build() that create what it needs)."""
    name = f"{owner}m{index}"
    op = st_.op
    if op == "linear":
        return [f"h = {name}(h)"], [f"m{index} = nn.Linear(WIDTH, WIDTH)"]
    if op == "conv1d":
        return ([f"h = {name}(h.unsqueeze(1)).squeeze(1)"],
                [f"m{index} = nn.Conv1d(1, 1, 3, padding=1)"])
    if op == "activation":
        return [f"h = {ACTIVATIONS[st_.arg % len(ACTIVATIONS)]}(h)"], []
    if op in ("dropout", "dropout_unpreserved"):
        return ["h = F.dropout(h, 0.3, training=True)"], []
    if op == "batchnorm_eval":
        return [f"h = {name}(h)"], [f"m{index} = nn.BatchNorm1d(WIDTH).eval()"]
    if op == "batchnorm_train":
        return [f"h = {name}(h)"], [f"m{index} = nn.BatchNorm1d(WIDTH).train()"]
    if op == "layernorm":
        return [f"h = {name}(h)"], [f"m{index} = nn.LayerNorm(WIDTH)"]
    if op == "inplace":
        return ["h = h * 1.5", "h.add_(0.25)"], []
    if op == "global_read":
        return ["h = h + OFFSET"], []
    if op == "counter":
        return [f"{owner}state.calls += 1"], []
    if op == "cache_append":
        return [f"{owner}state.cache.append(h.detach().sum())"], []
    if op == "global_write":
        return ["global WRITES", "WRITES += 1"], []
    if op == "global_flip":
        return ["global SCALE", "scale = SCALE", "SCALE = SCALE * 0.5", "h = h * scale"], []
    if op == "logging":
        return ['LOG.info("h norm %.4f", float(h.detach().norm()))'], []
    if op == "print":
        return ['print("region step", tuple(h.shape))'], []
    if op == "python_random":
        return ["h = h * (0.5 + random.random())"], []
    if op == "numpy_random":
        return ['h = h + torch.from_numpy(np.random.standard_normal(WIDTH).astype("float32"))'], []
    if op == "generator":
        return [f"h = h * (torch.rand(h.shape, generator={owner}gen) > 0.3)"], []
    if op == "input_mutation":
        return ["mask.mul_(2.0)", "h = h * mask"], []
    raise ValueError(f"unknown statement {op!r}")


_HEADER = """\
import logging, random
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

WIDTH = {width}
OFFSET = 0.125
SCALE = 1.0
WRITES = 0
LOG = logging.getLogger({logger!r})
LOG.setLevel(logging.INFO)  # its records are made: a second one is a side effect


class State(nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0
        self.cache = []
"""


def _render(program: Program) -> str:
    owner = "self." if program.form == "module" else ""
    body: list[str] = []
    setup: list[str] = ["state = State()", "gen = torch.Generator().manual_seed(7)"]
    for index, statement in enumerate(program.statements):
        lines, needs = _statement_lines(statement, index, owner)
        body.extend(lines)
        setup.extend(needs)
    names = [f"m{i}" for i, s in enumerate(program.statements)
             if _statement_lines(s, i, owner)[1]] + ["state", "gen"]
    globals_ = sorted({line.split()[1] for line in body if line.startswith("global ")})
    body = [line for line in body if not line.startswith("global ")]
    body.insert(0, "h = x")
    if globals_:
        body.insert(0, "global " + ", ".join(globals_))
    body.append("return h")
    logger = f"region_programs.program{next(_counter)}"
    src = [_HEADER.format(width=WIDTH, logger=logger)]
    if program.form == "module":
        src += ["class Region(nn.Module):", "    def __init__(self, " + ", ".join(names) + "):",
                "        super().__init__()"]
        src += [f"        self.{n} = {n}" for n in names]
        src += ["", "    def forward(self, x, mask):"]
        src += ["        " + line for line in body]
        src += ["", "", "def build():"] + ["    " + line for line in setup]
        src += ["    return Region(" + ", ".join(names) + ")"]
    else:
        src += ["def build():"] + ["    " + line for line in setup]
        src += ["", "    def region(x, mask):"]
        src += ["        " + line for line in body]
        src += ["", "    return region"]
    return "\n".join(src) + "\n"


def _build(program: Program) -> tuple[Callable[..., Any], tuple[Any, ...], types.ModuleType]:
    module = exec_source(program.source(), "region program", prefix="recheck_region_program")
    torch.manual_seed(0)
    region = module.build()
    x = torch.randn(BATCH, WIDTH, requires_grad=True)
    mask = torch.rand(BATCH, WIDTH) + 0.5
    return region, (x, mask), module


def _statement(op: str) -> st.SearchStrategy[Statement]:
    return st.integers(0, len(ACTIVATIONS) - 1).map(lambda arg: Statement(op, arg))


safe_statements = st.sampled_from(SAFE).flatmap(_statement)


@st.composite
def programs(draw: st.DrawFn, hazards: bool = True) -> Program:
    """A program of 1-6 safe statements after a leading linear layer (so some tensor is always
    saved), with 0-3 hazards planted at random positions when ``hazards`` is true."""
    statements = [Statement("linear")] + draw(st.lists(safe_statements, max_size=5))
    planted: set[str] = set()
    if hazards:
        planted = set(draw(st.lists(st.sampled_from(sorted(HAZARDS)), min_size=1, max_size=3,
                                    unique=True)))
        for hazard in sorted(planted):
            position = draw(st.integers(1, len(statements)))
            statements.insert(position, Statement(hazard))
    form = draw(st.sampled_from(("module", "closure")))
    return Program(statements, form, frozenset(planted))
