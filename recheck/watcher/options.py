"""What a ``watch()`` block is asked to do: one option model for every face that watches.

``recheck.watch()``, ``recheck check --step``, ``pytest --recheck`` (flags, ini keys, markers)
and ``[tool.recheck]`` all end in one :class:`WatchOptions`, validated here, with the words
``recheck.check()`` uses for the same knobs:

* ``early_stop`` — ``None`` keeps what each checkpoint call says; ``False`` replays every
  non-reentrant recomputation fully (what ``check(early_stop=False)`` runs), so side effects
  after the last saved tensor show (they are marked *latent* for calls that asked for early
  stop); ``True`` forces early stop on.
* ``atol`` with ``rtol``, or ``max_ulp`` — a tolerance for floating-point values, as
  ``check()`` takes it; integer and boolean state stays exact.  A tolerance needs full copies
  of each forward's tensors, so it implies ``store="copy"``.
* ``store`` — ``"digest"`` (exact 128-bit digests, the default) or ``"copy"``.
* ``checkpoint_functions`` — dotted names of the project's own functions that checkpoint their
  first argument (``checkpoint-functions`` in ``[tool.recheck]``, the linter's key): their calls
  are intercepted too (``recheck.intercept.implementations``).

``strict`` is the old name of ``early_stop=False``: still accepted, with a
``DeprecationWarning``.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

from recheck.runtime.bits import Tolerance
from recheck.runtime.digests import STORES

__all__ = ["WatchOptions"]


@dataclass(frozen=True)
class WatchOptions:
    """The validated options of one ``watch()`` block."""

    early_stop: bool | None = None
    store: str = "digest"
    tolerance: Tolerance | None = None
    checkpoint_functions: tuple[str, ...] = ()

    @classmethod
    def of(cls, *, early_stop: bool | None = None, store: str | None = None, atol: float | None = None,
           rtol: float | None = None, max_ulp: int | None = None, strict: bool | None = None,
           checkpoint_functions: Any = None, where: str = "recheck.watch") -> WatchOptions:
        """Validate the options as given; ``where`` names the caller in error messages.

        Raises ``TypeError`` for a value of the wrong type and ``ValueError`` for a bad value
        or combination.
        """
        if strict is not None:
            if not isinstance(strict, bool):
                raise TypeError(f"{where}: strict must be True or False, got {strict!r}")
            warnings.warn(f"{where}: strict= is now early_stop=False (the same word check() uses); "
                          "strict will be removed", DeprecationWarning, stacklevel=3)
            if strict and early_stop is True:
                raise ValueError(f"{where}: strict=True means early_stop=False; got early_stop=True too")
            if strict:
                early_stop = False
        if early_stop is not None and not isinstance(early_stop, bool):
            raise TypeError(f"{where}: early_stop must be None, True or False, got {early_stop!r}")
        try:
            tolerance = Tolerance.of(atol, rtol, max_ulp)
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
        if store is None:
            store = "copy" if tolerance is not None else "digest"
        if store not in STORES:
            raise ValueError(f"{where}: store must be one of {', '.join(map(repr, STORES))}, got {store!r}")
        if tolerance is not None and store != "copy":
            raise ValueError(f"{where}: a tolerance compares values, which digests cannot; "
                             "use store='copy' (the default when a tolerance is given)")
        names: tuple[str, ...] = ()
        if checkpoint_functions is not None:
            if isinstance(checkpoint_functions, str) or not all(
                    isinstance(n, str) and n.strip(".") and "." in n for n in checkpoint_functions):
                raise TypeError(f"{where}: checkpoint_functions must be a list of dotted names "
                                f"('package.module.function'), got {checkpoint_functions!r}")
            names = tuple(checkpoint_functions)
        return cls(early_stop, store, tolerance, names)

    @property
    def replay_fully(self) -> bool:
        """Every non-reentrant recomputation runs to its end (early stop off)."""
        return self.early_stop is False

    def describe(self) -> str:
        """``early_stop=as called, store=digest`` (and the tolerance when there is one)."""
        stop = {None: "as called", True: "on", False: "off"}[self.early_stop]
        text = f"early_stop={stop}, store={self.store}"
        return text + (f", tolerance: {self.tolerance}" if self.tolerance else "")

    def as_kwargs(self) -> dict[str, Any]:
        """The options as ``watch()`` keyword arguments (what a JSON report records)."""
        tolerance = self.tolerance
        values: dict[str, Any] = {"early_stop": self.early_stop, "store": self.store}
        if self.checkpoint_functions:
            values["checkpoint_functions"] = list(self.checkpoint_functions)
        if tolerance is not None:
            values.update({"max_ulp": tolerance.max_ulp} if tolerance.max_ulp is not None
                          else {"atol": tolerance.atol, "rtol": tolerance.rtol})
        return values
