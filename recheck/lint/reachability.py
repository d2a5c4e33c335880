"""Which branches of a region's function cannot run, given what its checkpoint call passes.

``if len(unused_kwargs) > 0: logger.warning(...)`` in a ``forward(self, x, **kwargs)`` that
is checkpointed as ``checkpoint(block, x)`` never runs: ``kwargs`` is empty for that
caller.  Phase one records, for each ``if`` whose test is false whenever some optional
parameters are not passed (left ``None`` or empty), which parameters those are
(:func:`guards`); phase two drops a hazard in that branch from a region whose checkpoint
call passes none of them (:func:`unreachable`).

The test forms understood are the ones that are false for ``None`` and empty values:
truthiness, ``is not None``, ``len(x) > 0``, ``x.get(k)``, ``k in x``, and ``and``/``or``
of those, through locals derived from the parameters (``kw = kw if kw is not None else
{}``, ``unused = [k for k in kw if ...]``).
"""

from __future__ import annotations

import ast

from recheck.lint.facts import FunctionFacts
from recheck.lint.scope import subtree

__all__ = ["NoneStates", "argument_value", "binds", "empty_params", "guards", "none_names", "none_states", "optional_params",
           "passes_on", "unreachable"]

NONE, EMPTY = "none", "empty"
_EMPTY_LITERALS = (ast.Dict, ast.List, ast.Tuple, ast.Set)


def optional_params(arguments: ast.arguments) -> dict[str, str]:
    """Parameters that are ``None`` or empty when a caller leaves them out."""
    found: dict[str, str] = {}
    positional = [*arguments.posonlyargs, *arguments.args]
    pairs = list(zip(positional[len(positional) - len(arguments.defaults):], arguments.defaults))
    pairs += [(a, d) for a, d in zip(arguments.kwonlyargs, arguments.kw_defaults) if d is not None]
    for arg, default in pairs:
        state = _literal_state(default)
        if state:
            found[arg.arg] = state
    if arguments.kwarg is not None:
        found[arguments.kwarg.arg] = EMPTY
    if arguments.vararg is not None:
        found[arguments.vararg.arg] = EMPTY
    return found


def _literal_state(node: ast.AST) -> str | None:
    if isinstance(node, ast.Constant) and node.value is None:
        return NONE
    if isinstance(node, ast.Constant) and node.value in (False, 0, ""):
        return EMPTY
    if isinstance(node, _EMPTY_LITERALS) and not getattr(node, "elts", getattr(node, "keys", None)):
        return EMPTY
    return None


def _state(node: ast.AST, known: dict[str, str]) -> str | None:
    """``NONE``/``EMPTY`` when ``node`` is None or empty given ``known`` names' states."""
    literal = _literal_state(node)
    if literal:
        return literal
    if isinstance(node, ast.Name):
        return known.get(node.id)
    if isinstance(node, ast.IfExp):  # kw if kw is not None else {}: empty either way
        body, other = _state(node.body, known), _state(node.orelse, known)
        return (NONE if body == other == NONE else EMPTY) if body and other else None
    if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or):  # kw or {}
        states = [_state(v, known) for v in node.values]
        return EMPTY if all(states) else None
    if isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
        return EMPTY if _state(node.generators[0].iter, known) else None
    if isinstance(node, ast.Call):
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in ("items", "keys", "values", "copy") and not node.args:
            return EMPTY if _state(func.value, known) else None
        if isinstance(func, ast.Attribute) and func.attr == "get" and _state(func.value, known):
            default = node.args[1] if len(node.args) > 1 else None
            return NONE if default is None or _literal_state(default) else None
        if isinstance(func, ast.Name) and func.id in ("list", "dict", "set", "tuple", "sorted") and len(node.args) == 1:
            return EMPTY if _state(node.args[0], known) else None
    return None


def _false(test: ast.AST, known: dict[str, str]) -> bool:
    """Whether ``test`` is false given ``known`` names' states."""
    if _state(test, known):
        return True
    if isinstance(test, ast.BoolOp):
        results = [_false(v, known) for v in test.values]
        return any(results) if isinstance(test.op, ast.And) else all(results)
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        op, left, right = test.ops[0], test.left, test.comparators[0]
        if isinstance(op, ast.IsNot) and isinstance(right, ast.Constant) and right.value is None:
            return _state(left, known) == NONE
        if isinstance(op, ast.In):
            return _state(right, known) is not None
        if isinstance(left, ast.Call) and isinstance(left.func, ast.Name) and left.func.id == "len" and left.args \
                and _state(left.args[0], known) and isinstance(right, ast.Constant) and isinstance(right.value, int):
            return (isinstance(op, ast.Gt) and right.value >= 0) or (isinstance(op, ast.GtE) and right.value >= 1) \
                or (isinstance(op, ast.NotEq) and right.value == 0)
    return False


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in subtree(node) if type(n) is ast.Name}  # type: ignore[attr-defined]


def guards(nodes: list[ast.AST], arguments: ast.arguments) -> list[tuple[int, int, tuple[str, ...]]]:
    """``(first line, last line, parameters)`` of each ``if`` body that cannot run when none
    of ``parameters`` is passed: the test is false with them ``None`` or empty."""
    optional = optional_params(arguments)
    if not optional:
        return []
    derived: dict[str, set[str]] = {}  # local -> the optional parameters it is computed from
    states: dict[str, str] = dict(optional)  # every optional parameter left out
    found = []
    for node in nodes:
        if type(node) is ast.Assign and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            target = node.targets[0].id
            sources: set[str] = set()
            for name in _names(node.value):
                sources |= derived.get(name, {name} if name in optional else set())
            derived[target] = sources
            state = _state(node.value, states) if sources else None
            if state:
                states[target] = state
            else:
                states.pop(target, None)
        elif type(node) is ast.If and node.body:
            params: set[str] = set()
            for name in _names(node.test):
                params |= derived.get(name, {name} if name in optional else set())
            if params and _false(node.test, states):
                end = node.body[-1].end_lineno or node.body[-1].lineno
                found.append((node.body[0].lineno, end, tuple(sorted(params))))
    return found


def _none_sources(node: ast.AST, sources: dict[str, set[str]], states: dict[str, str]) -> set[str] | None:
    """The optional parameters that, all left out, make ``node`` None or empty (or its
    evaluation raise, as ``c.attr`` of a None ``c`` does); None when it may be anything else."""
    if isinstance(node, ast.Constant) and node.value is None:
        return set()
    if isinstance(node, ast.Name):
        return sources.get(node.id)
    base = node.func if isinstance(node, ast.Call) else node
    while isinstance(base, (ast.Attribute, ast.Subscript)):
        base = base.value
    if base is not node and isinstance(base, ast.Name) and states.get(base.id) == NONE:
        return sources[base.id]  # `c.self_attention_cache`, `c[0]`: only runs when c is not None
    if isinstance(node, ast.IfExp):
        body, other = _none_sources(node.body, sources, states), _none_sources(node.orelse, sources, states)
        if body is not None and other is not None:
            return body | other
        tested = _names(node.test)
        if other is not None and tested <= set(states) and _false(node.test, states):
            return other.union(*(sources[name] for name in tested))  # `c[:2] if c is not None else None`
    return None


_NAMED = frozenset({ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.ExceptHandler})
_DECLARING = frozenset({ast.Import, ast.ImportFrom, ast.Global, ast.Nonlocal})


def none_names(nodes: list[ast.AST], arguments: ast.arguments) -> dict[str, list[str]]:
    """Each name of a function's scope that is None (or empty) whenever none of the listed
    parameters is given: an optional parameter (itself, unless the body may rebind it to
    something else), a local copy of one (``self_attn_cache = cache``) and what only runs
    when it is not None (``c = c.self_attention_cache``).  Names bound any other way (a
    loop, ``with``, ``+=``, unpacking) are never known None."""
    values: dict[str, list[ast.AST | None]] = {}
    simple: set[int] = set()
    for node in nodes:  # by exact type: a parsed tree holds no subclass of a node class
        kind = type(node)
        if (kind is ast.Assign or kind is ast.AnnAssign) and node.value is not None:  # type: ignore[attr-defined]
            targets = node.targets if kind is ast.Assign else [node.target]  # type: ignore[attr-defined]
            if len(targets) == 1 and isinstance(targets[0], ast.Name):
                values.setdefault(targets[0].id, []).append(node.value)  # type: ignore[attr-defined]
                simple.add(id(targets[0]))
    for node in nodes:
        kind = type(node)
        if kind is ast.Name:
            if type(node.ctx) is not ast.Load and id(node) not in simple:  # type: ignore[attr-defined]
                values.setdefault(node.id, []).append(None)  # type: ignore[attr-defined]
        elif kind in _NAMED and node.name:  # type: ignore[attr-defined]
            values.setdefault(node.name, []).append(None)  # type: ignore[attr-defined]
        elif kind in _DECLARING:
            for alias in node.names:  # type: ignore[attr-defined]
                values.setdefault(alias if isinstance(alias, str) else (alias.asname or alias.name), []).append(None)
    own = optional_params(arguments)
    sources = {name: {name} if name in own else set() for name in set(own) | set(values)}
    for _ in range(2 * len(sources) + 2):  # the largest consistent set: names are only dropped
        states = {name: EMPTY if any(own.get(p) == EMPTY for p in params) else NONE
                  for name, params in sources.items()}
        updated: dict[str, set[str]] = {}
        for name in sources:
            found = [_none_sources(v, sources, states) if v is not None else None for v in values.get(name, ())]
            if all(f is not None for f in found):
                updated[name] = ({name} if name in own else set()).union(*found)  # type: ignore[arg-type]
        if updated == sources:
            return {name: sorted(params) for name, params in sources.items()}
        sources = updated
    return {}


#: what :func:`argument_value` reads of a function: each name that is None (or empty) while
#: the listed parameters are not given, with those parameters, and which of the two it is
NoneStates = tuple[dict[str, set[str]], dict[str, str]]


def none_states(none_if: dict[str, list[str]], own: dict[str, str]) -> NoneStates:
    """A function's :data:`NoneStates`, from its :func:`none_names` and :func:`optional_params`
    (once a function)."""
    sources = {name: set(params) for name, params in none_if.items()}
    return sources, {name: EMPTY if any(own.get(p) == EMPTY for p in params) else NONE
                     for name, params in sources.items()}


def argument_value(node: ast.AST, known: NoneStates) -> str:
    """A call argument as :func:`passes_on` reads it: a name, ``"None"`` for what is always
    None, the parameters (space-separated) that, all left out, make it None
    (``cache.self_attention_cache if cache is not None else None``), ``""`` otherwise."""
    if isinstance(node, ast.Name):
        return node.id
    sources, states = known
    if isinstance(node, ast.Constant) or not sources:
        return "None" if isinstance(node, ast.Constant) and node.value is None else ""
    found = _none_sources(node, sources, states)
    return "" if found is None else " ".join(sorted(found)) or "None"


def unreachable(function: FunctionFacts, passes: list[tuple[int, tuple[str, ...]] | None], line: int) -> bool:
    """Whether ``line`` of ``function`` is in a branch that cannot run for any of the ways
    the region calls it (``passes``: positional count and keyword names of each call; None
    for a call whose arguments are not known)."""
    if not passes or not function.guards or any(p is None for p in passes):
        return False
    for passed in passes:
        given = _given(function, passed)  # type: ignore[arg-type]
        if not any(first <= line <= last and not (set(params) & given) for first, last, params in function.guards):
            return False
    return True


def _given(function: FunctionFacts, passed: tuple[int, tuple[str, ...]]) -> set[str]:
    """The parameters a call that passes ``passed`` gives a value: named ones, and ``*args``
    or ``**kwargs`` when positional arguments or keywords are left over for them; never
    one marked ``-name`` (passed None)."""
    positional, keywords = passed
    nones = {k[1:] for k in keywords if k.startswith("-")}
    if SPLAT in keywords:  # a ``**`` splat of unknown contents: all but the keywords known empty
        return (set(function.params) | set(function.keyword_only) | {s for s in function.star if s}) - nones
    keywords = tuple(k for k in keywords if not k.startswith("-"))
    given = (set(function.params[:positional]) - nones) | set(keywords)
    vararg, kwarg = function.star if len(function.star) == 2 else ("", "")
    if vararg and positional > len(function.params):
        given.add(vararg)
    named = set(function.params) | set(function.keyword_only)
    if kwarg and any(k not in named for k in keywords):
        given.add(kwarg)
    return given


#: In a call's keywords: a ``**`` splat whose contents are unknown (see :func:`passes_on`);
#: ``-name`` then marks a keyword known to pass nothing.
SPLAT = "**?"


def binds(callee: FunctionFacts, call: tuple[int, int, int, tuple[str, ...], tuple[str, ...], int, tuple[str, ...]]) -> bool:
    """Whether a bound call (``self.attn(...)``) can bind its positional arguments to
    ``callee``'s parameters: not more than it takes, unless it has ``*args``.  One that
    cannot raises before the callee runs.  (Keywords are not checked: a decorator such as
    ``deprecate_kwarg`` accepts names the signature lacks.)"""
    return len(callee.star) != 2 or callee.star[0] != "" or call[2] <= len(callee.params)


def passes_on(caller: FunctionFacts, call: tuple[int, int, int, tuple[str, ...], tuple[str, ...], int, tuple[str, ...]],
              empty: set[str] | None, callee: FunctionFacts | None = None) -> tuple[int, tuple[str, ...]] | None:
    """What one call of ``caller`` passes on to its callee, when known: no ``*`` splat, and
    every ``**`` splat of a name in ``empty`` (parameters the caller got none of).  An
    argument that is ``None``, or a name that is None while those parameters are (a copy
    of one, see :func:`none_names`), passes nothing to the ``callee`` parameter it binds
    to, by keyword or by position; nor does a splat of the caller's ``**kwargs`` pass one
    of the caller's named parameters (positional-only ones are not told apart)."""
    _, _, positional, keywords, splats, _, arguments = call
    if positional < 0:
        return None
    kwarg = caller.star[1] if len(caller.star) == 2 else ""
    own = set(caller.optional) | {kwarg}
    held = {name for name in (empty or ()) if name not in own}  # in the caller's **kwargs, as none
    empty = {name for name in (empty or ()) if name in own}

    def none(value: str) -> bool:
        return bool(value) and all(name == "None" or (name in caller.none_if and set(caller.none_if[name]) <= empty)
                                   for name in value.split())

    pairs = [(name, value) for name, _, value in (k.partition("=") for k in keywords)]
    if callee is not None:  # `self.attn(x, None, mask, self_attn_cache)`: by position
        pairs += [(param, value) for param, value in zip(callee.params, arguments) if none(value)]
    passed = tuple(name for name, value in pairs if not none(value))
    nones = tuple(f"-{name}" for name, value in pairs if none(value))
    if any(name not in empty for name in splats):
        # `f(x, cache=cache, **kwargs)`: the splat may give any other parameter, not `cache`;
        # nor a keyword the caller's own `**kwargs` is known to hold as None (see empty_params)
        named = {name for name, _ in pairs}
        if kwarg and kwarg in splats:
            nones += tuple(f"-{name}" for name in sorted(held - named))
            if callee is not None and all(name == kwarg or name in empty for name in splats):
                # the caller's `**kwargs` never holds a keyword naming one of its own parameters
                bound = set(callee.params[:positional]) | named
                nones += tuple(f"-{name}" for name in sorted(set(caller.params) | set(caller.keyword_only))
                               if name not in bound and (name in callee.params or name in callee.keyword_only))
        return positional, (*passed, SPLAT, *nones)
    return positional, (*passed, *nones)


def empty_params(function: FunctionFacts, passed: tuple[int, tuple[str, ...]] | None) -> set[str]:
    """The optional parameters of ``function`` a call that passes ``passed`` leaves out, and
    the keywords it passes as none into ``function``'s ``**kwargs`` (``-cache``)."""
    if passed is None:
        return set()
    given = _given(function, passed)
    left_out = {name for name in function.optional if name not in given}
    if len(function.star) == 2 and function.star[1]:  # `-cache` lands in **kwargs as None: passed on as none
        named = set(function.params) | set(function.keyword_only)
        left_out |= {k[1:] for k in passed[1] if k.startswith("-") and k[1:] not in named}
    return left_out
