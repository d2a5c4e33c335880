"""RC111: a forward hook that exists only during an outer call, on a module a region runs.

A wrapper that registers a forward or forward-pre hook, runs the model and removes the hook
before it returns (an activation-steering context, a LoRA-style injection, a hook-based
profiler) has the hook in place for the forward only.  Checkpointing recomputes the region in
backward, after the wrapper has returned: the recomputation runs the module without the hook.
A hook that changes its module's input or output (``return output + delta``) makes the
recomputed activations differ from the forward's, and the gradients are those of another
function; a hook that records something records nothing at recompute.

The function hook (:func:`temporary_hooks`) finds, in one function, the hooks whose handle that
function also removes (``h = m.register_forward_hook(f)`` then ``h.remove()``; handles in a
list removed in a loop; ``torch.nn.modules.module.register_module_forward_hook`` for every
module) and that it does not run backward under (a ``.backward(...)`` or
``torch.autograd.grad(...)`` call in the same function keeps the hook in place for the
recompute).  The tree hook reports one when the hooked module's ``forward`` runs inside a
region; a global hook, when the function reaches a region at all.
"""

from __future__ import annotations

import ast

from typing import Iterator

from recheck.lint.facts import Hazard, Ref, Span
from recheck.lint.rules.base import HookedHazard, Rule, TreeView
from recheck.lint.scope import FunctionContext
from recheck.lint.targets import callee_refs

CODE = "RC111"
MODULE_HOOKS = frozenset({"register_forward_hook", "register_forward_pre_hook"})
GLOBAL_HOOKS = frozenset({"register_module_forward_hook", "register_module_forward_pre_hook"})
BACKWARD_CALLS = frozenset({"backward", "grad"})
THEN = ("checkpointing recomputes the region in backward, after the hook is removed, so the recomputation runs "
        "without it; keep the hook until backward has run, or leave this module out of checkpointing")
#: the receiver recorded for a hook every module gets
GLOBAL = "*"


#: calls whose value a hook lambda returns without meaning it (they return None)
RECORDING = frozenset({"append", "extend", "update", "add", "setdefault", "put", "print", "log", "info", "debug"})


def _name(node: ast.AST) -> str | None:
    return node.id if isinstance(node, ast.Name) else None


def _hook_node(hook: ast.AST, context: FunctionContext, owner: str | None) -> ast.AST | None:
    """The ``def`` or lambda a hook argument names, when this file defines it."""
    if isinstance(hook, ast.Lambda):
        return hook
    if isinstance(hook, ast.Call) and hook.args and (context.qualify(hook.func) or "").endswith("partial"):
        return _hook_node(hook.args[0], context, owner)
    nodes = context.module.function_nodes
    if isinstance(hook, ast.Name):
        return nodes.get(f"{context.qualname}.{hook.id}") or nodes.get(hook.id)
    if isinstance(hook, ast.Attribute) and owner is not None and context.is_self(hook.value):
        return nodes.get(f"{owner}.{hook.attr}")
    return None


def changes_values(hook: ast.AST, context: FunctionContext, owner: str | None) -> bool:
    """Whether a hook may change what its module computes: it returns a value (a new input or
    output) or updates one of its arguments in place.  A hook defined elsewhere may: True."""
    node = _hook_node(hook, context, owner)
    if node is None:
        return True
    if isinstance(node, ast.Lambda):
        body = node.body
        if isinstance(body, ast.Constant) and body.value is None:
            return False
        if isinstance(body, ast.Call):
            called = body.func.attr if isinstance(body.func, ast.Attribute) else _name(body.func)
            return called not in RECORDING
        return True
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return True
    params = {a.arg for a in [*node.args.posonlyargs, *node.args.args][1:]}  # the module (or self) aside
    if node.args.args and node.args.args[0].arg == "self":
        params.discard(node.args.args[1].arg if len(node.args.args) > 1 else "")
    for child in ast.walk(node):
        if isinstance(child, ast.Return) and child.value is not None \
                and not (isinstance(child.value, ast.Constant) and child.value.value is None):
            return True
        if isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute) and child.func.attr.endswith("_") \
                and not child.func.attr.endswith("__") and _root(child.func.value) in params:
            return True
        if isinstance(child, (ast.Assign, ast.AugAssign)):
            for target in child.targets if isinstance(child, ast.Assign) else [child.target]:
                if isinstance(target, ast.Subscript) and _root(target) in params:
                    return True
    return False


def _root(node: ast.AST) -> str | None:
    while isinstance(node, (ast.Subscript, ast.Attribute)):
        node = node.value
    return _name(node)


def temporary_hooks(nodes: list[ast.AST], context: FunctionContext,
                    owner: str | None = None) -> list[tuple[Span, str, list[Ref]]]:
    """``(place of the registering call, hook method, refs of the hooked module or [GLOBAL ref])``
    for each hook this function registers and removes again and that may change what its
    module computes (:func:`changes_values`), when the function runs no backward itself.
    ``nodes`` are the function's own nodes (its nested functions' are not among them);
    ``owner``, the qualname of the class ``self`` is, for hooks that are methods."""
    registers: dict[int, tuple[ast.Call, str]] = {}
    for node in nodes:
        if type(node) is ast.Call and isinstance(node.func, ast.Attribute | ast.Name):  # type: ignore[attr-defined]
            method = node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id
            if method in MODULE_HOOKS or method in GLOBAL_HOOKS:
                registers[id(node)] = (node, method)
            elif method in BACKWARD_CALLS and (method == "backward" or "autograd" in ast.unparse(node.func)):
                return []  # backward runs while the hooks are in place
    if not registers:
        return []
    handles: dict[str, list[int]] = {}  # a name bound to a handle, or to a list that holds them
    loops: dict[str, str] = {}  # a loop variable over such a list -> the list's name
    for node in nodes:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and _name(node.targets[0]):
            held = [id(c) for c in ast.walk(node.value) if id(c) in registers]
            if held:
                handles.setdefault(_name(node.targets[0]) or "", []).extend(held)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in ("append", "extend") and _name(node.func.value):
            held = [id(c) for a in node.args for c in ast.walk(a) if id(c) in registers]
            if held:
                handles.setdefault(_name(node.func.value) or "", []).extend(held)
        elif isinstance(node, (ast.For, ast.comprehension)) and _name(node.target) and _name(node.iter):
            loops[_name(node.target) or ""] = _name(node.iter) or ""
    removed: set[int] = set()
    for node in nodes:
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "remove" \
                and not node.args and _name(node.func.value):
            name = _name(node.func.value) or ""
            removed.update(handles.get(name, ()))
            removed.update(handles.get(loops.get(name, ""), ()))
    found = []
    for key in sorted(removed, key=lambda k: (registers[k][0].lineno, registers[k][0].col_offset)):
        call, method = registers[key]
        hook = call.args[0] if call.args else next((k.value for k in call.keywords if k.arg == "hook"), None)
        if hook is None or not changes_values(hook, context, owner):
            continue  # a hook that only records: the recomputation missing it changes no value
        if method in GLOBAL_HOOKS:
            refs = [Ref("name", GLOBAL, context.span(call))]
        elif isinstance(call.func, ast.Attribute):
            refs = callee_refs(call.func.value, context)
        else:
            refs = []
        if refs:
            found.append((context.span(call.func), method, refs))
    return found


class TemporaryHook(Rule):
    CODE = CODE
    #: a wrapper that hooks a module's forward for one call may live in a file without a checkpoint
    FILE_TEXT = r"register_(?:module_)?forward(?:_pre)?_hook\s*\("
    UNIT_WORDS = ("forward_hook", "forward_pre_hook")

    def visit_function(self, nodes: list[ast.AST], ctx: FunctionContext, owner: str | None) -> Iterator[HookedHazard]:
        """A draft per temporary hook: its place, and the hook method as its ``what``."""
        for span, method, refs in temporary_hooks(nodes, ctx, owner):
            yield Hazard(CODE, span, method, THEN), refs

    def tree(self, view: TreeView) -> Iterator[tuple[str, Hazard, str]]:
        for file, function, draft, refs in view.hooked(CODE):
            found = None
            if refs and refs[0].name == GLOBAL:
                running = view.reaching(file, function)
                if running is not None:
                    found = ("", running)
            else:
                for ref in refs:
                    for target_file, target in view.targets(ref, file, function):
                        running = view.running(target_file, target)
                        if running is not None and found is None:
                            found = (target.qualname, running)
            if found is not None:
                hooked, region = found
                yield file.path, _hazard(draft.span, draft.what, hooked, region.name, region.origin), region.name


def _hazard(span: Span, method: str, hooked: str, region: str, origin: str) -> Hazard:
    """The finding at a temporary hook's registration: ``hooked`` is the qualname of the hooked
    module's ``forward`` (ignored for a global hook), ``region`` and ``origin`` the region it runs in."""
    what = (f"`{method}` hooks every module for this call only, and the call runs checkpointed region `{region}` "
            f"({origin})" if method in GLOBAL_HOOKS else
            f"`{method}` hooks `{hooked}` (in checkpointed region `{region}`, {origin}) for this call only")
    return Hazard(CODE, span, what, THEN)


# -- cases: whole modules, run by tests/lint/test_rule_tables.py; INVALID gives (line, column,
# part of the message) per finding
_STEERING = '''\
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.mlp = nn.Linear(16, 16)

    def forward(self, x):
        return x + self.mlp(x).relu()


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(Layer() for _ in range(4))

    def forward(self, x):
        for layer in self.layers:
            x = checkpoint(layer, x, use_reentrant=False)
        return x


class Steered(nn.Module):
    def __init__(self):
        super().__init__()
        self.model = Model()
        self.direction = nn.Parameter(torch.zeros(16))

    def forward(self, x):
        handles = []
        for layer in self.model.layers:
            handles.append(layer.register_forward_pre_hook({hook}))
{between}
        for handle in handles:
            handle.remove()
        return out

    def _steer(self, module, args):
        return (args[0] + self.direction,)

    def _record(self, module, args):
        self.seen = args[0].shape
'''
_RUN = "        out = self.model(x)"
_RUN_AND_BACKWARD = "        out = self.model(x)\n        out.sum().backward()"
_GUARD = '''\
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(16, 16)
        self.norm = nn.LayerNorm(16)

    def forward(self, x):
        return self.norm(self.proj(x).tanh())


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = Block()
        self.head = nn.Linear(16, 2)

    def forward(self, x):
        return self.head(checkpoint(self.block, x, use_reentrant=False))


def _clamp(module, args, output):
{clamp}


def guarded_step(net: Net, x):
    handle = torch.nn.modules.module.register_module_forward_hook(_clamp)
    try:
        return net(x)
    finally:
        handle.remove()
'''
_CLAMPS = "    if isinstance(output, torch.Tensor):\n        return output.clamp(-5.0, 5.0)"
_TIMES = "    print(type(module).__name__, tuple(output.shape))"  # a profiler: records, changes nothing
INVALID = [
    (_STEERING.format(hook="self._steer", between=_RUN),
     [(35, 28, "`register_forward_pre_hook` hooks `Layer.forward` (in checkpointed region `Layer.forward`, checkpointed at")]),
    (_STEERING.format(hook="lambda m, args: (args[0] * 2,)", between=_RUN), [(35, 28, "`register_forward_pre_hook`")]),
    (_GUARD.format(clamp=_CLAMPS),
     [(32, 14, "`register_module_forward_hook` hooks every module for this call only, and the call runs checkpointed "
               "region `Block.forward`")]),
]
VALID = [
    _STEERING.format(hook="self._steer", between=_RUN_AND_BACKWARD),  # backward runs while the hooks are in place
    _STEERING.format(hook="self._steer", between=_RUN).replace(  # no region
        "checkpoint(layer, x, use_reentrant=False)", "layer(x)"),
    _STEERING.format(hook="self._record", between=_RUN),  # records only: the recomputation computes the same
    _GUARD.format(clamp=_TIMES),
    _GUARD.format(clamp=_CLAMPS).replace("handle.remove()", "pass"),  # the hook stays: the recompute runs it too
]
