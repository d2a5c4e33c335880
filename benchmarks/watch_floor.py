"""How cheap ``watch()`` could be: the reads it makes per invocation, made the plainest way, against it.

``watch_ablation.py --parts all`` times the interception that is left when every read is free;
this goes the other way.  A watcher of a few dozen lines, for this benchmark only, makes the
reads ``watch()`` makes at every checkpoint invocation (torch's non-reentrant checkpoint),
each in its cheapest Python form, and nothing else:

* at the forward's start: the CPU generator's state (digested), the grad mode, autocast and
  default dtype, the version of every parameter of the region's modules;
* at the forward's end: the generator again, the modules' state (each module's ``__dict__``
  values, its buffers digested) and an XXH3-128 digest of every contiguous saved tensor;
* at the recompute's start: the generator, the context, the parameters' versions and the
  modules' state, each compared with the forward's, and stdout, stderr and warnings captured;
* each recomputed saved tensor digested and compared with its forward's (torch's
  ``determinism_check`` hook, as ``watch()`` uses it); at the recompute's end the state again.

Left out: naming the region and its call site, calls nested in other regions, replays, early
stop, the other entry points and implementations, inputs changed in place, logging, globals,
and findings (it counts differences only).  So the figure is a floor for a watcher that does
what ``watch()`` does, not a watcher: the difference between the two columns is what the
structure of ``watch()`` costs beyond its reads.

    python benchmarks/watch_floor.py [--models mlp,llama,resnet,vit] [--rounds 6] [--steps 5]

Process CPU time, interleaved rounds, best of each.  Nothing here is asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import io
import itertools
import sys
import time
import warnings
from typing import Any, Callable, Iterator

from timing import interleaved  # this folder's
from watch_overhead import MODELS, print_rows

CPU = time.process_time


def floor_watcher() -> Callable[[], contextlib.AbstractContextManager[list[int]]]:
    """A context manager factory: inside, every non-reentrant checkpoint invocation is watched
    the plain way; it yields a one-item list, the number of differences seen."""
    import torch
    import torch.utils.checkpoint as torch_checkpoint
    import xxhash

    hash128 = xxhash.xxh3_128_intdigest
    arrays: dict[tuple[Any, int], Any] = {}
    registry = torch_checkpoint._allowed_determinism_checks_to_fns
    # torch 2.14's checkpoint() calls the ``_impl`` generator, which takes the arguments as a
    # tuple and a dict; torch 2.13's the one without it, which takes them spread.
    name = "_checkpoint_without_reentrant_generator_impl"
    if not hasattr(torch_checkpoint, name):
        name = "_checkpoint_without_reentrant_generator"
    original = getattr(torch_checkpoint, name)
    keys = itertools.count()
    subtrees: dict[int, list[Any]] = {}
    differences = [0]

    def digest(tensor: Any) -> Any:
        if not tensor.is_contiguous() or not tensor.is_cpu or not tensor.numel():
            return (tuple(tensor.shape), tensor.dtype, None)
        size = tensor.numel() * tensor.element_size()
        array = arrays.get((tensor.dtype, size))
        if array is None:
            array = arrays[(tensor.dtype, size)] = ctypes.c_char * size
        return (tuple(tensor.shape), tensor.dtype, hash128(array.from_address(tensor.data_ptr())))

    def rng() -> int:
        state = torch.default_generator.get_state()
        return hash128((ctypes.c_char * state.numel()).from_address(state.data_ptr()))

    def context() -> tuple[Any, ...]:
        return torch.is_grad_enabled(), torch.is_autocast_enabled("cpu"), torch.get_default_dtype()

    def modules_of(function: Any) -> list[Any]:
        root = function if isinstance(function, torch.nn.Module) else getattr(function, "__self__", None)
        if not isinstance(root, torch.nn.Module):
            return []
        found = subtrees.get(id(root))
        if found is None:
            found = subtrees[id(root)] = list(root.modules())
        return found

    def state(modules: list[Any]) -> list[Any]:
        return [(tuple(module.__dict__.values()), [digest(b) for b in module._buffers.values() if b is not None])
                for module in modules]

    def versions(modules: list[Any]) -> list[int]:
        return [p._version for module in modules for p in module._parameters.values() if p is not None]

    class Saved:
        __slots__ = ("index", "tensor", "print", "forward")

        def __eq__(self, other: object) -> bool:
            if self.forward and isinstance(other, Saved) and not other.forward:
                if self.print is not None and digest(other.tensor) != self.print:
                    differences[0] += 1
            return True

    class Invocation:
        def __init__(self, function: Any) -> None:
            self.function, self.modules, self.saved, self.done = function, modules_of(function), [], False
            self.key = f"floor-{next(keys)}"

        def metadata(self, tensor: Any) -> Saved:
            saved = Saved()
            saved.tensor, saved.print, saved.forward = tensor, None, not self.done
            if not self.done:
                saved.index = len(self.saved)
                self.saved.append(saved)
            return saved

        def begin_forward(self) -> None:
            self.rng, self.context, self.versions = rng(), context(), versions(self.modules)

        def end_forward(self) -> None:
            self.rng_after = rng()
            self.state = state(self.modules)
            for saved in self.saved:
                tensor, saved.tensor = saved.tensor, None
                saved.print = None if isinstance(tensor, torch.nn.Parameter) else digest(tensor)
            self.done = True

        def recompute(self, *args: Any, **kwargs: Any) -> Any:
            compared = (rng() == self.rng, context() == self.context, versions(self.modules) == self.versions)
            before = state(self.modules)
            differences[0] += compared.count(False) + (before != self.state)
            out, err = sys.stdout, sys.stderr
            sys.stdout, sys.stderr = io.StringIO(), io.StringIO()
            try:
                with warnings.catch_warnings(record=True):
                    warnings.simplefilter("always")
                    return self.function(*args, **kwargs)
            finally:
                sys.stdout, sys.stderr = out, err
                differences[0] += state(self.modules) != before

    def around(invocation: Invocation, inner: Iterator[None]) -> Iterator[None]:
        try:
            next(inner)
        finally:
            del registry[invocation.key]  # torch's frame keeps the function it looked up
        invocation.begin_forward()
        yield  # torch's checkpoint runs the forward here
        invocation.end_forward()
        next(inner, None)

    def generator(fn: Any, preserve_rng_state: bool = True, context_fn: Any = torch_checkpoint.noop_context_fn,
                  determinism_check: str = "default", debug: bool = False, early_stop: bool = True,
                  *args: Any, **kwargs: Any) -> Iterator[None]:
        """torch 2.13's ``_checkpoint_without_reentrant_generator``."""
        invocation = Invocation(fn)
        registry[invocation.key] = invocation.metadata
        return around(invocation, original(invocation.recompute, preserve_rng_state, context_fn, invocation.key,
                                           debug, early_stop, *args, **kwargs))

    def generator_impl(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any], *,
                       determinism_check: str = "default", **options: Any) -> Iterator[None]:
        """torch 2.14's ``_checkpoint_without_reentrant_generator_impl``."""
        invocation = Invocation(fn)
        registry[invocation.key] = invocation.metadata
        return around(invocation, original(invocation.recompute, args, kwargs, determinism_check=invocation.key,
                                           **options))

    @contextlib.contextmanager
    def watching() -> Iterator[list[int]]:
        setattr(torch_checkpoint, name, generator_impl if name.endswith("_impl") else generator)
        try:
            yield differences
        finally:
            setattr(torch_checkpoint, name, original)

    return watching


def ratios(step: Callable[[], Any], rounds: int, steps: int) -> dict[str, float]:
    """watch() and the floor against a plain step, from interleaved rounds."""
    import recheck

    floor = floor_watcher()

    def run(mode: str) -> float:
        context = recheck.watch(raise_on_finding=False) if mode == "watch" else floor() if mode == "floor" \
            else contextlib.nullcontext()
        start = CPU()
        with context:
            for _ in range(steps):
                step()
        return CPU() - start

    least = interleaved(run, ["plain", "watch", "floor"], rounds)
    return {mode: least[mode] / least["plain"] for mode in ("watch", "floor")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=5, help="steps in each timed block")
    ns = parser.parse_args(argv)
    if ns.rounds < 1 or ns.steps < 1:
        parser.error("--rounds and --steps must be at least 1")
    import torch

    torch.set_num_threads(1)
    print(f"against a plain step, best of {ns.rounds} interleaved rounds of {ns.steps} steps")
    print(f"{'model':8} {'watch':>6} {'floor':>6}")

    def row(step: Callable[[], Any]) -> str:
        found = ratios(step, ns.rounds, ns.steps)
        return f"{found['watch']:6.2f} {found['floor']:6.2f}"

    print_rows(ns.models, row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
