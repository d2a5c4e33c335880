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

A wider context explains a recompute that fails (torch's ``CheckpointError``: the saved
tensors' metadata differ) where none of those three differs: :func:`wider_context` reads, at
forward and at recompute, the torch-function and dispatch mode stacks, the forward and
forward-pre hooks in force (global, and on the region's modules), the inference mode, the
deterministic-algorithms and float32 matmul precision flags, torch.compile's stance (and the TF32, cuDNN and
SDPA-backend flags where torch is built with CUDA); :func:`wider_differences` words what
differs, in that order.
"""

from __future__ import annotations

import operator
import sys
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import torch
# the global hook dictionaries (``register_module_forward_hook`` adds to them in place)
from torch.nn.modules.module import _global_forward_hooks as _global_hooks
from torch.nn.modules.module import _global_forward_pre_hooks as _global_pre_hooks

from recheck.runtime.naming import DEFAULT_DTYPE_SUBJECT, GRAD_MODE_SUBJECT, autocast_subject

__all__ = ["ANY_AUTOCAST_COVERS", "AUTOCAST_DEVICE_TYPES", "ComputeContext", "context_differences", "current_context",
           "wider_context", "wider_differences"]


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
    #: whether autocast's weight cache is on (read where an autocast is enabled: else it serves nothing)
    autocast_cache: bool = False

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
        return ComputeContext(grad, autocast, default_dtype, torch.is_autocast_cache_enabled())
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


# -- the wider context: what else decides what a region computes --------------------------------


def _c(name: str, public: Callable[[], Any]) -> Callable[[], Any]:
    """torch's own getter ``torch._C.<name>`` (one C call), or the public reader where it is gone."""
    getter = getattr(torch._C, name, None)
    return getter if callable(getter) else public


def _compile_stance() -> str:
    """``torch.compiler.set_stance``'s stance: "default" where Dynamo was never imported."""
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    return "default" if eval_frame is None else eval_frame._stance.stance


_MODE_WHY = ("a {0} entered around the forward is not in force when backward recomputes{1}: enter it inside "
             "the checkpointed function, or pass it through checkpoint's context_fn")
_POPPED = " (torch pops a torch-function mode while it handles a call, Tensor.backward included)"

#: ``(subject, getters, names of the values, why it matters)`` of each flag of the wider context, in
#: the order a cause is named; ``names``: a flag of several values is shown by the names of those on
_FLAGS: tuple[tuple[str, tuple[Callable[[], Any], ...], tuple[str, ...], str], ...] = (
    ("inference mode", (torch.is_inference_mode_enabled,), (),
     "tensors made under inference mode save nothing for backward"),
    ("deterministic algorithms", (_c("_get_deterministic_algorithms", torch.are_deterministic_algorithms_enabled),), (),
     "torch.use_deterministic_algorithms() picks other kernels"),
    ("float32 matmul precision", (_c("_get_float32_matmul_precision", torch.get_float32_matmul_precision),), (),
     "matmuls round otherwise"),
    ("torch.compile stance", (_compile_stance,), (),
     "compiled code saves other tensors for backward than the same code run eagerly: keep the forward's stance"),
)
#: the flags that only decide what runs on a CUDA device: read where torch is built with CUDA
_CUDA_FLAGS: tuple[tuple[str, tuple[Callable[[], Any], ...], tuple[str, ...], str], ...] = (
    ("TF32 matmul", (_c("_get_cublas_allow_tf32", lambda: torch.backends.cuda.matmul.allow_tf32),), (),
     "TF32 matmuls round otherwise"),
    ("cuDNN flags", (_c("_get_cudnn_enabled", lambda: torch.backends.cudnn.enabled),
                     _c("_get_cudnn_deterministic", lambda: torch.backends.cudnn.deterministic),
                     _c("_get_cudnn_benchmark", lambda: torch.backends.cudnn.benchmark),
                     _c("_get_cudnn_allow_tf32", lambda: torch.backends.cudnn.allow_tf32)),
     ("enabled", "deterministic", "benchmark", "allow_tf32"), "cuDNN picks other kernels"),
    ("SDPA backends", tuple(_c(f"_get_{name}_sdp_enabled", getattr(torch.backends.cuda, f"{name}_sdp_enabled"))
                            for name in ("flash", "mem_efficient", "math", "cudnn")),
     ("flash", "mem_efficient", "math", "cudnn"), "scaled_dot_product_attention picks another kernel"),
)
if torch.backends.cuda.is_built():  # (a build flag: no driver call at import)
    _FLAGS += _CUDA_FLAGS
#: every getter of :data:`_FLAGS`, in order, called in one pass
_GETTERS: tuple[Callable[[], Any], ...] = tuple(g for _, getters, _, _ in _FLAGS for g in getters)

_HOOKS_WHY = ("a hook in force for the forward and removed before backward does not run in the recompute (or one "
              "added since runs only there): register it for as long as the graph lives, or inside the region")


def _hook_name(hook: Any) -> str:
    function = getattr(hook, "__func__", hook)
    name = getattr(function, "__qualname__", None) or type(function).__qualname__
    return str(name)


def _mode_names(stack: list[Any]) -> tuple[str, ...]:
    # selective checkpointing enters modes of torch's checkpoint, one at forward and another at
    # recompute: they differ by design and are no cause
    return tuple([type(mode).__qualname__ for mode in stack
                  if not any(c.__module__ == "torch.utils.checkpoint" for c in type(mode).__mro__)])


def _modes() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The classes of the torch-function and dispatch modes in force, innermost last."""
    from torch.overrides import _get_current_function_mode_stack
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    return _mode_names(_get_current_function_mode_stack()), _mode_names(_get_current_dispatch_mode_stack())


_len_function_stack = getattr(torch._C, "_len_torch_function_stack", lambda: 1)
_len_dispatch_stack = getattr(torch._C, "_len_torch_dispatch_stack", lambda: 1)
_NO_MODES: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())


_MODULE = operator.itemgetter(1)
_FORWARD_HOOKS = operator.attrgetter("_forward_hooks")
_FORWARD_PRE_HOOKS = operator.attrgetter("_forward_pre_hooks")


def _hooks(modules: Iterable[tuple[str, torch.nn.Module]]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """``(where, hook names)`` for each hook dictionary with hooks: global, then each module's."""
    found = []
    if _global_hooks or _global_pre_hooks:
        for where, hooks in (("global forward hooks", _global_hooks), ("global forward-pre hooks", _global_pre_hooks)):
            if hooks:
                found.append((where, tuple(map(_hook_name, hooks.values()))))
    modules = tuple(modules)
    held = list(map(_MODULE, modules))
    if not any(map(_FORWARD_HOOKS, held)) and not any(map(_FORWARD_PRE_HOOKS, held)):  # (C-level: most have none)
        return tuple(found)
    for name, module in modules:
        if module._forward_hooks:
            found.append((f"forward hooks of `{name or type(module).__name__}`",
                          tuple(map(_hook_name, module._forward_hooks.values()))))
        if module._forward_pre_hooks:
            found.append((f"forward-pre hooks of `{name or type(module).__name__}`",
                          tuple(map(_hook_name, module._forward_pre_hooks.values()))))
    return tuple(found)


#: What :func:`wider_context` returns: the flags' values (:data:`_GETTERS` order), the torch-function
#: and dispatch modes, the hooks
WiderContext = tuple[tuple[Any, ...], tuple[tuple[str, ...], tuple[str, ...]], tuple[tuple[str, tuple[str, ...]], ...]]


def wider_context(modules: Iterable[tuple[str, torch.nn.Module]] = ()) -> WiderContext:
    """The wider context now (see the module docstring); ``modules``: the region's, named.

    Read at every forward and recompute ``watch()`` sees: one pass over a few getters of
    torch's, the mode stacks only where one is in force, a look at each module's hook
    dictionaries.  A flag this torch cannot read is None."""
    try:
        flags = tuple([getter() for getter in _GETTERS])
    except Exception:  # noqa: BLE001 - a flag this build cannot read: the others, one by one
        flags = tuple(map(_read, _GETTERS))
    modes = _modes() if _len_function_stack() or _len_dispatch_stack() else _NO_MODES
    return flags, modes, _hooks(modules)


def _read(getter: Callable[[], Any]) -> Any:
    try:
        return getter()
    except Exception:  # noqa: BLE001
        return None


def _shown(value: Any) -> str:
    if isinstance(value, tuple):
        return "[" + ", ".join(map(str, value)) + "]"
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def wider_differences(forward: WiderContext, recompute: WiderContext) -> list[tuple[str, str, str, str]]:
    """``(subject, at forward, at recompute, why it matters)`` for each part of the wider context
    that differs: the mode stacks, the hooks, then the flags of :data:`_FLAGS` (empty where all
    is alike)."""
    if forward == recompute:
        return []
    found = []
    for subject, then_modes, now_modes, why in (
            ("torch-function modes", forward[1][0], recompute[1][0], _MODE_WHY.format("TorchFunctionMode", _POPPED)),
            ("dispatch modes", forward[1][1], recompute[1][1], _MODE_WHY.format("TorchDispatchMode", ""))):
        if then_modes != now_modes:
            found.append((subject, _shown(then_modes), _shown(now_modes), why))
    hooks_then, hooks_now = dict(forward[2]), dict(recompute[2])
    for where in dict.fromkeys([*hooks_then, *hooks_now]):
        then, now = hooks_then.get(where, ()), hooks_now.get(where, ())
        if then != now:
            found.append((where, _shown(then), _shown(now), _HOOKS_WHY))
    at = 0
    for subject, getters, names, why in _FLAGS:
        values_then, values_now = forward[0][at:at + len(getters)], recompute[0][at:at + len(getters)]
        at += len(getters)
        if values_then == values_now or None in values_then or None in values_now:
            continue
        if names:
            found.append((subject, _shown(tuple(n for n, v in zip(names, values_then) if v)),
                          _shown(tuple(n for n, v in zip(names, values_now) if v)), why))
        else:
            found.append((subject, _shown(values_then[0]), _shown(values_now[0]), why))
    return found
