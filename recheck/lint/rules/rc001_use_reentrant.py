"""RC001: torch's ``checkpoint``/``checkpoint_sequential`` called without ``use_reentrant``."""

from __future__ import annotations

from recheck.lint.facts import CallSite, Hazard

CODE = "RC001"
#: Entry points whose ``use_reentrant`` default is unsafe (wrappers such as timm's are not).
ENTRIES = frozenset({"torch.utils.checkpoint.checkpoint", "torch.utils.checkpoint.checkpoint_sequential"})


def check_site(site: CallSite) -> Hazard | None:
    """A hazard when the call leaves ``use_reentrant`` out (a ``**`` splat may carry it: no)."""
    if site.entry not in ENTRIES or site.use_reentrant != "missing":
        return None
    name = site.entry.rsplit(".", 1)[-1]
    return Hazard(
        CODE,
        site.span,
        f"`{name}` is called without an explicit `use_reentrant`",
        "torch 2.x warns and falls back to the reentrant implementation; pass `use_reentrant=False`",
    )
