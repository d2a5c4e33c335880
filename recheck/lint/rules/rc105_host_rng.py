"""RC105: a checkpointed region uses RNG state that checkpoint does not restore."""

from __future__ import annotations

import ast
from typing import Iterator

from recheck.lint.facts import Hazard
from recheck.lint.rules.base import RegionHit, RegionView, Rule
from recheck.lint.scope import FunctionContext

CODE = "RC105"
#: Reseeding a host RNG inside the region makes its later draws repeatable (BigBird does
#: this), so those draws are not reported; the reseed itself is.
SEEDS = {"random.seed": "Python", "numpy.random.seed": "NumPy"}
SEEDING = frozenset({
    "torch.manual_seed", "torch.seed", "torch.random.manual_seed", "torch.random.seed",
    "torch.cuda.manual_seed", "torch.cuda.manual_seed_all", "torch.cuda.seed", "torch.cuda.seed_all",
})


class HostRng(Rule):
    CODE = CODE
    NODES = (ast.Call,)

    def visit(self, node: ast.Call, ctx: FunctionContext) -> Iterator[Hazard]:  # type: ignore[override]
        qualified = ctx.qualify(node.func) or ""
        if qualified in SEEDS:
            yield Hazard(CODE, ctx.span(node), f"`{ctx.source(node.func)}()` reseeds {SEEDS[qualified]}'s global RNG",
                         "recomputation reseeds it again and shifts every later draw outside the region",
                         f"seed:{SEEDS[qualified]}")
        elif qualified.startswith("random.") and qualified.count(".") == 1:
            yield Hazard(CODE, ctx.span(node), f"`{ctx.source(node.func)}()` draws from Python's `random`",
                         "checkpoint does not restore Python's RNG, so recomputation draws a different value", "draw:Python")
        elif qualified.startswith("numpy.random."):
            yield Hazard(CODE, ctx.span(node), f"`{ctx.source(node.func)}()` uses NumPy's RNG",
                         "checkpoint does not restore NumPy's RNG, so recomputation draws a different value", "draw:NumPy")
        elif qualified in SEEDING:
            yield Hazard(CODE, ctx.span(node), f"`{ctx.source(node.func)}()` reseeds torch's RNG",
                         "recomputation reseeds it again and shifts every later draw")
        for keyword in node.keywords:
            if keyword.arg == "generator" and not (isinstance(keyword.value, ast.Constant) and keyword.value.value is None):
                yield Hazard(CODE, ctx.span(keyword), f"an explicit `generator={ctx.source(keyword.value)}` is used",
                             "checkpoint restores only the default generators, so recomputation draws different numbers")


    def settle(self, hits: list[RegionHit], view: RegionView) -> list[RegionHit]:
        """A region that reseeds an RNG draws the same numbers from it at recompute."""
        seeded = {hazard.tag[5:] for _, hazard in hits if hazard.tag.startswith("seed:")}
        return [hit for hit in hits if not (hit[1].tag.startswith("draw:") and hit[1].tag[5:] in seeded)]

TABLE = "body"
# -- cases: region bodies, run by tests/lint/test_rule_tables.py inside a checkpointed ``Block.forward``
# (its harness defines the names they use); INVALID gives (line, column, part of the message) per finding
INVALID = [
    ("return x * random.random()", [(1, 20, "`random.random()` draws from Python's `random`")]),
    ("import numpy as np\nreturn x * float(np.random.rand())", [(2, 26, "`np.random.rand()` uses NumPy's RNG")]),
]
VALID = [
    "return x * torch.rand_like(x)",  # torch's default generator: checkpoint restores it
]
