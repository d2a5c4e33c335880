"""RC002: ``preserve_rng_state=False`` while the checkpointed region draws random numbers."""

from __future__ import annotations

import ast

from recheck.lint.facts import CallSite, Hazard, Span
from recheck.lint.scope import FunctionContext

CODE = "RC002"
RANDOM_FUNCTIONS = frozenset({
    "torch.rand", "torch.rand_like", "torch.randn", "torch.randn_like", "torch.randint",
    "torch.randint_like", "torch.randperm", "torch.bernoulli", "torch.multinomial", "torch.normal",
    "torch.poisson", "torch.dropout", "torch.nn.functional.rrelu", "torch.rrelu",
})
DROPOUT_PREFIX = "torch.nn.functional."
RANDOM_METHODS = frozenset({
    "bernoulli_", "uniform_", "normal_", "exponential_", "random_", "geometric_", "cauchy_", "log_normal_",
})
#: Module classes (last component of the qualified name) whose forward draws random numbers.
RANDOM_MODULES = frozenset({
    "Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "AlphaDropout", "FeatureAlphaDropout", "RReLU", "DropPath",
})


def _training_off(node: ast.Call) -> bool:
    value = next((k.value for k in node.keywords if k.arg == "training"), None)
    return isinstance(value, ast.Constant) and value.value is False


def random_draw(node: ast.AST, ctx: FunctionContext) -> str | None:
    """The source of ``node`` when it is a call that draws from torch's RNG, else None."""
    if not isinstance(node, ast.Call):
        return None
    qualified = ctx.qualify(node.func) or ""
    dropout = qualified.startswith(DROPOUT_PREFIX) and "dropout" in qualified.rsplit(".", 1)[-1]
    if (qualified in RANDOM_FUNCTIONS or dropout) and not _training_off(node):
        return ctx.source(node.func)
    if isinstance(node.func, ast.Attribute) and node.func.attr in RANDOM_METHODS:
        return ctx.source(node.func)
    return None


def check_site(site: CallSite, region: str, draw: tuple[str, Span, str] | None) -> Hazard | None:
    """A hazard at ``preserve_rng_state=False`` when ``draw`` (path, span, what) is not None."""
    if site.preserve_rng_false is None or draw is None:
        return None
    path, span, what = draw
    return Hazard(
        CODE,
        site.preserve_rng_false,
        f"`preserve_rng_state=False` but checkpointed region `{region}` draws random numbers "
        f"(`{what}` at {path}:{span.line})",
        "recomputation draws a different dropout mask or noise",
    )
