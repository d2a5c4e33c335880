"""RC002: ``preserve_rng_state=False`` while the checkpointed region draws random numbers."""

from __future__ import annotations

import ast
from typing import Iterator

from recheck.lint.facts import CallSite, Hazard, Ref
from recheck.lint.rules.base import RegionHit, RegionView, Rule
from recheck.lint.scope import FunctionContext

CODE = "RC002"
RANDOM_FUNCTIONS = frozenset({
    "torch.rand", "torch.rand_like", "torch.randn", "torch.randn_like", "torch.randint",
    "torch.randint_like", "torch.randperm", "torch.bernoulli", "torch.multinomial", "torch.normal",
    "torch.poisson", "torch.dropout", "torch.nn.functional.rrelu", "torch.rrelu",
    "torch.nn.functional.gumbel_softmax", "torch.alpha_dropout", "torch.feature_alpha_dropout",
    "torch.feature_dropout", "torch.rrelu_", "torch.binomial", "torch.nn.functional.rrelu_",
})
DROPOUT_PREFIX = "torch.nn.functional."
#: torch.nn.init's initialisers that draw (``zeros_``, ``ones_``, ``constant_``... do not)
INIT_PREFIX = "torch.nn.init."
INIT_DRAWS = frozenset({"uniform_", "normal_", "trunc_normal_", "xavier_uniform_", "xavier_normal_",
                        "kaiming_uniform_", "kaiming_normal_", "orthogonal_", "sparse_"})
RANDOM_METHODS = frozenset({
    "bernoulli_", "uniform_", "normal_", "exponential_", "random_", "geometric_", "cauchy_", "log_normal_",
})
#: Attention kernels whose ``dropout_p`` (position 4 for ``scaled_dot_product_attention``) draws.
ATTENTION_DROPOUT = {"torch.nn.functional.scaled_dot_product_attention": 4}
#: Module classes (last component of the qualified name) whose forward draws random numbers.
RANDOM_MODULES = frozenset({
    "Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "AlphaDropout", "FeatureAlphaDropout", "RReLU", "DropPath",
})


def _keyword(node: ast.Call, name: str, position: int | None = None) -> ast.AST | None:
    value = next((k.value for k in node.keywords if k.arg == name), None)
    if value is None and position is not None and len(node.args) > position:
        value = node.args[position]
    return value


def _zero(value: ast.AST | None) -> bool:
    return isinstance(value, ast.Constant) and value.value in (0, 0.0, None, False)


def _training_off(node: ast.Call) -> bool:
    value = next((k.value for k in node.keywords if k.arg == "training"), None)
    return isinstance(value, ast.Constant) and value.value is False


def random_draw(node: ast.AST, ctx: FunctionContext) -> str | None:
    """The source of ``node`` when it is a call that draws from torch's RNG, else None:
    the random functions and in-place samplers, functional dropouts (unless ``p`` is 0 or
    ``training=False``), torch.nn.init's random initialisers, and attention kernels given a
    ``dropout_p`` that is not a literal 0 (``scaled_dot_product_attention``, flash-attn)."""
    if not isinstance(node, ast.Call):
        return None
    qualified = ctx.qualify(node.func) or ""
    last = qualified.rsplit(".", 1)[-1]
    dropout = qualified.startswith(DROPOUT_PREFIX) and "dropout" in last
    if dropout and _zero(_keyword(node, "p", 1)):
        return None
    if (qualified in RANDOM_FUNCTIONS or dropout) and not _training_off(node):
        return ctx.source(node.func)
    if qualified.startswith(INIT_PREFIX) and last in INIT_DRAWS:
        return ctx.source(node.func)
    if qualified in ATTENTION_DROPOUT or any(k.arg == "dropout_p" for k in node.keywords):
        value = _keyword(node, "dropout_p", ATTENTION_DROPOUT.get(qualified))
        if value is not None and not _zero(value):
            return f"{ctx.source(node.func)}(dropout_p={ctx.source(value)})"
        return None
    if isinstance(node.func, ast.Attribute) and node.func.attr in RANDOM_METHODS:
        return ctx.source(node.func)
    return None


class PreserveRng(Rule):
    """Each random draw is recorded as a hazard of this rule (its ``what`` the drawing call), a
    fact for the call-site hook rather than a finding: a region's first draw is named at the
    ``preserve_rng_state=False`` of a call that checkpoints it."""

    CODE = CODE
    NODES = (ast.Call,)

    def visit(self, node: ast.AST, ctx: FunctionContext) -> Iterator[Hazard]:
        drawn = random_draw(node, ctx)
        if drawn:
            yield Hazard(CODE, ctx.span(node), drawn, "")

    def outside_call(self, qualified: str, ref: Ref) -> Iterator[Hazard]:
        if qualified.rsplit(".", 1)[-1] in RANDOM_MODULES:
            yield Hazard(CODE, ref.span, f"self.{ref.name}", "")

    def settle(self, hits: list[RegionHit], view: RegionView) -> list[RegionHit]:
        return [hit for hit in hits if hit[1].code != CODE]  # draws are facts, not findings

    def site(self, site: CallSite, regions: list[RegionView]) -> Iterator[tuple[str | None, Hazard]]:
        """A hazard at ``preserve_rng_state=False`` naming the first region that draws."""
        if site.preserve_rng_false is None:
            return
        for region in regions:
            path, draw = next(((p, h) for p, h in region.hits if h.code == CODE), (None, None))
            if draw is not None:
                yield region.name, Hazard(
                    CODE,
                    site.preserve_rng_false,
                    f"`preserve_rng_state=False` but checkpointed region `{region.name}` draws random numbers "
                    f"(`{draw.what}` at {path}:{draw.span.line})",
                    "recomputation draws a different dropout mask or noise",
                )
                return
