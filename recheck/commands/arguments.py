"""Argument types the subcommands share: one parser for a bounded count.

A count given on the command line is read with ``int`` (so ``1e20`` is refused, not rounded)
and checked against its bounds when argparse reads it, before anything is imported or run:
an unbounded count (``--repeats 100000000000000000000``) would otherwise only show as a run
that never ends.  Nothing here imports torch.
"""

from __future__ import annotations

import argparse
from typing import Callable

__all__ = ["count"]


def count(least: int = 1, most: int | None = None, option: str = "",
          meaning: str = "") -> Callable[[str], int]:
    """The argparse ``type`` of a whole number from ``least`` to ``most`` (``None``: no upper bound).

    ``option`` prefixes the range message (``--ranks must be between 1 and 64, got -2``);
    ``meaning`` explains the lower bound where it has one (``0 (one per CPU)``).
    """

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
        if value < least or (most is not None and value > most):
            subject = f"{option} must be" if option else "must be"
            if most is None:
                bound = f"{meaning or least} or more"
            else:
                bound = f"between {least} and {most}"
            raise argparse.ArgumentTypeError(f"{subject} {bound}, got {value}")
        return value

    return parse
