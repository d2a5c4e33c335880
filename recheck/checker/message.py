"""The text of a check: region and configuration lines, per-state detail blocks.

The first line of a failing report (``recheck: recomputation differs from the
original forward``) and the numbered entries come from :class:`recheck.findings.Report`;
this module writes what goes inside them (hints come from the rule registry,
:func:`recheck.catalogue.hint`), in the style of
``torch.testing.assert_close``: what the state is, how many elements differ, the first
differing index with both values and bit patterns, the greatest absolute difference.
"""

from __future__ import annotations

from typing import Any

__all__ = ["configuration_text", "title", "value_detail"]

def configuration_text(use_reentrant: bool, preserve_rng_state: bool, early_stop: bool,
                       tolerance: Any = None) -> str:
    """``use_reentrant=False, preserve_rng_state=True, early_stop=True``."""
    text = f"use_reentrant={use_reentrant}, preserve_rng_state={preserve_rng_state}"
    if not use_reentrant:
        text += f", early_stop={early_stop}"
    if tolerance is not None:
        text += f", tolerance: {tolerance}"
    return text


def title(region: str, configuration: str) -> str:
    """The block under the first line: region, then configuration."""
    return f"region         {region}\nconfiguration  {configuration}"


def value_detail(original: str, recomputed: str, labels: tuple[str, str] = ("original", "recomputed")) -> str:
    """``original 3 != recomputed 4`` for non-tensor state."""
    return f"{labels[0]} {original} != {labels[1]} {recomputed}"
