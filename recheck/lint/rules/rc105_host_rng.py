"""RC105: a checkpointed region uses RNG state that checkpoint does not restore."""

from __future__ import annotations

import ast
from typing import Iterator

from recheck.entry_points import TABLE as ENTRY_POINTS
from recheck.lint.facts import CallSite, Hazard
from recheck.lint.rules.base import RegionHit, RegionView, Rule
from recheck.lint.scope import FunctionContext

CODE = "RC105"
#: Reseeding a host RNG inside the region makes its later draws repeatable (BigBird does
#: this), so those draws are not reported; the reseed itself is.
SEEDS = {"random.seed": "Python", "numpy.random.seed": "NumPy"}
#: Seeding torch's generators with a given seed: harmless in a region whose checkpoint puts
#: torch's RNG state back after the recompute (see :func:`restores_torch_rng`).
MANUAL_SEEDING = frozenset({
    "torch.manual_seed", "torch.random.manual_seed", "torch.cuda.manual_seed", "torch.cuda.manual_seed_all",
})
#: Seeding them with a fresh non-deterministic seed: the recompute draws other numbers than the forward.
FRESH_SEEDING = frozenset({"torch.seed", "torch.random.seed", "torch.cuda.seed", "torch.cuda.seed_all"})
#: the tag of a hazard that the region's checkpoint makes harmless when it restores torch's RNG
TORCH_RESTORED = "restored:torch"


def restores_torch_rng(site: CallSite | None) -> bool:
    """Whether the checkpoint behind ``site`` restores torch's RNG state around the recompute (torch's
    ``fork_rng``, DeepSpeed's and Megatron's saved states set back after it), as the entry-point table
    says of it: the record that names the call's entry point; for a region checkpointed by a base
    class (``site`` None) the records with ``bases``; for an entry point reached through an attribute
    or a wrapper of the tree, every record (it holds one of them).  A call that passes
    ``preserve_rng_state=False`` restores nothing."""
    if site is not None and site.preserve_rng_false is not None:
        return False
    records = ([r for r in ENTRY_POINTS if r.bases] if site is None else
               [r for r in ENTRY_POINTS if site.entry in r.names] or list(ENTRY_POINTS))
    return all(record.restores_rng for record in records)


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
        elif qualified in MANUAL_SEEDING:
            yield Hazard(CODE, ctx.span(node), f"`{ctx.source(node.func)}()` reseeds torch's RNG",
                         "this checkpoint does not restore torch's RNG after the recompute, so the reseed "
                         "shifts every later draw", TORCH_RESTORED)
        elif qualified in FRESH_SEEDING:
            yield Hazard(CODE, ctx.span(node), f"`{ctx.source(node.func)}()` reseeds torch's RNG with a fresh seed",
                         "recomputation picks another seed and draws other numbers than the forward")
        for keyword in node.keywords:
            if keyword.arg == "generator" and not (isinstance(keyword.value, ast.Constant) and keyword.value.value is None):
                yield Hazard(CODE, ctx.span(keyword), f"an explicit `generator={ctx.source(keyword.value)}` is used",
                             "checkpoint restores only the default generators, so recomputation draws different numbers")

    def settle(self, hits: list[RegionHit], view: RegionView) -> list[RegionHit]:
        """A region that reseeds an RNG draws the same numbers from it at recompute; a region whose
        checkpoint restores torch's RNG after the recompute undoes its ``torch.manual_seed``."""
        seeded = {hazard.tag[5:] for _, hazard in hits if hazard.tag.startswith("seed:")}
        restored = restores_torch_rng(view.region.site)
        return [hit for hit in hits if not (hit[1].tag.startswith("draw:") and hit[1].tag[5:] in seeded)
                and not (restored and hit[1].tag == TORCH_RESTORED)]


TABLE = "body"
# -- cases: region bodies, run by tests/lint/test_rule_tables.py inside a checkpointed ``Block.forward``
# (its harness defines the names they use); INVALID gives (line, column, part of the message) per finding
INVALID = [
    ("return x * random.random()", [(1, 20, "`random.random()` draws from Python's `random`")]),
    ("import numpy as np\nreturn x * float(np.random.rand())", [(2, 26, "`np.random.rand()` uses NumPy's RNG")]),
    ("torch.seed()\nreturn x", [(1, 9, "reseeds torch's RNG with a fresh seed")]),  # another seed in the recompute
]
VALID = [
    "return x * torch.rand_like(x)",  # torch's default generator: checkpoint restores it
    # the same seed in the recompute, and torch's checkpoint puts the caller's RNG state back after it
    "torch.manual_seed(0)\nreturn x * torch.rand_like(x)",
]
