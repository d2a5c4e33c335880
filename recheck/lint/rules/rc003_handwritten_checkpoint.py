"""RC003: a hand-written checkpoint that reruns its function without restoring RNG or autocast state.

An ``autograd.Function`` whose ``forward`` runs a callable under ``no_grad`` and whose
``backward`` runs it again under ``enable_grad`` is a checkpoint implementation.  Unless
it saves the RNG state in ``forward`` and restores it around the rerun (as torch's
checkpoint does with ``preserve_rng_state``), dropout draws a different mask in the
recomputation; unless it records the autocast state and re-enters it, the rerun computes
in another precision.  The class is judged wherever it is, checkpointed or not: it *is*
the checkpoint.
"""

from __future__ import annotations

import ast
from typing import Iterator

from recheck.lint.facts import Hazard
from recheck.lint.rules.base import Rule
from recheck.lint.scope import FunctionContext

CODE = "RC003"
FUNCTION_BASES = frozenset({"torch.autograd.Function", "torch.autograd.function.Function"})
#: A call whose name holds one of these saves or restores RNG state (torch's
#: ``get_rng_state``/``fork_rng``, ``get_device_states``, Megatron's ``_get_all_rng_states``,
#: DeepSpeed's and fairscale's helpers, a CUDA RNG tracker's ``get_states``).
RNG_WORDS = ("rng", "device_states")
#: A call whose name holds this reads or re-enters the autocast state.
AUTOCAST_WORDS = ("autocast",)


def _called_names(node: ast.AST) -> set[str]:
    names = set()
    for child in ast.walk(node):
        if isinstance(child, ast.Call):
            func = child.func
            names.add(func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", ""))
    return names


def _context_managers(node: ast.AST) -> set[str]:
    found = set()
    for child in ast.walk(node):
        if isinstance(child, (ast.With, ast.AsyncWith)):
            for item in child.items:
                call = item.context_expr
                func = call.func if isinstance(call, ast.Call) else call
                found.add(func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", ""))
    return found


def _reruns_a_callable(backward: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Whether ``backward`` calls, under ``enable_grad``, a callable it got from ``ctx``
    (``ctx.run_function(*inputs)``, ``fn = ctx.fn; fn(x)``): a checkpoint of whatever it was
    given, not a fixed recomputation of the class's own math (which draws nothing unless it
    says so)."""
    if not backward.args.args:
        return False
    ctx_name = backward.args.args[0].arg
    from_ctx = {t.id for n in ast.walk(backward) if isinstance(n, ast.Assign)
                and isinstance(n.value, ast.Attribute) and isinstance(n.value.value, ast.Name)
                and n.value.value.id == ctx_name for t in n.targets if isinstance(t, ast.Name)}
    for block in ast.walk(backward):
        if not isinstance(block, ast.With) or not any(
                "enable_grad" in ast.unparse(item.context_expr) for item in block.items):
            continue
        for call in ast.walk(block):
            if isinstance(call, ast.Call):
                func = call.func
                if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == ctx_name:
                    return True
                if isinstance(func, ast.Name) and func.id in from_ctx:
                    return True
    return False


class HandwrittenCheckpoint(Rule):
    CODE = CODE
    #: a hand-written checkpoint's backward reruns its function under ``enable_grad``
    FILE_TEXT = r"enable_grad\s*\(\s*\)"
    UNIT_WORDS = ("enable_grad",)

    def visit_class(self, node: ast.ClassDef, bases: list[str], ctx: FunctionContext) -> Iterator[tuple[str | None, Hazard]]:
        """A hazard at the class when it is a checkpoint ``Function`` missing RNG or autocast restore."""
        if not any(base in FUNCTION_BASES or base.endswith(".autograd.Function") for base in bases):
            return
        methods = {n.name: n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        forward, backward = methods.get("forward"), methods.get("backward")
        if forward is None or backward is None:
            return
        if "no_grad" not in _context_managers(forward) or "enable_grad" not in _context_managers(backward):
            return  # not a recomputing Function
        if not _reruns_a_callable(backward):
            return  # recomputes its own fixed math
        called = _called_names(node)
        missing = []
        if not any(word in name.lower() for name in called for word in RNG_WORDS):
            missing.append("the RNG state")
        if not any(word in name.lower() for name in called for word in AUTOCAST_WORDS):
            missing.append("the autocast state")
        if not missing:
            return
        span = ctx.span(node)
        yield None, Hazard(  # the class is the checkpoint: judged wherever it is
            CODE,
            span._replace(end_line=span.line, end_column=span.column + len("class ") + len(node.name)),
            f"hand-written checkpoint `{node.name}` reruns its function in backward without saving and restoring "
            f"{' or '.join(missing)}",
            "the recomputation draws other dropout masks" if "the RNG state" in missing
            else "the recomputation runs outside the forward's autocast and computes in another precision",
        )
