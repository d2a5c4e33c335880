"""RC001: a checkpoint entry point whose default is reentrant, called without ``use_reentrant``."""

from __future__ import annotations

from typing import Iterator

from recheck.lint.facts import CallSite, Hazard
from recheck.lint.rules.base import Rule, RegionView
from recheck.lint.targets import ENTRY_POINTS

CODE = "RC001"


class UseReentrant(Rule):
    CODE = CODE

    def site(self, site: CallSite, regions: list[RegionView]) -> Iterator[tuple[str | None, Hazard]]:
        """A hazard when the call leaves ``use_reentrant`` out of an entry point that then runs
        its reentrant implementation (torch's, Transformer Engine's, colossalai's; timm's and
        xformers' default to non-reentrant).  A ``**`` splat may carry the keyword: no hazard."""
        entry = ENTRY_POINTS.get(site.entry)
        if entry is None or not entry.reentrant_default or entry.reentrant_keyword != "use_reentrant" \
                or site.use_reentrant != "missing":
            return  # DeepSpeed's, Megatron's, fairscale's are reentrant with no keyword to change it
        name = site.entry.rsplit(".", 1)[-1]
        if entry.library == "torch":
            then = "torch 2.x warns and falls back to the reentrant implementation; pass `use_reentrant=False`"
        else:
            then = f"{entry.library}'s `{name}` defaults to the reentrant implementation; pass `use_reentrant=False`"
        hazard = Hazard(CODE, site.span, f"`{name}` is called without an explicit `use_reentrant`", then)
        yield (regions[0].name if regions else None), hazard
