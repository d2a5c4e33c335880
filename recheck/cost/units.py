"""Byte sizes: parse ``40GiB`` / ``1.5GB`` / ``512MiB`` and format bytes for tables.

This module imports nothing from torch, so the CLI can validate ``--budget`` cheaply.
"""

from __future__ import annotations

import re

__all__ = ["format_bytes", "format_count", "format_ms", "parse_bytes"]

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
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


def _scaled(n: float, sizes: tuple[tuple[str, float], ...], unit: str) -> str:
    sign, n = "-" if n < 0 else "", abs(n)
    for name, size in sizes:
        if n >= size:
            return f"{sign}{n / size:.2f} {name}"
    return f"{sign}{int(n)} {unit}".rstrip()


def format_bytes(n: float) -> str:
    """``n`` bytes in binary units with three significant figures (``-`` sign kept)."""
    return _scaled(n, (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)), "B")


def format_count(n: float, unit: str = "") -> str:
    """A large count with an SI prefix: ``format_count(6.98e9, "FLOP")`` is ``6.98 GFLOP``."""
    return _scaled(n, ((f"T{unit}", 1e12), (f"G{unit}", 1e9), (f"M{unit}", 1e6), (f"k{unit}", 1e3)), unit)


def format_ms(seconds: float | None) -> str:
    """Seconds as milliseconds, ``12.3 ms`` (``-`` for None or NaN)."""
    return "-" if seconds is None or seconds != seconds else f"{seconds * 1e3:.1f} ms"
