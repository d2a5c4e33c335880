"""RC103: a checkpointed region prints, logs, warns or writes files."""

from __future__ import annotations

import ast
from typing import Iterator

from recheck.lint.facts import Hazard
from recheck.lint.rules.base import Rule
from recheck.lint.scope import FunctionContext

CODE = "RC103"
LOG_METHODS = frozenset({"debug", "info", "warning", "warn", "error", "exception", "critical", "log", "fatal"})
LOGGER_NAMES = frozenset({"logger", "log", "_logger", "LOGGER", "_LOGGER", "logging"})
QUALIFIED = {
    "warnings.warn": "warns",
    "wandb.log": "logs to wandb",
    "tqdm.write": "writes to the terminal",
    "tqdm.tqdm.write": "writes to the terminal",
    "tqdm.auto.tqdm.write": "writes to the terminal",
    "sys.stdout.write": "writes to stdout",
    "sys.stderr.write": "writes to stderr",
    "torch.save": "writes a file",
    "numpy.save": "writes a file",
    "numpy.savez": "writes a file",
    "numpy.savetxt": "writes a file",
    "json.dump": "writes a file",
    "pickle.dump": "writes a file",
}
WRITE_MODES = frozenset("wax+")


def _open_mode(node: ast.Call) -> str:
    mode = node.args[1] if len(node.args) > 1 else next((k.value for k in node.keywords if k.arg == "mode"), None)
    return mode.value if isinstance(mode, ast.Constant) and isinstance(mode.value, str) else "r"


def _effect(node: ast.Call, ctx: FunctionContext) -> str | None:
    func = node.func
    if isinstance(func, ast.Name) and not ctx.is_local(func.id):
        if func.id == "print":
            return "prints"
        if func.id == "open" and WRITE_MODES & set(_open_mode(node)):
            return "writes a file"
    qualified = ctx.qualify(func)
    if qualified in QUALIFIED:
        return QUALIFIED[qualified]
    if not isinstance(func, ast.Attribute):
        return None
    if func.attr in ("write_text", "write_bytes"):
        return "writes a file"
    owner = func.value
    owner_name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
    if func.attr in LOG_METHODS and (
        (qualified or "").startswith("logging.")
        or owner_name in ctx.module.loggers
        or owner_name in LOGGER_NAMES
    ):
        return "logs"
    if func.attr.startswith("add_") and "writer" in owner_name.lower():
        return "writes a TensorBoard event"
    return None


class SideEffect(Rule):
    CODE = CODE
    NODES = (ast.Call,)
    BRANCH_SENSITIVE = True

    def visit(self, node: ast.Call, ctx: FunctionContext) -> Iterator[Hazard]:  # type: ignore[override]
        effect = _effect(node, ctx)
        if effect:
            yield Hazard(CODE, ctx.span(node), f"`{ctx.source(node.func)}(...)` {effect}",
                         "recomputation in backward does it a second time")


TABLE = "body"
# -- cases: region bodies, run by tests/lint/test_rule_tables.py inside a checkpointed ``Block.forward``
# (its harness defines the names they use); INVALID gives (line, column, part of the message) per finding
INVALID = [
    ("print(x.shape)\nreturn x", [(1, 9, "`print(...)` prints")]),
    ("logger.info('hi')\nreturn x", [(1, 9, "`logger.info(...)` logs")]),
    ("logging.debug('x')\nreturn x", [(1, 9, "`logging.debug(...)` logs")]),
]
VALID = [
    "name = str(x.shape)\nreturn x",
]
