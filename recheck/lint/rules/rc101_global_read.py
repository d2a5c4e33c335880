"""RC101: a checkpointed region reads a module global that the module rebinds or mutates,
or an attribute of its module that the module's ``forward`` rebinds outside the region."""

from __future__ import annotations

import ast
from typing import Iterator

from recheck.lint.facts import Hazard
from recheck.lint.rules.base import RegionHit, RegionView, Rule
from recheck.lint.scope import FunctionContext

CODE = "RC101"
#: the methods that run when a module is called: what rebinds an attribute outside the region
FORWARDS = ("forward", "__call__")


class GlobalRead(Rule):
    CODE = CODE
    NODES = (ast.Name,)
    ONCE_PER_FUNCTION = True  # one finding per message and function, at the first

    def visit(self, node: ast.Name, ctx: FunctionContext) -> Iterator[Hazard]:  # type: ignore[override]
        if not isinstance(node.ctx, ast.Load) or node.id not in ctx.module.mutated_globals:
            return
        if id(node) in ctx.written:  # X[k] = v, X.append(v): a write, RC104's business
            return
        if ctx.is_global_variable(node.id):
            yield Hazard(
                CODE,
                ctx.span(node),
                f"module global `{node.id}` (rebound or mutated elsewhere in the module) is read",
                "recomputation reads the value it holds at backward time, not at forward time",
                f"read:{node.id}",
            )

    def region(self, view: RegionView) -> Iterator[RegionHit]:
        """Attributes: ``self.<attr>`` read in the region and rebound by the class's ``forward``
        outside the region (the forward that calls ``checkpoint(self._inner, x)`` after setting
        ``self.mask = mask``): the next forward rebinds it before backward."""
        walked = {(file.path, function.qualname) for file, function in view.reached}
        for file, function in view.reached:
            cls = file.classes.get(function.self_class) if function.self_reads and function.self_class else None
            if cls is None:
                continue
            writers: dict[str, str] = {}
            for owner_file, klass in view.index.lineage(file, cls):
                for name in FORWARDS:
                    qualname = klass.methods.get(name)
                    writer = owner_file.functions.get(qualname) if qualname else None
                    if writer is not None and (owner_file.path, qualname) not in walked:
                        for attribute in writer.self_writes:
                            writers.setdefault(attribute, writer.qualname)
            for attribute, span in function.self_reads:
                if attribute in writers:
                    yield file.path, Hazard(
                        CODE, span, f"attribute `self.{attribute}` (rebound by `{writers[attribute]}` outside the "
                        "region) is read", "a forward that runs before backward (the next microbatch, a shared "
                        "module) rebinds it, and recomputation reads that value")


TABLE = "body"
# -- cases: region bodies, run by tests/lint/test_rule_tables.py inside a checkpointed ``Block.forward``
# (its harness defines the names they use); INVALID gives (line, column, part of the message) per finding
INVALID = [
    ("return x * STEP", [(1, 20, "module global `STEP` (rebound or mutated elsewhere in the module) is read")]),
    ("return x + torch.tensor(float(STEP))", [(1, 39, "module global `STEP`")]),
    ("return x * STEP + STEP", [(1, 20, "module global `STEP`")]),  # one finding per global and function
]
VALID = [
    "return x * SCALE",  # a global nothing rebinds
    "n = 3\nreturn x * n",
]
