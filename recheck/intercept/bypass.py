"""Every checkpoint call of a block runs its region directly: the uncheckpointed twin.

``recheck.check_step()`` runs a step as written and then with every checkpoint bypassed: the
region function is called exactly as the checkpoint call would have called it (its own
keyword arguments, under the caller's grad mode), with nothing else changed, so library flags
such as transformers' ``gradient_checkpointing`` stay as they are.  A direct
``CheckpointFunction.apply`` cannot be bypassed (it is torch's own autograd Function); it stays
checkpointed and the report says so.
"""

from __future__ import annotations

import contextlib
from typing import Iterable, Iterator

from recheck.intercept import patches
from recheck.intercept.hooks import CheckpointCall, Interceptor

__all__ = ["Bypass", "bypassing"]


class Bypass(Interceptor):
    """The interceptor that bypasses every call; counts what it bypassed and what it could not."""

    def __init__(self) -> None:
        self.bypassed = 0
        self.notes: list[str] = []

    def bypass(self, call: CheckpointCall) -> bool:
        self.bypassed += 1
        return True

    def cannot_bypass(self, call: CheckpointCall) -> None:
        self.bypassed -= 1
        self._note(f"{call.region}: CheckpointFunction.apply called directly cannot be bypassed; "
                   "it stayed checkpointed in the uncheckpointed twin")

    def compiled(self) -> None:
        self._note("checkpoint calls traced by torch.compile ran as compiled in both twins")

    def _note(self, note: str) -> None:
        if note not in self.notes:
            self.notes.append(note)


@contextlib.contextmanager
def bypassing(extra_functions: Iterable[str] = ()) -> Iterator[Bypass]:
    """Bypass every checkpoint call made inside the block: torch's entry points, the known
    libraries' (DeepSpeed, Megatron, fairscale) and the dotted ``extra_functions`` a project
    declares (``checkpoint-functions``).  Nesting inside another interception is refused: the
    block's calls would go to the outer one."""
    if patches.installed() is not None:
        raise RuntimeError("recheck: checkpoint calls are already intercepted (inside recheck.watch(), "
                           "recheck.measure() or another check_step); run this outside that block")
    bypass = Bypass()
    installation = patches.acquire(bypass, extra_functions=tuple(extra_functions))
    for name in extra_functions:
        how = installation.declared.get(name, "")
        if how not in ("code", "rebound"):
            bypass.notes.append(f"checkpoint-functions: {how}; its calls were not bypassed")
    try:
        yield bypass
    finally:
        patches.release()
