"""RC103: a checkpointed region prints, logs, warns or writes files.

A ``warnings.warn`` is a side effect only where the recompute shows it again.  Python's filters
show a warning once per location and text (the ``default`` action; ``DeprecationWarning`` is
ignored outside ``__main__``), and the recompute warns from the same line with the same text, so
it shows nothing more, unless the file sets an ``always`` filter, or ``stacklevel`` makes the
location a line of the checkpoint implementation, which differs between the forward and the
recompute (torch calls the region from one line in forward and another in backward).
"""

from __future__ import annotations

import ast
import re
from typing import Iterator

from recheck.lint.facts import Hazard
from recheck.lint.rules.base import RegionHit, RegionView, Rule
from recheck.lint.scope import FunctionContext

CODE = "RC103"
LOG_METHODS = frozenset({"debug", "info", "warning", "warn", "error", "exception", "critical", "log", "fatal"})
LOGGER_NAMES = frozenset({"logger", "log", "_logger", "LOGGER", "_LOGGER", "logging"})
QUALIFIED = {
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
#: ``warnings.simplefilter("always")`` or ``warnings.filterwarnings("always", ...)``
ALWAYS_FILTER = re.compile(r"""\b(?:simplefilter|filterwarnings)\(\s*(?:action\s*=\s*)?["']always["']""")
#: the tag of a warning that shows again only when its ``stacklevel`` (after the colon) leaves the region
WARN_TAG = "stacklevel:"
#: the frames between a region's own function and the checkpoint implementation's line that calls
#: it: ``forward`` of a module the checkpoint calls runs under ``__call__`` (``_wrapped_call_impl``,
#: ``_call_impl``); a function the checkpoint calls directly, none
MODULE_CALL_FRAMES, DIRECT_CALL_FRAMES = 3, 1


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


def _stacklevel(node: ast.Call) -> int | None:
    """The constant ``stacklevel`` of a ``warnings.warn`` call (1 when left out), None when computed."""
    value = node.args[2] if len(node.args) > 2 else next((k.value for k in node.keywords if k.arg == "stacklevel"), None)
    if value is None:
        return 1
    return value.value if isinstance(value, ast.Constant) and type(value.value) is int else None


def _region_frames(view: RegionView) -> int:
    """How many frames up from the region's own function the checkpoint implementation's line is."""
    site = view.region.site
    called_directly = site is not None and site.region_source.endswith(".forward")
    if view.region.function.qualname.endswith(".forward") and not called_directly:
        return MODULE_CALL_FRAMES
    return DIRECT_CALL_FRAMES


class SideEffect(Rule):
    CODE = CODE
    NODES = (ast.Call,)
    BRANCH_SENSITIVE = True

    def visit(self, node: ast.Call, ctx: FunctionContext) -> Iterator[Hazard]:  # type: ignore[override]
        if ctx.qualify(node.func) == "warnings.warn":
            yield from self._warning(node, ctx)
            return
        effect = _effect(node, ctx)
        if effect:
            yield Hazard(CODE, ctx.span(node), f"`{ctx.source(node.func)}(...)` {effect}",
                         "recomputation in backward does it a second time")

    def _warning(self, node: ast.Call, ctx: FunctionContext) -> Iterator[Hazard]:
        """A warning the recompute shows again: the file sets an ``always`` filter, or a constant
        ``stacklevel`` above 1 may name the checkpoint's own line (judged by :meth:`settle`)."""
        what = f"`{ctx.source(node.func)}(...)` warns"
        module = ctx.module
        if module.always_filter is None:
            module.always_filter = any(ALWAYS_FILTER.search(line) for line in module.lines)
        if module.always_filter:
            yield Hazard(CODE, ctx.span(node), what, "this file sets an `always` warning filter, so the recompute "
                         "shows the warning a second time")
            return
        level = _stacklevel(node)
        if level is not None and level > 1:
            yield Hazard(CODE, ctx.span(node), what, f"`stacklevel={level}` names the checkpoint's line that "
                         "calls the region, another one in the recompute, so the warning filter shows it again",
                         f"{WARN_TAG}{level}")

    def settle(self, hits: list[RegionHit], view: RegionView) -> list[RegionHit]:
        """A warning whose ``stacklevel`` stays inside the region (or is in a function the region
        calls) is shown once per location: the recompute's repeat is not shown."""
        root, frames = view.region.function.hazards, _region_frames(view)
        return [(path, hazard) for path, hazard in hits if not hazard.tag.startswith(WARN_TAG)
                or (path == view.region.file.path and hazard in root and int(hazard.tag[len(WARN_TAG):]) > frames)]


TABLE = "body"
# -- cases: region bodies, run by tests/lint/test_rule_tables.py inside a checkpointed ``Block.forward``
# (its harness defines the names they use); INVALID gives (line, column, part of the message) per finding
INVALID = [
    ("print(x.shape)\nreturn x", [(1, 9, "`print(...)` prints")]),
    ("logger.info('hi')\nreturn x", [(1, 9, "`logger.info(...)` logs")]),
    ("logging.debug('x')\nreturn x", [(1, 9, "`logging.debug(...)` logs")]),
    # the location is the checkpoint's line that calls the module: another line in the recompute
    ("import warnings\nwarnings.warn('x', stacklevel=4)\nreturn x", [(2, 9, "`stacklevel=4` names the checkpoint")]),
    ("import warnings\nwarnings.simplefilter('always')\nwarnings.warn('x')\nreturn x",
     [(3, 9, "sets an `always` warning filter")]),
]
VALID = [
    "name = str(x.shape)\nreturn x",
    # shown once per location and text: the recompute's repeat from the same line is not shown
    "import warnings\nwarnings.warn('deprecated', FutureWarning)\nreturn x",
    # the location is torch.nn.Module's __call__, the same line in the forward and the recompute
    "import warnings\nwarnings.warn('deprecated', FutureWarning, stacklevel=3)\nreturn x",
]
