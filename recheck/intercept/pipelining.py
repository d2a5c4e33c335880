"""Stage and microbatch labels for ``torch.distributed.pipelining``, with no user code change.

A pipeline schedule runs each microbatch on a stage through three methods of
``torch.distributed.pipelining.stage._PipelineStageBase``: ``forward_one_chunk(fwd_chunk_id,
...)``, ``backward_one_chunk(bwd_chunk_id, ...)`` and, for split-backward schedules,
``backward_weight_one_chunk(bwd_chunk_id, ...)``.  While this module is acquired those
methods are wrapped, so that

* each runs inside ``recheck.tag(stage=stage.stage_index, microbatch=chunk_id)`` — labels
  the user set with :func:`recheck.tag` around the schedule win over the automatic ones;
* every :class:`ChunkListener` is told when a :class:`ChunkAction` begins and ends (the
  cost report attributes saved state to microbatch bundles this way).

The patch is installed only when ``torch.distributed.pipelining`` has already been imported
(importing it is slow, as it brings in much of ``torch.distributed``, and a program that
builds pipeline stages has imported it before it runs them).  :func:`acquire` and :func:`release` count nested users; the last
release puts the original functions back (``is`` identity).
"""

from __future__ import annotations

import functools
import sys
import threading
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from recheck.runtime.tags import current_tags, tag

__all__ = ["STAGE_MODULE", "ChunkAction", "ChunkListener", "acquire", "installed", "release"]

#: The module holding the stage base class whose chunk methods are wrapped.
STAGE_MODULE = "torch.distributed.pipelining.stage"
#: method name -> (phase, name of its chunk-id parameter)
_METHODS = {
    "forward_one_chunk": ("forward", "fwd_chunk_id"),
    "backward_one_chunk": ("backward", "bwd_chunk_id"),
    "backward_weight_one_chunk": ("backward_weight", "bwd_chunk_id"),
}


@dataclass(frozen=True)
class ChunkAction:
    """One microbatch's forward, backward or weight-backward on one pipeline stage."""

    phase: str
    stage: int
    microbatch: int
    num_stages: int | None = None

    def __str__(self) -> str:
        return f"{self.phase} of microbatch {self.microbatch} on stage {self.stage}"


class ChunkListener(Protocol):
    """Told when each chunk action begins and ends (``end`` also runs when it raises)."""

    def chunk_begins(self, action: ChunkAction) -> None: ...

    def chunk_ends(self, action: ChunkAction) -> None: ...


_lock = threading.RLock()
_users = 0
_listeners: list[ChunkListener] = []
_originals: dict[str, Callable[..., Any]] = {}
_stage_class: Any = None


def _chunk_id(parameter: str, args: tuple, kwargs: dict) -> Any:
    return args[0] if args else kwargs.get(parameter)


def _wrap(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    phase, parameter = _METHODS[name]

    @functools.wraps(original)
    def chunk_method(self: Any, *args: Any, **kwargs: Any) -> Any:
        chunk = _chunk_id(parameter, args, kwargs)
        stage = getattr(self, "stage_index", None)
        if not isinstance(chunk, int) or not isinstance(stage, int):
            return original(self, *args, **kwargs)
        action = ChunkAction(phase, stage, chunk, getattr(self, "num_stages", None))
        user = current_tags()
        automatic = {key: value for key, value in (("stage", stage), ("microbatch", chunk)) if key not in user}
        listeners = list(_listeners)
        with tag(**automatic):
            for listener in listeners:
                listener.chunk_begins(action)
            try:
                return original(self, *args, **kwargs)
            finally:
                for listener in reversed(listeners):
                    listener.chunk_ends(action)

    chunk_method.__recheck_original__ = original  # type: ignore[attr-defined]
    return chunk_method


def acquire(listener: ChunkListener | None = None) -> bool:
    """Start labelling (and telling ``listener``); True when the stage class is patched."""
    global _users, _stage_class
    with _lock:
        if listener is not None:
            _listeners.append(listener)
        _users += 1
        if _stage_class is None:
            stage_module = sys.modules.get(STAGE_MODULE)
            base = getattr(stage_module, "_PipelineStageBase", None)
            if base is not None:
                for name in _METHODS:
                    original = base.__dict__.get(name)
                    if original is not None:
                        _originals[name] = original
                        setattr(base, name, _wrap(name, original))
                _stage_class = base
        return _stage_class is not None


def release(listener: ChunkListener | None = None) -> None:
    """Undo one :func:`acquire`; the last one puts the original methods back."""
    global _users, _stage_class
    with _lock:
        if listener is not None and listener in _listeners:
            _listeners.remove(listener)
        if _users == 0:
            raise RuntimeError("recheck: pipelining labels released more often than acquired")
        _users -= 1
        if _users == 0 and _stage_class is not None:
            for name, original in _originals.items():
                setattr(_stage_class, name, original)
            _originals.clear()
            _stage_class = None


def installed() -> bool:
    """True while the stage class's chunk methods are wrapped."""
    return _stage_class is not None
