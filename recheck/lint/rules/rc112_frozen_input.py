"""RC112: a reentrant checkpoint whose inputs the code visibly keeps from requiring grad.

The reentrant implementation is an ``autograd.Function``: it runs the region under
``no_grad``, and its output requires grad only when one of its tensor inputs does.  When
every input comes from a frozen producer (an embedding or a backbone whose parameters are
set ``requires_grad=False``, a value computed under ``torch.no_grad()``, a ``.detach()``),
the output is cut from the graph: the region's own parameters (LoRA adapters, trainable
layers after a frozen embedding) never get a gradient.  Torch only warns "None of the inputs
have requires_grad=True.  Gradients will be None"; training goes on, and those layers do not
learn.  transformers added ``enable_input_require_grads`` (a forward hook that makes the
embedding's output require grad) for exactly this.

The function hook judges each call of a known entry point (:data:`recheck.entry_points.TABLE`)
that runs the reentrant implementation (``use_reentrant=True``, or left out where the entry
point's default is reentrant) in the function that makes it.  Every tensor the call passes
the region must be kept from requiring grad, and one visibly so:

* a value computed under ``torch.no_grad()`` / ``torch.inference_mode()`` in this function;
* a ``.detach()`` (and shape or dtype methods of such a value);
* the output of ``self.<module>(...)`` where a method of the class freezes that module
  (``self.embed.requires_grad_(False)``, ``self.embed.weight.requires_grad = False``, or a
  loop over ``self.embed.parameters()`` that sets each one's ``requires_grad = False``);

the others are constants, fresh factory tensors, or data named so (``attention_mask``,
``position_ids``).  A name counts by every assignment that may reach the call.  Nothing is
reported where something makes the input require grad (``x.requires_grad_()``, a forward hook
on the frozen module, ``enable_input_require_grads`` in the file), where the region itself is
frozen (a frozen vision tower whose layers are checkpointed loses nothing), or where a value
may come from elsewhere (a parameter of the function, a ``*`` splat).  The tree hook reports a
call whose region it resolved.
"""

from __future__ import annotations

import ast
import re
from typing import Iterator

from recheck.entry_points import TABLE
from recheck.lint.facts import Hazard, Ref
from recheck.lint.rules.base import HookedHazard, Rule, TreeView
from recheck.lint.scope import FunctionContext
from recheck.lint.targets import ENTRY_POINTS, REGION_KEYWORDS, entry_point, self_path, target_refs

CODE = "RC112"
THEN = ("the reentrant checkpoint runs the region under no_grad and links its output to the graph only through "
        "inputs that require grad, so the region's parameters get no gradient (torch only warns \"None of the "
        "inputs have requires_grad=True\"); make the input require grad (`x.requires_grad_()`, or a forward hook "
        "on the frozen module as transformers' `enable_input_require_grads` does), or pass `use_reentrant=False`")
NO_GRAD = frozenset({"torch.no_grad", "torch.inference_mode", "torch.autograd.no_grad", "torch.autograd.grad_mode.no_grad",
                     "torch.autograd.grad_mode.inference_mode"})
#: methods that return a view or a copy of their receiver: it requires grad exactly when the receiver does
SAME_GRAD = frozenset({"view", "reshape", "transpose", "permute", "contiguous", "to", "float", "half", "bfloat16",
                       "double", "type", "type_as", "unsqueeze", "squeeze", "flatten", "expand", "clone", "chunk",
                       "split", "narrow", "view_as", "reshape_as", "cuda", "cpu"})
#: tensors made fresh, without a graph (unless the call asks ``requires_grad=True``)
FACTORIES = frozenset({"zeros", "ones", "empty", "full", "arange", "tensor", "zeros_like", "ones_like", "empty_like",
                       "full_like", "rand", "randn", "randint", "linspace"})
#: names of arguments that hold data, not activations: masks, indices, positions, lengths
DATA_NAME = re.compile(r"(?:^|_)(?:mask|ids|idx|index|indices|positions|lengths|labels)$")
#: keywords of the entry points themselves, not passed to the region
OWN_KEYWORDS = frozenset({"use_reentrant", "preserve_rng_state", "context_fn", "determinism_check", "debug",
                          "early_stop", "segments", *REGION_KEYWORDS})
#: attributes that are an entry point wherever they are looked up, with their reentrant default
ATTRIBUTE_DEFAULTS = {a: record.reentrant for record in TABLE for a in record.attributes}


def _path(node: ast.AST, context: FunctionContext) -> str | None:
    """``embed.weight`` for ``self.embed.weight`` (subscripts dropped), ``""`` for ``self``; None otherwise."""
    return "" if context.is_self(node) else self_path(node, context.self_name)


def _under(path: str, frozen: dict[str, str]) -> str | None:
    """The frozen path ``path`` lies in (itself or a submodule of it), None when none."""
    return next((f for f in frozen if f == "" or path == f or path.startswith(f + ".")), None)


def _constant(node: ast.AST | None) -> object:
    return node.value if isinstance(node, ast.Constant) else ...


def frozen_modules(context: FunctionContext, owner: str | None) -> dict[str, str]:
    """The submodule paths of class ``owner`` (``""``: the whole module) that a method of the class
    freezes, each with how, leaving out any it also unfreezes, hooks or freezes only in part."""
    if owner is None:
        return {}
    frozen: dict[str, str] = {}
    thawed: set[str] = set()
    depth = owner.count(".") + 1
    for qualname, method in context.module.function_nodes.items():
        if not qualname.startswith(owner + ".") or qualname.count(".") != depth:
            continue
        for node in ast.walk(method):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                path = _path(node.func.value, context)
                if path is None:
                    continue
                if node.func.attr == "requires_grad_":
                    value = _constant(node.args[0]) if node.args else \
                        _constant(next((k.value for k in node.keywords if k.arg == "requires_grad"), ast.Constant(True)))
                    (frozen.setdefault(path.removesuffix(".weight"), "`requires_grad_(False)`") if value is False
                     else thawed.add(path.removesuffix(".weight")))
                elif node.func.attr in ("register_forward_hook", "register_forward_pre_hook"):
                    thawed.add(path)
            elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Attribute) \
                    and node.targets[0].attr == "requires_grad":
                path = _path(node.targets[0].value, context)
                if path is not None:
                    (frozen.setdefault(path.removesuffix(".weight"), "`requires_grad = False`")
                     if _constant(node.value) is False else thawed.add(path.removesuffix(".weight")))
            elif isinstance(node, ast.For) and isinstance(node.iter, ast.Call) \
                    and isinstance(node.iter.func, ast.Attribute) \
                    and node.iter.func.attr in ("parameters", "named_parameters"):
                path = _path(node.iter.func.value, context)
                if path is not None:
                    value = _loop_setting(node)
                    if value is False:
                        frozen.setdefault(path, "a loop setting `requires_grad = False` on its parameters")
                    elif value is not None:
                        thawed.add(path)
    return {p: how for p, how in frozen.items() if not any(t == p or t.startswith(p + ".") or p.startswith(t + ".")
                                                           for t in thawed)}


def _loop_setting(loop: ast.For) -> object:
    """What a loop over parameters sets ``requires_grad`` to on every parameter: False or True;
    ``...`` when it sets it only on some (under an ``if``) or to a value; None when it sets none."""
    target = loop.target.elts[-1] if isinstance(loop.target, ast.Tuple) and loop.target.elts else loop.target
    name = target.id if isinstance(target, ast.Name) else None
    found: object = None
    for statement in loop.body:
        node = statement.value if isinstance(statement, ast.Expr) else statement
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Attribute) and t.attr == "requires_grad"
                                                and isinstance(t.value, ast.Name) and t.value.id == name
                                                for t in node.targets):
            value = _constant(node.value)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "requires_grad_" \
                and isinstance(node.func.value, ast.Name) and node.func.value.id == name:
            value = _constant(node.args[0]) if node.args else True
        else:
            if any(isinstance(n, ast.Attribute) and n.attr in ("requires_grad", "requires_grad_")
                   for n in ast.walk(statement)):
                return ...  # set under a condition: some parameters only
            continue
        found = value if isinstance(value, bool) else ...
    return found


class _Flow:
    """Where the values a checkpoint call passes come from, in one function."""

    def __init__(self, function: ast.AST, context: FunctionContext, frozen: dict[str, str]) -> None:
        self.context, self.frozen = context, frozen
        self.parents: dict[int, ast.AST] = {}
        self.assigned: dict[str, list[tuple[ast.stmt, ast.AST | None]]] = {}
        self.made_to_require: set[str] = set()
        body = getattr(function, "body", [])
        self.top = {id(s) for s in body} if isinstance(body, list) else set()
        stack = [function]
        while stack:
            node = stack.pop()
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
                    continue
                self.parents[id(child)] = node
                stack.append(child)
                self._note(child)

    def _note(self, node: ast.AST) -> None:
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            exact = isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None
            for target in targets:
                if isinstance(target, ast.Name):
                    self.assigned.setdefault(target.id, []).append((node, node.value if exact else None))
                elif isinstance(target, (ast.Tuple, ast.List)):
                    for element in target.elts:
                        if isinstance(element, ast.Name):
                            self.assigned.setdefault(element.id, []).append((node, None))
                elif isinstance(target, ast.Attribute) and target.attr == "requires_grad" \
                        and isinstance(target.value, ast.Name) and _constant(node.value) is not False:
                    self.made_to_require.add(target.value.id)
        elif isinstance(node, (ast.For, ast.AsyncFor, ast.With, ast.AsyncWith, ast.NamedExpr, ast.comprehension)):
            targets = [node.target] if not isinstance(node, (ast.With, ast.AsyncWith)) else \
                [i.optional_vars for i in node.items if i.optional_vars is not None]
            for target in targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        stmt = node if isinstance(node, ast.stmt) else self._statement(node)
                        self.assigned.setdefault(name.id, []).append((stmt, None))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr == "requires_grad_" and isinstance(node.func.value, ast.Name) \
                and _constant(node.args[0] if node.args else ast.Constant(True)) is not False:
            self.made_to_require.add(node.func.value.id)

    def _statement(self, node: ast.AST) -> ast.stmt:
        while not isinstance(node, ast.stmt):
            node = self.parents[id(node)]
        return node

    def _ancestors(self, node: ast.AST) -> list[ast.AST]:
        found = []
        while id(node) in self.parents:
            node = self.parents[id(node)]
            found.append(node)
        return found

    def under_no_grad(self, node: ast.AST) -> bool:
        return any(isinstance(a, (ast.With, ast.AsyncWith)) and any(
            isinstance(i.context_expr, ast.Call) and self.context.qualify(i.context_expr.func) in NO_GRAD
            for i in a.items) for a in self._ancestors(node))

    def _reaches(self, statement: ast.stmt, call: ast.Call) -> bool:
        """Whether an assignment may reach ``call``: before it, or in a loop around both, and
        not in the other branch of an ``if`` that holds the call."""
        around = self._ancestors(call)
        if statement in around:
            return False  # ``h = checkpoint(f, h)``: what the call returns, not what it is passed
        mine = self._ancestors(statement)
        for ancestor in mine:
            if isinstance(ancestor, ast.If) and ancestor in around:
                side = next(n for n in [statement, *mine] if self.parents.get(id(n)) is ancestor)
                other = next(n for n in [call, *around] if self.parents.get(id(n)) is ancestor)
                if (side in ancestor.body) != (other in ancestor.body):
                    return False
                break
        if statement.lineno < call.lineno:
            return True
        return any(isinstance(a, (ast.For, ast.While, ast.AsyncFor)) and a in around for a in mine)

    def source(self, node: ast.AST, call: ast.Call, depth: int = 0) -> str | None:
        """Why the value of ``node`` does not require grad when ``call`` runs: a reason that shows
        it frozen, ``""`` for data without a graph, None when it may require grad."""
        if depth > 6:
            return None
        if isinstance(node, ast.Constant):
            return ""
        if isinstance(node, ast.Name):
            return self._name(node.id, call, depth)
        if not isinstance(node, ast.Call):
            return None
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr == "detach":
            return "is detached (`.detach()`)"
        if isinstance(func, ast.Attribute) and func.attr in SAME_GRAD:
            if any(_path(n, self.context) is not None for a in (*node.args, *node.keywords) for n in ast.walk(a)):
                return None
            return self.source(func.value, call, depth + 1)
        module = func.value if isinstance(func, ast.Attribute) and func.attr == "forward" else func
        path = _path(module, self.context)
        if path is not None:
            under = _under(path, self.frozen)
            return f"comes from `self.{path}`, frozen by {self.frozen[under]}" if under is not None else None
        qualified = self.context.qualify(func) or ""
        if qualified.startswith("torch.") and qualified.rsplit(".", 1)[-1] in FACTORIES \
                and _constant(next((k.value for k in node.keywords if k.arg == "requires_grad"), None)) is not True:
            return ""
        return None

    def _name(self, name: str, call: ast.Call, depth: int) -> str | None:
        if name in self.made_to_require:
            return None
        if DATA_NAME.search(name):
            return ""
        reaching = [(s, v) for s, v in self.assigned.get(name, ()) if self._reaches(s, call)]
        if not reaching:
            return None
        if name in self.context.params and not any(id(s) in self.top and s.lineno < call.lineno for s, _ in reaching):
            return None  # the caller's value may still be the one passed
        reasons = []
        for statement, value in reaching:
            if self.under_no_grad(statement):
                reasons.append("is computed under `torch.no_grad()`")
            elif value is None:
                return None
            else:
                reason = self.source(value, call, depth + 1)
                if reason is None:
                    return None
                reasons.append(reason)
        return next((r for r in reasons if r), "")


def _reentrant(call: ast.Call, entry: str) -> bool:
    """Whether the call runs the reentrant implementation, by its ``use_reentrant`` constant or
    its entry point's default; False when that is not known."""
    keywords = {k.arg: k.value for k in call.keywords}
    if "use_reentrant" in keywords:
        return _constant(keywords["use_reentrant"]) is True
    if None in keywords:
        return False  # may travel in **kwargs
    known = ENTRY_POINTS.get(entry)
    if known is not None:
        return known.reentrant_default
    return ATTRIBUTE_DEFAULTS.get(entry.removeprefix("self."), False)


def frozen_inputs(nodes: list[ast.AST], context: FunctionContext,
                  owner: str | None) -> Iterator[tuple[ast.Call, str, list[Ref]]]:
    """``(call, reason, the region's refs)`` for each reentrant checkpoint call of this function none of whose
    inputs requires grad, one of them visibly frozen (see the module docstring)."""
    calls = []
    for node in nodes:
        if isinstance(node, ast.Call):
            entry = entry_point(node, context, {})
            if entry is not None and entry[1] >= 0 and len(node.args) > entry[1] and _reentrant(node, entry[0]):
                calls.append((node, entry[1]))
    if not calls or any("enable_input_require_grads" in line for line in context.module.lines):
        return
    function = context.module.function_nodes.get(context.qualname)
    if function is None or any(context.qualify(d.func if isinstance(d, ast.Call) else d) in NO_GRAD
                               for d in getattr(function, "decorator_list", ())):
        return  # a function that runs without a graph: nothing to lose
    frozen = frozen_modules(context, owner)
    flow = _Flow(function, context, frozen)
    for call, position in calls:
        region = call.args[position]
        passed = [*call.args[position + 1:], *(k.value for k in call.keywords if k.arg not in OWN_KEYWORDS)]
        if not passed or any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
            continue
        if flow.under_no_grad(call):
            continue  # the whole call runs without a graph: nothing to lose
        refs = target_refs(region, context)
        if any(r.kind in ("self", "elements", "path", "member") and _under(r.name, frozen) is not None for r in refs):
            continue  # the region is frozen too (a frozen tower checkpointed): it has no gradient to lose
        reasons = [flow.source(a, call) for a in passed]
        if all(r is not None for r in reasons) and any(reasons):
            shown = next(i for i, r in enumerate(reasons) if r)
            yield call, f"`{context.source(passed[shown])}` {reasons[shown]}", refs


class FrozenInput(Rule):
    CODE = CODE
    SITES_ONLY = True

    def visit_function(self, nodes: list[ast.AST], ctx: FunctionContext, owner: str | None) -> Iterator[HookedHazard]:
        """A draft per reentrant checkpoint call whose inputs are kept from requiring grad: its
        place, and why as its ``what``; the refs are the region's."""
        for call, reason, refs in frozen_inputs(nodes, ctx, owner):
            if refs:
                yield Hazard(CODE, ctx.span(call), reason, THEN), refs

    def tree(self, view: TreeView) -> Iterator[tuple[str, Hazard, str]]:
        for file, function, draft, refs in view.hooked(CODE):
            running = next((r for ref in refs for target_file, target in view.targets(ref, file, function)
                            for r in [view.running(target_file, target)] if r is not None), None)
            if running is not None:
                what = (f"no input of this reentrant checkpoint requires grad ({draft.what}): the parameters of "
                        f"region `{running.name}` get no gradient")
                yield file.path, Hazard(CODE, draft.span, what, draft.then), running.name


# -- cases: whole modules, run by tests/lint/test_rule_tables.py; INVALID gives (line, column,
# part of the message) per finding
_ADAPTED = '''\
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


class LoraBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.base = nn.Linear(16, 16)
        self.lora_a = nn.Linear(16, 4, bias=False)
        self.lora_b = nn.Linear(4, 16, bias=False)

    def forward(self, x):
        return self.base(x) + self.lora_b(self.lora_a(x))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(100, 16)
        self.layers = nn.ModuleList(LoraBlock() for _ in range(4))
{freeze}

    def forward(self, input_ids, attention_mask=None):
        hidden = self.embed(input_ids)
{between}
        for layer in self.layers:
            hidden = checkpoint(layer, hidden{keywords})
        return hidden
'''
_FREEZE = "        self.embed.requires_grad_(False)"
_FREEZE_LOOP = "        for p in self.embed.parameters():\n            p.requires_grad = False"
_FREEZE_SOME = "        for n, p in self.embed.named_parameters():\n            if 'weight' in n:\n                p.requires_grad = False"
_FREEZE_ALL = "        self.requires_grad_(False)"
_HOOKED = _FREEZE + "\n        self.embed.register_forward_hook(lambda m, i, o: o.requires_grad_())"
_TOWER = '''\
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


class Decoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(32, 4, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32))

    def forward(self, features):
        return self.mlp(self.attn(features, features, features)[0])


class Captioner(nn.Module):
    def __init__(self, tower: nn.Module):
        super().__init__()
        self.tower = tower
        self.proj = nn.Linear(32, 32)
        self.decoder = Decoder()

    def forward(self, images):
        with torch.no_grad():
            features = self.tower(images)
{between}
        out = checkpoint(self.decoder, features, use_reentrant=True)
        return out
'''
_BRANCHES = '''\
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.dense = nn.Linear(16, 16)

    def forward(self, hidden_states, position_ids, cache):
        return self.dense(hidden_states).relu()


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.embeddings = nn.Embedding(100, 16)
        self.embeddings.weight.requires_grad = False
        self.layers = nn.ModuleList(Layer() for _ in range(4))
        self.bias = nn.Parameter(torch.zeros(16))
        self.gradient_checkpointing = True

    def forward(self, input_ids, position_ids):
        hidden_states = self.embeddings(input_ids).to(torch.float32)
        for layer in self.layers:
            if self.gradient_checkpointing and self.training:
                hidden_states = checkpoint(layer.__call__, hidden_states, position_ids, None)
            else:
                hidden_states = layer(hidden_states, position_ids, None)
        return hidden_states
'''
INVALID = [
    (_ADAPTED.format(freeze=_FREEZE, between="", keywords=", use_reentrant=True"),
     [(28, 22, "no input of this reentrant checkpoint requires grad (`hidden` comes from `self.embed`, frozen by "
               "`requires_grad_(False)`): the parameters of region `LoraBlock.forward` get no gradient")]),
    (_ADAPTED.format(freeze=_FREEZE_LOOP, between="", keywords=""),  # torch's default is reentrant
     [(29, 22, "frozen by a loop setting `requires_grad = False` on its parameters")]),
    (_TOWER.format(between=""), [(27, 15, "(`features` is computed under `torch.no_grad()`)")]),
    (_TOWER.format(between="        features = features.detach().float()"), [(27, 15, "is detached")]),
    (_BRANCHES, [(28, 33, "`hidden_states` comes from `self.embeddings`, frozen by `requires_grad = False`")]),
    (_BRANCHES.replace("checkpoint(layer", "self._gradient_checkpointing_func(layer"),  # transformers' default
     [(28, 33, "`hidden_states` comes from `self.embeddings`")]),
]
VALID = [
    _ADAPTED.format(freeze=_FREEZE, between="", keywords=", use_reentrant=False"),
    _ADAPTED.format(freeze="", between="", keywords=", use_reentrant=True"),  # nothing frozen
    _ADAPTED.format(freeze=_FREEZE, between="        hidden.requires_grad_()", keywords=", use_reentrant=True"),
    _ADAPTED.format(freeze=_FREEZE, between="        hidden = hidden + self.layers[0](hidden)", keywords=""),
    _ADAPTED.format(freeze=_FREEZE_SOME, between="", keywords=", use_reentrant=True"),  # frozen in part only
    _ADAPTED.format(freeze=_FREEZE_ALL, between="", keywords=", use_reentrant=True"),  # the region is frozen too
    _ADAPTED.format(freeze=_HOOKED, between="", keywords=", use_reentrant=True"),  # the hook makes it require grad
    _TOWER.format(between="        features = self.proj(features)"),  # a trainable projection in between
    _TOWER.format(between="        features.requires_grad_(True)"),
    _TOWER.format(between="").replace("    def forward", "    @torch.no_grad()\n    def forward"),  # no graph at all
    _BRANCHES.replace("position_ids, None)\n            else", "position_ids, self.bias)\n            else"),
]
