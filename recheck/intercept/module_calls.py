"""Which modules run: every ``nn.Module`` call, seen at one Python frame a call.

``watch()`` compares the state of the modules a region's forward runs, so it must see each
module called while a forward is in progress.  A global forward pre-hook
(``register_module_forward_pre_hook``) tells that, but any hook sends every module call of the
program down ``Module._call_impl``'s slow path: a closure made per call and the hooks'
bookkeeping in Python, for every module of every layer, and the hook's own call on top.
So while someone listens, :func:`listen` puts a function of one frame in place of
``torch.nn.Module._call_impl`` (which ``Module.__call__`` calls for every module not compiled
on its own): it tells the listener the module, then calls the ``_call_impl`` it replaced, which
with no hooks registered takes torch's fast path.  The listener runs before the module's own
pre-hooks and its forward, where the global pre-hook ran.

Setting a class attribute of ``nn.Module`` costs more than the call it saves (the
interpreter's caches of every module class's attributes start again), so a ``watch()`` block
keeps the patch in place for its length (:func:`hold`), silent between forwards, and a forward
only sets the listener.

Where ``Module.__call__`` is not torch's ``_wrapped_call_impl`` (an older or a patched torch)
the global pre-hook is used instead: the same calls are seen, at the old cost.  Whoever
replaces ``_call_impl`` after :func:`listen` keeps their replacement when the last listener
goes; ours, below it, then passes calls straight through.

A listener that has no use for the calls of some modules (``watch()``'s record, once a module
ran, compares the state of its whole subtree: its submodules' calls add nothing) says so with
:func:`pass_over`; their calls then cost the wrapper a dict lookup, not the listener's frame.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

import torch
from torch.nn.modules import module as torch_module

__all__ = ["hold", "listen", "listening", "pass_over"]

#: what the listener is told: the module about to run
Listener = Callable[[torch.nn.Module], None]

_lock = threading.Lock()
#: how many listen (one listener at a time: ``watch()``'s dispatcher is process-wide)
_users = 0
#: the holds of the patch (see :func:`hold`)
_holds = 0
#: our ``_call_impl`` last put in place, what it replaced, and its box: a list holding the
#: listener (None: silent) and the ids of the modules whose calls it is not told (see
#: :func:`pass_over`).  A wrapper left below another's patch keeps a box of its own, which
#: stays empty, so it passes calls on untold
_top: Callable[..., Any] | None = None
_top_replaced: Callable[..., Any] | None = None
#: the ids passed over when no one said otherwise: none (never written)
_NONE_PASSED: dict[int, None] = {}
_box: list[Any] = [None, _NONE_PASSED]
#: the global pre-hook's handle, where it is used instead (see :func:`_patchable`)
_handle: Any = None


def _wrapper(replaced: Callable[..., Any], box: list[Any]) -> Callable[..., Any]:
    def _call_impl(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        """``Module._call_impl`` while the patch is in place: tell the listener, if one
        listens and the module is not passed over, then call what was there."""
        listener = box[0]
        if listener is not None and id(self) not in box[1]:
            listener(self)
        return replaced(self, *args, **kwargs)

    return _call_impl


def _patchable() -> bool:
    """Whether ``Module.__call__`` is torch's ``_wrapped_call_impl``, which calls ``_call_impl``."""
    namespace = _MODULE_NAMESPACE
    return (namespace.get("__call__") is namespace.get("_wrapped_call_impl", _MISSING)
            and callable(namespace.get("_call_impl")))


#: ``torch.nn.Module``'s namespace (a live view: it shows what is set on the class later)
_MODULE_NAMESPACE = vars(torch.nn.Module)
_MISSING = object()


def _put_in_place() -> None:
    """Our ``_call_impl`` on top, unless it is there already (called under the lock)."""
    global _top, _top_replaced, _box
    if _top is None or torch.nn.Module.__dict__.get("_call_impl") is not _top:
        # a wrapper left below another's patch goes silent; the new one takes over its box's contents
        listener, passed, _box[0], _box[1] = _box[0], _box[1], None, _NONE_PASSED
        _box = [listener, passed]
        _top_replaced = torch.nn.Module.__dict__["_call_impl"]
        _top = _wrapper(_top_replaced, _box)
        torch.nn.Module._call_impl = _top  # type: ignore[method-assign]


def _take_away() -> None:
    """Put back what our ``_call_impl`` replaced, when nothing was put over it (under the lock)."""
    global _top
    if _top is not None and _top_replaced is not None and torch.nn.Module.__dict__.get("_call_impl") is _top:
        torch.nn.Module._call_impl = _top_replaced  # type: ignore[method-assign]
        _top = None
    # else another patch wraps ours: ours stays below it, passing calls on untold


def hold() -> Callable[[], None]:
    """Keep the patch in place, silent while no one listens, until the function returned is
    called (once).  Setting a class attribute of ``nn.Module`` invalidates the interpreter's
    caches of every module class's attributes: a ``watch()`` block holds the patch for its
    whole length, so that a listener set and unset at every region's forward costs nothing
    but the assignment (and each module call outside a forward one Python frame)."""
    global _holds
    with _lock:
        _holds += 1
        if _patchable():
            _put_in_place()
    return _once(_let_go)


def _let_go() -> None:
    global _holds
    _holds -= 1
    if not _holds and not _users:
        _take_away()


def listen(listener: Listener) -> Callable[[], None]:
    """Tell ``listener`` every module called from now on, in any thread, until the function
    returned is called (once).  Listeners nest only as the same one: the first one's stays."""
    global _users, _handle
    with _lock:
        _users += 1
        if _users == 1:
            _box[0] = listener
            if not _held_in_place():
                if not _patchable():
                    _handle = torch_module.register_module_forward_pre_hook(lambda module, args: listener(module))
                else:
                    _put_in_place()
    return _once(_stop)


def _held_in_place() -> bool:
    """Whether our ``_call_impl`` is on top and ``Module.__call__`` calls it: a ``watch()`` block
    holds the patch, so every forward that starts listening finds it so (called under the lock)."""
    return _top is not None and _MODULE_NAMESPACE.get("_call_impl") is _top and _patchable()


def _stop() -> None:
    global _users, _handle
    _users -= 1
    if _users:
        return
    _box[0], _box[1] = None, _NONE_PASSED
    if _handle is not None:
        _handle.remove()
        _handle = None
    elif not _holds:
        _take_away()


def _once(undo: Callable[[], None]) -> Callable[[], None]:
    """``undo`` under the lock, the first time the function returned is called."""
    done = False

    def once() -> None:
        nonlocal done
        with _lock:
            if not done:
                done = True
                undo()
    return once


def pass_over(ids: dict[int, None] | None) -> None:
    """From now on, do not tell the listener of calls of the modules whose ids are keys of
    ``ids`` (a dict its owner may add to as it goes: the modules it knows of already), or,
    with None, tell it of every call.  Whoever listens says this for every thread at once, so
    only while calls in one thread matter; a fallback to the global pre-hook tells every call."""
    _box[1] = _NONE_PASSED if ids is None else ids


def listening() -> bool:
    """Whether a listener is told of module calls now."""
    return _box[0] is not None
