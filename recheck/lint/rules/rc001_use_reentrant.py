"""RC001: a checkpoint entry point whose default is reentrant, called without ``use_reentrant``."""

from __future__ import annotations

from recheck.lint.facts import CallSite, Hazard
from recheck.lint.targets import ENTRY_POINTS

CODE = "RC001"


def runs_reentrant(site: CallSite) -> bool | None:
    """Whether the call runs a reentrant implementation: the constant it passes as
    ``use_reentrant``, else its entry point's default; None when that cannot be told
    (a value computed at run time, a ``**`` splat, an entry point the linter discovered)."""
    if site.use_reentrant == "given":
        return site.reentrant
    entry = ENTRY_POINTS.get(site.entry)
    if site.use_reentrant == "missing" and entry is not None:
        return entry.reentrant_default
    return None


def check_site(site: CallSite) -> Hazard | None:
    """A hazard when the call leaves ``use_reentrant`` out of an entry point that then runs
    its reentrant implementation (torch's, Transformer Engine's, colossalai's; timm's and
    xformers' default to non-reentrant).  A ``**`` splat may carry the keyword: no hazard."""
    entry = ENTRY_POINTS.get(site.entry)
    if entry is None or not entry.reentrant_default or entry.reentrant_keyword != "use_reentrant" \
            or site.use_reentrant != "missing":
        return None  # DeepSpeed's, Megatron's, fairscale's are reentrant with no keyword to change it
    name = site.entry.rsplit(".", 1)[-1]
    if entry.library == "torch":
        then = "torch 2.x warns and falls back to the reentrant implementation; pass `use_reentrant=False`"
    else:
        then = f"{entry.library}'s `{name}` defaults to the reentrant implementation; pass `use_reentrant=False`"
    return Hazard(CODE, site.span, f"`{name}` is called without an explicit `use_reentrant`", then)
