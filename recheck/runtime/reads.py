"""The names a region's code can read, as attributes or globals: found from its code objects.

A state difference between a region's forward and its recompute matters to the region only
where the region reads the part that changed: a trainer that sets ``self._current_fx_name``
between forward and backward, or a head that sets ``config.problem_type`` on a config every
layer holds, changes nothing a region computes unless the region's code names the attribute.
What the code names is read from its code objects (``co_names``: every attribute and global
name it loads or stores), starting from the checkpointed callable and the forwards and forward
hooks of the modules in the region's scope, and following the functions it names: functions of
its own module's globals, methods and properties of the classes of those modules and of the
objects they hold, functions in its closure cells and ``partial`` arguments.  The set is an
over-estimate (a name read on any object counts for every object), so a difference is left out
only where no code the region can run names it.  Not seen: names read by ``getattr(obj, name)``
with a computed name, and code reached only through library functions (torch's own call
machinery is followed as methods of the modules' classes).
"""

from __future__ import annotations

import functools
import types
from typing import Any, Iterable

import torch

from recheck.runtime.reach import code_module_attributes, is_library

__all__ = ["code_names", "names_read", "root_functions"]


def code_names(code: types.CodeType) -> frozenset[str]:
    """The attribute and global names a code object, and the code nested in it, names."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= code_names(const)
    return frozenset(names)


def root_functions(value: Any, depth: int = 4) -> list[types.FunctionType] | None:
    """The Python functions a callable runs first: itself, a bound method's function, a
    ``partial``'s function and callable arguments, a module's ``forward`` and forward hooks,
    a callable object's ``__call__``.  None where one has no Python code (a builtin)."""
    if isinstance(value, types.FunctionType):
        wrapped = getattr(value, "__wrapped__", None)
        inner = root_functions(wrapped, depth - 1) if wrapped is not None and depth > 0 else []
        return [value, *(inner or ())]
    if depth <= 0:
        return None
    if isinstance(value, types.MethodType):
        return root_functions(value.__func__, depth - 1)
    if isinstance(value, functools.partial):
        found = root_functions(value.func, depth - 1)
        if found is None:
            return None
        for arg in (*value.args, *value.keywords.values()):
            if isinstance(arg, (types.FunctionType, types.MethodType, functools.partial)):
                more = root_functions(arg, depth - 1)
                found += more or ()
        return found
    if isinstance(value, torch.nn.Module):
        # a forward set on the instance (accelerate's hooks wrap it so) runs instead of the class's
        own = vars(value).get("forward")
        found = root_functions(own if own is not None else type(value).forward, depth - 1) or []
        for hooks in (value._forward_pre_hooks, value._forward_hooks):
            for hook in list(hooks.values()):
                found += root_functions(hook, depth - 1) or ()
        return found
    call = getattr(type(value), "__call__", None)
    if isinstance(call, types.FunctionType):
        return [call]
    return None


def names_read(roots: Iterable[types.FunctionType], classes: Iterable[type]) -> frozenset[str]:
    """Every name the code of ``roots`` names, following the functions it names (see the
    module docstring) through ``classes``' methods and properties."""
    methods: dict[str, list[Any]] = {}
    todo = list(roots)
    for cls in set(classes):
        for klass in cls.__mro__:
            for name, member in vars(klass).items():
                methods.setdefault(name, []).append(member)
            if not is_library(klass.__module__):  # an object of it called (``self.scale(x)``) runs its
                todo += _functions_in(vars(klass).get("__call__"))  # __call__, which no code names
    names: set[str] = set()
    walked: set[types.CodeType] = set()
    while todo:
        function = todo.pop()
        code = function.__code__
        if code in walked:
            continue
        walked.add(code)
        read = code_names(code)
        names |= read
        namespace = function.__globals__
        for name in read:
            value = namespace.get(name)
            if isinstance(value, types.FunctionType) and not is_library(value.__module__):
                todo.append(value)
            for member in methods.get(name, ()):
                todo += _functions_in(member)
        for module_name, attr in code_module_attributes(code):
            module = namespace.get(module_name)
            if isinstance(module, types.ModuleType) and not is_library(module.__name__):
                todo += _functions_in(vars(module).get(attr))
        for cell in function.__closure__ or ():
            try:
                todo += root_functions(cell.cell_contents) or ()
            except ValueError:  # an empty cell
                pass
    return frozenset(names)


def _functions_in(member: Any) -> list[types.FunctionType]:
    """The functions a class member or module attribute runs when named."""
    if isinstance(member, (staticmethod, classmethod)):
        member = member.__func__
    if isinstance(member, property):
        return [f for f in (member.fget, member.fset, member.fdel) if isinstance(f, types.FunctionType)]
    return [member] if isinstance(member, types.FunctionType) else []
