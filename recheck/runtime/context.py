"""The context a region computes in: grad mode, autocast per device type, the default dtype.

Besides its inputs and the state it reads, three things decide what a region computes, and a
checkpoint implementation must put each back around the recomputation:

* **grad mode** (``torch.is_grad_enabled()``);
* **autocast**, per device type: whether it is enabled and in which dtype (torch's checkpoint
  stashes the state of the inputs' device type and the CPU's; fairscale re-enters only CUDA
  autocast's *enabled* flag; DeepSpeed and Megatron restore none);
* the **default dtype** (``torch.get_default_dtype()``), which no checkpoint restores: a
  factory call without a dtype (``torch.zeros(n)``) computes in whatever it is at the time.

:func:`current_context` reads all of it as a :class:`ComputeContext`; :func:`context_differences`
words what differs between a forward and its recompute, one entry per subject
(``grad mode``, ``autocast `cpu```, ``default dtype``), for every face (``check()``,
``watch()``, the recompute probe).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from recheck.runtime.naming import DEFAULT_DTYPE_SUBJECT, GRAD_MODE_SUBJECT, autocast_subject

__all__ = ["ANY_AUTOCAST_COVERS", "AUTOCAST_DEVICE_TYPES", "ComputeContext", "context_differences", "current_context"]


def _readable(device_type: str) -> bool:
    try:
        torch.is_autocast_enabled(device_type)
        torch.get_autocast_dtype(device_type)
    except (RuntimeError, TypeError, ValueError):
        return False
    return True


#: Device types whose autocast state is read: the CPU, CUDA, and the other accelerators whose
#: autocast state this torch build can report (an unknown one raises and is left out).
AUTOCAST_DEVICE_TYPES: tuple[str, ...] = tuple(
    d for d in ("cpu", "cuda", "xpu", "mps", "hpu", "mtia") if _readable(d))


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True)
class ComputeContext:
    """Grad mode, autocast ``(device type, enabled, dtype)`` for each device type, default dtype."""

    grad_enabled: bool
    #: ``(device type, enabled, dtype)``, the dtype None while that autocast is disabled
    autocast: tuple[tuple[str, bool, torch.dtype | None], ...]
    default_dtype: torch.dtype

    def autocast_of(self, device_type: str) -> tuple[bool, torch.dtype | None]:
        """``(enabled, dtype)`` of one device type's autocast; the dtype only when enabled."""
        for device, enabled, dtype in self.autocast:
            if device == device_type:
                return enabled, (dtype if enabled else None)
        return False, None

    def describe_autocast(self, device_type: str) -> str:
        enabled, dtype = self.autocast_of(device_type)
        return f"enabled ({_dtype_name(dtype)})" if enabled and dtype is not None else "disabled"


def current_context(grad_enabled: bool | None = None) -> ComputeContext:
    """The context now; ``grad_enabled`` stands for the grad mode when the caller knows better.

    A reentrant-style checkpoint runs its forward under ``no_grad`` by design, and an
    ``autograd.Function``'s forward always runs with grad off: the grad mode the region is
    meant to run in is the one at the checkpoint call, which the caller passes here.
    A device type's autocast dtype is kept only while its autocast is enabled (a disabled
    autocast's dtype computes nothing).  It is read twice for every checkpoint invocation
    ``watch()`` sees, so where no autocast is enabled (one call to torch) the device types
    that call covers are not asked one by one.
    """
    grad = torch.is_grad_enabled() if grad_enabled is None else bool(grad_enabled)
    if _any_autocast_enabled is not None and not _any_autocast_enabled():
        autocast = _DISABLED
        if any(map(torch.is_autocast_enabled, _UNCOVERED_TYPES)):  # (one C-level pass: none, as a rule)
            for index, device in _UNCOVERED:
                if torch.is_autocast_enabled(device):
                    autocast = (*autocast[:index], _autocast_of(device), *autocast[index + 1:])
    else:
        autocast = tuple(_autocast_of(d) for d in AUTOCAST_DEVICE_TYPES)
    default_dtype = torch.get_default_dtype()
    if autocast is not _DISABLED:
        return ComputeContext(grad, autocast, default_dtype)
    # the usual context is one of a few values: one object each (a record keeps its context as
    # long as the watch() block lasts), by grad mode, then default dtype
    plain = _PLAIN[grad]
    context = plain.get(default_dtype)
    if context is None:
        context = plain[default_dtype] = ComputeContext(grad, autocast, default_dtype)
    return context


def _autocast_of(device_type: str) -> tuple[str, bool, torch.dtype | None]:
    enabled = torch.is_autocast_enabled(device_type)
    return device_type, enabled, torch.get_autocast_dtype(device_type) if enabled else None


#: ``torch._C._is_any_autocast_enabled``: true when any of the device types in
#: :data:`ANY_AUTOCAST_COVERS` has autocast on (tests/runtime/test_context.py holds it to that)
_any_autocast_enabled = getattr(torch._C, "_is_any_autocast_enabled", None)
ANY_AUTOCAST_COVERS = frozenset({"cpu", "cuda", "xpu", "hpu"})
#: the device types read one by one even where no autocast is enabled (torch 2.13 leaves mps out)
_UNCOVERED = tuple((i, d) for i, d in enumerate(AUTOCAST_DEVICE_TYPES) if d not in ANY_AUTOCAST_COVERS)
_UNCOVERED_TYPES = tuple(d for _, d in _UNCOVERED)
_DISABLED: tuple[tuple[str, bool, torch.dtype | None], ...] = tuple((d, False, None) for d in AUTOCAST_DEVICE_TYPES)
#: the contexts without autocast, by grad mode, then default dtype (immutable, so shared)
_PLAIN: dict[bool, dict[torch.dtype, ComputeContext]] = {True: {}, False: {}}


def context_differences(forward: ComputeContext, recompute: ComputeContext, *,
                        compare_grad: bool = True) -> list[tuple[str, str, str]]:
    """``(subject, message, detail)`` for each part of the context that differs at recompute.

    ``compare_grad=False`` leaves grad mode out: where the forward's grad mode is not
    known (a hand-written ``autograd.Function`` seen from inside), it cannot be compared.
    """
    if forward is recompute or (forward.autocast == recompute.autocast  # the usual case: nothing to word
                                and forward.default_dtype == recompute.default_dtype
                                and (not compare_grad or forward.grad_enabled == recompute.grad_enabled)):
        return []
    found: list[tuple[str, str, str]] = []
    if compare_grad and forward.grad_enabled != recompute.grad_enabled:
        def mode(on: bool) -> str:
            return "on" if on else "off"
        found.append((GRAD_MODE_SUBJECT,
                      f"grad mode was {mode(forward.grad_enabled)} at forward and "
                      f"{mode(recompute.grad_enabled)} at recompute",
                      "the recomputation runs under another torch.is_grad_enabled() than its forward"))
    devices = dict.fromkeys([d for d, _, _ in forward.autocast] + [d for d, _, _ in recompute.autocast])
    for device in devices:
        if forward.autocast_of(device) != recompute.autocast_of(device):
            subject = autocast_subject(device)
            found.append((subject,
                          f"{subject} was {forward.describe_autocast(device)} at forward and "
                          f"{recompute.describe_autocast(device)} at recompute",
                          "the recomputation computes in another precision than its forward: stash "
                          f"torch.is_autocast_enabled({device!r}) and torch.get_autocast_dtype({device!r}) "
                          "in the forward and re-enter torch.autocast with both around the recomputation"))
    if forward.default_dtype != recompute.default_dtype:
        found.append((DEFAULT_DTYPE_SUBJECT,
                      f"default dtype was {_dtype_name(forward.default_dtype)} at forward and "
                      f"{_dtype_name(recompute.default_dtype)} at recompute",
                      "no checkpoint restores torch.get_default_dtype(); tensors the region creates "
                      "without a dtype come out in another dtype"))
    return found
