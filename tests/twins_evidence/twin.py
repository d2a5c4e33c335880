"""Hand-made twins: run a step as written and with its checkpoints bypassed, compare bit for bit.

Evidence for issue 12 (``recheck.check_step``), not part of recheck and not collected by pytest.
Each run builds a fresh model from the fixture's ``make_step`` factory and seeds every RNG the
same way, so two runs differ only in what the checkpoint does.  A *bypass* replaces the
checkpoint implementation by a direct call of the region, under the caller's grad mode, with
nothing else changed.
"""

from __future__ import annotations

import contextlib
import importlib.util
import random
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
import torch.utils.checkpoint as torch_checkpoint

ROOT = Path(__file__).resolve().parents[2]


def load_fixture(name: str):
    """Import ``fixtures/twins/<name>.py`` (its folder on ``sys.path`` while it imports)."""
    path = ROOT / "fixtures" / "twins" / f"{name}.py"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(path.parent))
    return module


# --- bypasses ------------------------------------------------------------------------------

@contextlib.contextmanager
def patched(owner: Any, name: str, value: Any) -> Iterator[None]:
    """``owner.name = value`` for the block; an attribute a class only inherited is deleted after."""
    missing = object()
    original = vars(owner).get(name, missing)
    setattr(owner, name, value)
    try:
        yield
    finally:
        if original is missing:
            delattr(owner, name)
        else:
            setattr(owner, name, original)


def _direct_generator(*_args: Any, **_kwargs: Any) -> Iterator[None]:
    yield  # checkpoint() calls function(*args, **kwargs) itself between the two next() calls


# The generator checkpoint() drives for use_reentrant=False: renamed in torch 2.14
# (``_checkpoint_impl`` calls ``_checkpoint_without_reentrant_generator_impl``; the old name
# is still defined, as a wrapper nothing in checkpoint() calls).  Both are patched.
_GENERATOR_NAMES = ("_checkpoint_without_reentrant_generator_impl", "_checkpoint_without_reentrant_generator")


class BypassNotTaken(RuntimeError):
    """A bypass was entered but no checkpoint call went through it: the patch point is stale."""


@contextlib.contextmanager
def bypass_torch_checkpoint() -> Iterator[list]:
    """Every torch.utils.checkpoint.checkpoint call runs its function directly.

    Patched below ``checkpoint()`` itself, so aliases, ``from ... import checkpoint`` names
    and stored ``functools.partial(checkpoint, ...)`` objects are all covered:
    reentrant calls go through ``CheckpointFunction.apply(function, preserve, *args)``,
    non-reentrant calls through the generator, which yields once before ``checkpoint()``
    runs ``function(*args, **kwargs)`` and once after.  Yields the list of calls taken; a
    step that made none raises ``BypassNotTaken`` (a silent no-op bypass would compare a
    checkpointed step with itself).
    """
    calls: list[str] = []

    def direct(function, _preserve, *args):
        calls.append("reentrant")
        return function(*args)

    def generator(*args, **kwargs):
        calls.append("non-reentrant")
        return _direct_generator(*args, **kwargs)

    with contextlib.ExitStack() as stack:
        stack.enter_context(patched(torch_checkpoint.CheckpointFunction, "apply", staticmethod(direct)))
        for name in _GENERATOR_NAMES:
            if hasattr(torch_checkpoint, name):
                stack.enter_context(patched(torch_checkpoint, name, generator))
        yield calls
    if not calls:
        raise BypassNotTaken("no torch checkpoint call went through the bypass")


def bypass_apply(function_class: type, call: Callable[..., Any]) -> contextlib.AbstractContextManager:
    """``function_class.apply(...)`` becomes ``call(...)`` (a direct call of the region)."""
    return patched(function_class, "apply", staticmethod(call))


# --- end states ----------------------------------------------------------------------------

def seed_all(seed: int = 1234) -> None:
    torch.manual_seed(seed)
    random.seed(seed)
    try:
        import numpy
        numpy.random.seed(seed)
    except ImportError:
        pass


def end_state(build: Callable[[], tuple], bypass: contextlib.AbstractContextManager | None = None,
              extra: Callable[[Any], dict[str, Any]] | None = None, seed: int = 1234) -> dict[str, Any]:
    """Build a fresh (step, model), run the step once (bypassed if given), collect its end state."""
    step, model = build()[:2]
    seed_all(seed)
    with bypass if bypass is not None else contextlib.nullcontext():
        returned = step()
    state: dict[str, Any] = {"return": returned}
    for name, p in model.named_parameters():
        state[f"grad {name}"] = None if p.grad is None else p.grad.detach().clone()
        state[f"param {name}"] = p.detach().clone()
    for name, b in model.named_buffers():
        state[f"buffer {name}"] = b.detach().clone()
    state["rng torch.cpu"] = torch.get_rng_state()
    if extra is not None:
        state.update(extra(model))
    return state


def _bits(t: torch.Tensor) -> torch.Tensor:
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    if t.dtype == torch.bool:
        return t.to(torch.uint8)
    return t.contiguous().view(ints[t.element_size()])


def ulp_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Units in the last place between float tensors of one dtype (sign-magnitude ordered)."""
    ia, ib = _bits(a).to(torch.int64), _bits(b).to(torch.int64)
    width = a.element_size() * 8
    top = 1 << (width - 1)
    ia = torch.where(ia < 0, -(ia + top) if width < 64 else -(ia & (top - 1)), ia)
    ib = torch.where(ib < 0, -(ib + top) if width < 64 else -(ib & (top - 1)), ib)
    return (ia - ib).abs()


def describe(name: str, a: Any, b: Any) -> str | None:
    """One line saying how ``a`` (as written) and ``b`` (bypassed) differ, or None if bit-equal."""
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if a.dtype != b.dtype or a.shape != b.shape:
            return f"{name}: {a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)}"
        if a.requires_grad != b.requires_grad:
            return (f"{name}: equal={torch.equal(a.detach(), b.detach())}, requires_grad "
                    f"{a.requires_grad} as written vs {b.requires_grad} bypassed")
        differ = _bits(a) != _bits(b)
        count = int(differ.sum())
        if count == 0:
            return None
        line = f"{name}: {count} of {a.numel()} elements differ"
        if a.is_floating_point():
            diff = (a.double() - b.double()).abs()
            scale = b.double().abs().max().item()
            line += f", max abs diff {diff.max().item():.3g}"
            if scale:
                line += f" ({100 * diff.max().item() / scale:.3g}% of max |bypassed|)"
            line += f", max {int(ulp_distance(a, b).max())} ulp"
        return line
    if a is None and b is None:
        return None
    if a is None or b is None:
        return f"{name}: {'None' if a is None else 'tensor'} as written vs {'None' if b is None else 'tensor'} bypassed"
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b):
        lines = [describe(f"{name}[{i}]", x, y) for i, (x, y) in enumerate(zip(a, b))]
        lines = [line for line in lines if line]
        return "; ".join(lines) or None
    if isinstance(a, dict) and isinstance(b, dict) and a.keys() == b.keys():
        lines = [describe(f"{name}[{k!r}]", a[k], b[k]) for k in a]
        lines = [line for line in lines if line]
        return "; ".join(lines) or None
    return None if a == b else f"{name}: {a!r} vs {b!r}"


def compare(written: dict[str, Any], bypassed: dict[str, Any]) -> list[str]:
    lines = []
    for key in sorted(written.keys() | bypassed.keys()):
        if key not in written or key not in bypassed:
            lines.append(f"{key}: only {'bypassed' if key in bypassed else 'as written'}")
            continue
        line = describe(key, written[key], bypassed[key])
        if line:
            lines.append(line)
    return lines


def watch_report(build: Callable[[], tuple], seed: int = 1234) -> Any:
    """A fresh (step, model) run once under ``recheck.watch(raise_on_finding=False)``."""
    import recheck

    step = build()[0]
    seed_all(seed)
    with recheck.watch(raise_on_finding=False) as w:
        step()
    return w.report


def show(title: str, build: Callable[[], tuple], bypass_factory: Callable[[], Any],
         extra: Callable[[Any], dict[str, Any]] | None = None, watch: bool = True) -> None:
    """Print the twin differences and the watch() report of one fixture step."""
    print(f"== {title}")
    written = end_state(build, None, extra)
    bypassed = end_state(build, bypass_factory(), extra)
    lines = compare(written, bypassed)
    print(f"  twin: {len(lines)} differing entries" + (":" if lines else " (bit-identical)"))
    for line in lines:
        print("    " + line)
    if watch:
        report = watch_report(build)
        findings = list(getattr(report, "findings", []))
        counts: dict[str, int] = {}
        for f in findings:
            key = f"{f.kind}: {f.message}"
            counts[key] = counts.get(key, 0) + 1
        summary = str(report).splitlines()
        stats = next((line.strip() for line in summary if line.strip().startswith("watch:")), "")
        print(f"  watch(): {len(findings)} finding(s); {stats}")
        for key, n in counts.items():
            print(f"    {n} x {key}")
        for line in summary:
            if line.strip().startswith("note") or "not observed" in line:
                print("    " + line.strip())
