"""Byte sizes: parse ``40GiB`` / ``1.5GB`` / ``512MiB`` and format bytes for tables.

This module imports nothing from torch, so the CLI can validate ``--budget`` cheaply.
"""

from __future__ import annotations

import re

__all__ = ["format_bytes", "format_count", "parse_bytes"]

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_PATTERN = re.compile(r"^\s*([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))\s*([a-zA-Z]*)\s*$")


def parse_bytes(text: str) -> int:
    """Bytes in ``text`` such as ``40GiB``, ``1.5GB``, ``512MiB`` or ``1000``; ValueError if not."""
    match = _PATTERN.match(text)
    if not match or match.group(2).lower() not in _UNITS:
        raise ValueError(
            f"not a size: {text!r} (write a number with an optional unit: B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)"
        )
    value = float(match.group(1)) * _UNITS[match.group(2).lower()]
    if value <= 0:
        raise ValueError(f"a size must be positive, got {text!r}")
    return int(value)


def format_bytes(n: float) -> str:
    """``n`` bytes in binary units with three significant figures (``-`` sign kept)."""
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{sign}{n / size:.2f} {unit}"
    return f"{sign}{int(n)} B"


def format_count(n: float, unit: str = "") -> str:
    """A large count with an SI prefix: ``format_count(6.98e9, "FLOP")`` is ``6.98 GFLOP``."""
    sign = "-" if n < 0 else ""
    n = abs(n)
    for prefix, size in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{sign}{n / size:.2f} {prefix}{unit}"
    return f"{sign}{int(n)} {unit}".rstrip()
