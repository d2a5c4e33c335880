"""Which modules run: every ``nn.Module`` call while someone listens.

``watch()`` compares the state of the modules a region's forward runs, so it must see each
module called while a forward is in progress.  :func:`listen` registers a global forward
pre-hook (``register_module_forward_pre_hook``) for as long as a listener listens: the listener
runs before the module's own pre-hooks and its forward, and torch is left as found when the
last listener goes.

A listener that has no use for the calls of some modules (``watch()``'s record, once a module
ran, compares the state of its whole subtree: its submodules' calls add nothing) says so with
:func:`pass_over`; their calls then cost a dict lookup, not the listener's call.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

import torch
from torch.nn.modules import module as torch_module

__all__ = ["listen", "listening", "pass_over"]

#: what the listener is told: the module about to run
Listener = Callable[[torch.nn.Module], None]

_lock = threading.Lock()
#: how many listen (one listener at a time: ``watch()``'s dispatcher is process-wide)
_users = 0
#: the ids passed over when no one said otherwise: none (never written)
_NONE_PASSED: dict[int, None] = {}
#: the listener (None: no one listens) and the ids of the modules whose calls it is not told
_box: list[Any] = [None, _NONE_PASSED]
#: the global pre-hook's handle while someone listens
_handle: Any = None


def _pre_hook(module: torch.nn.Module, _args: Any) -> None:
    listener = _box[0]
    if listener is not None and id(module) not in _box[1]:
        listener(module)


def listen(listener: Listener) -> Callable[[], None]:
    """Tell ``listener`` every module called from now on, in any thread, until the function
    returned is called (once).  Listeners nest only as the same one: the first one's stays."""
    global _users, _handle
    with _lock:
        _users += 1
        if _users == 1:
            _box[0] = listener
            _handle = torch_module.register_module_forward_pre_hook(_pre_hook)
    done = False

    def stop() -> None:
        nonlocal done
        with _lock:
            if not done:
                done = True
                _stop()
    return stop


def _stop() -> None:
    global _users, _handle
    _users -= 1
    if not _users:
        _box[0], _box[1] = None, _NONE_PASSED
        _handle.remove()
        _handle = None


def pass_over(ids: dict[int, None] | None) -> None:
    """From now on, do not tell the listener of calls of the modules whose ids are keys of
    ``ids`` (a dict its owner may add to as it goes: the modules it knows of already), or,
    with None, tell it of every call.  Whoever listens says this for every thread at once, so
    only while calls in one thread matter."""
    _box[1] = _NONE_PASSED if ids is None else ids


def listening() -> bool:
    """Whether a listener is told of module calls now."""
    return _box[0] is not None
