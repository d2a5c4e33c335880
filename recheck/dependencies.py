"""The optional dependencies of recheck's faces, and what to say when one is missing.

The linter and the rule catalogue need only the standard library (and tqdm for progress bars), so a plain
``pip install recheck`` does not bring in PyTorch (gigabytes) for them: a pre-commit hook
gets that light install.  The dynamic faces (``recheck check``, ``recheck cost``,
``recheck.watch()``, ``pytest --recheck``) need torch; :func:`require_torch` says how to
install it before anything tries to import it.  Nothing here imports torch.
"""

from __future__ import annotations

import importlib.util
import sys

__all__ = ["TORCH_REQUIREMENT", "MissingDependency", "require_torch", "torch_installed"]

#: The lower bound recheck declares for torch (never a pin).
TORCH_REQUIREMENT = "torch>=2.4"


class MissingDependency(ModuleNotFoundError):
    """A face needs a package that is not installed; the message says how to install it."""


def torch_installed() -> bool:
    """Whether ``import torch`` can find torch (without importing it)."""
    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):  # a broken or half-removed install
        return False


def torch_message(feature: str) -> str:
    """What a user who runs ``feature`` without torch is told."""
    return (f"{feature} needs PyTorch ({TORCH_REQUIREMENT}), which is not installed for "
            f"{sys.executable}: install it the way you normally do "
            "(https://pytorch.org/get-started/locally/), or `pip install 'recheck[torch]'`; "
            "`recheck lint`, `recheck rules` and `recheck explain` work without it")


def require_torch(feature: str) -> None:
    """Raise :class:`MissingDependency` naming ``feature`` when torch cannot be imported."""
    if not torch_installed():
        raise MissingDependency(torch_message(feature), name="torch")
