"""A step's peak memory and time as a function of the plan, built from the census runs.

For every window *w* of the step (:mod:`~recheck.cost.planner.attribution`), in any plan::

    memory(w) = fixed(w) + bytes(referenced(w) ∪ ⋃_d holds(w, d, variant of d)) + rise(w, variant of w's owner)

* ``fixed(w)``: what is alive when *w* opens and is no activation the forward made:
  parameters, gradients, optimizer state, the gradients flowing in backward; measured in the
  run that checkpoints nothing (the same in every plan).
* ``referenced(w)``: activations alive at *w* without any candidate holding them for backward
  in some run (held by code outside every candidate, or referenced by the step's variables):
  alive in every plan.
* ``holds(w, d, v)``: the storages candidate *d* holds at *w* when it runs as *v*: saved by
  its operators (none), kept as its checkpoint's inputs (full), kept by its selective policy
  (selective), measured in the run of that mode.  The union counts a storage once however
  many candidates hold it: a block's output that the next block saves as its input, or keeps
  as its checkpoint's input, is one storage.
* ``rise(w, v)``: the most bytes the window's own operators add above its opening (a unit's
  forward saving as it goes, its recompute rebuilding, its backward's gradients), measured
  in the run of the owner's variant.

The peak of a plan is the largest window.  Step time is the time of the run that checkpoints
nothing plus each checkpointed candidate's recompute time, measured in the run of its mode and
scaled up so that a mode's candidates together cost what the mode was measured to cost beyond
the run without checkpoints (never less than their recomputes).  The same terms make the linear
program :class:`Problem` the solver minimises.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from recheck.cost.planner.attribution import OUTSIDE, Name
from recheck.cost.planner.candidates import Candidate, Candidates
from recheck.cost.planner.census import RunFigures

__all__ = ["MODE_OF", "Model", "Prediction", "Problem", "Row", "mode_of"]

#: Which census run measures a candidate kind's variant.
MODE_OF = {
    "unit": {"none": "none", "full": "full", "selective": "selective", "inside": "written"},
    "region": {"none": "none", "full": "full"},
    "outer": {"none": "none", "full": "written"},
}


def mode_of(candidate: Candidate, variant: str) -> str:
    """The census mode that measures ``candidate`` run as ``variant``."""
    return MODE_OF[candidate.kind][variant]


@dataclass
class Row:
    """One window's memory: ``constant + Σ coefficient·x[c][v] + Σ coefficient·z[g]`` (bytes)."""

    window: tuple[str, int, int]
    constant: int
    terms: dict[tuple[int, int], int] = field(default_factory=dict)
    groups: dict[int, int] = field(default_factory=dict)


@dataclass
class Problem:
    """Choose one variant per candidate, minimising time, each row at most the budget.

    ``groups[g]`` is a storage held by several candidates: ``z[g] = max over its candidates d
    of Σ x[d][v] for the (d, v) in it``.  ``tied`` pairs must take the same value (a unit is
    *inside* exactly when its outer region is kept).
    """

    variants: list[tuple[str, ...]]
    seconds: list[list[float]]
    rows: list[Row]
    groups: list[tuple[tuple[int, int], ...]]
    tied: list[tuple[tuple[int, int], tuple[int, int]]]

    def memory(self, choice: list[int]) -> list[int]:
        """Every row's bytes for ``choice`` (one variant index per candidate)."""
        z = [1 if any(choice[c] == v for c, v in group) else 0 for group in self.groups]
        return [row.constant + sum(k for (c, v), k in row.terms.items() if choice[c] == v)
                + sum(k for g, k in row.groups.items() if z[g]) for row in self.rows]

    def time(self, choice: list[int]) -> float:
        return sum(self.seconds[c][v] for c, v in enumerate(choice))

    def consistent(self, choice: list[int]) -> bool:
        return all((choice[a] == va) == (choice[b] == vb) for (a, va), (b, vb) in self.tied)


@dataclass
class Prediction:
    """What the model says of one plan."""

    peak: int
    seconds: float
    window: tuple[str, int, int]


class Model:
    """The memory and time terms of one step (see the module docstring)."""

    def __init__(self, candidates: Candidates, runs: Mapping[str, RunFigures]) -> None:
        self.candidates = candidates
        self.runs = dict(runs)
        self.notes: list[str] = []
        none = self.runs["none"]
        self.sizes: dict[Name, int] = dict(none.sizes)
        for mode, run in self.runs.items():
            differ = [n for n, size in run.sizes.items() if n in self.sizes and self.sizes[n] != size]
            if differ:
                self.notes.append(f"the {mode} run's forward made {len(differ)} storage(s) of another size than "
                                  "the run without checkpoints: storages are matched by the order the forward "
                                  "makes them, so sharing between candidates may be counted twice there")
            for name, size in run.sizes.items():
                self.sizes.setdefault(name, size)
        # the windows of the run without checkpoints, then any only another run has (an outer
        # region's recompute, whose operators run nowhere else)
        self.windows = list(none.order)
        for run in self.runs.values():
            self.windows += [k for k in run.order if k not in none.windows and k not in self.windows]
        self.base_seconds = none.median_seconds
        self.seconds = self._seconds()

    # -- time --------------------------------------------------------------------------------
    def _seconds(self) -> dict[tuple[int, str], float]:
        base = self.base_seconds
        scales: dict[str, float] = {}
        for mode, run in self.runs.items():
            measured = sum(run.recompute_seconds.values())
            extra = run.median_seconds - base
            # a recompute is extra work, so a mode costs at least its recomputes; what it costs
            # beyond them (torch's checkpoint code, the selective policy's caching in forward) is
            # shared out in proportion to each candidate's recompute
            scales[mode] = max(1.0, extra / measured) if measured > 0 else 1.0
        seconds = {}
        for c in self.candidates.items:
            for variant in c.variants:
                mode = mode_of(c, variant)
                figures = self.runs.get(mode)
                if variant == "none" or figures is None:
                    seconds[(c.index, variant)] = 0.0
                else:
                    seconds[(c.index, variant)] = figures.recompute_seconds.get(c.index, 0.0) * scales[mode]
        return seconds

    # -- memory --------------------------------------------------------------------------------
    def _window(self, mode: str, key: tuple[str, int, int]):  # noqa: ANN202 - a Window or None
        run = self.runs.get(mode)
        return None if run is None else run.windows.get(key)

    def _terms(self, key: tuple[str, int, int]):  # noqa: ANN202 - the row's parts, see rows()
        none = self._base(key)
        referenced: set[Name] = set()
        for run in self.runs.values():
            window = run.windows.get(key)
            if window is not None:
                held = {name for owner, name in window.holds if owner != OUTSIDE}
                referenced |= set(window.alive) - held
        fixed = none.opened - sum(self.sizes.get(n, 0) for n in none.alive)
        holders: dict[Name, set[tuple[int, str]]] = {}
        for c in self.candidates.items:
            for variant in c.variants:
                window = self._window(mode_of(c, variant), key)
                if window is None:
                    continue
                for owner, name in window.holds:
                    if owner == c.index and name not in referenced:
                        holders.setdefault(name, set()).add((c.index, variant))
        return fixed, referenced, holders

    def _rise(self, key: tuple[str, int, int], c: Candidate | None, variant: str) -> int:
        if c is None:  # code outside every candidate: the same in every plan
            return self._base(key).rise
        window = self._window(mode_of(c, variant), key)
        if window is None:  # a window this variant's run does not have: none's, or no rise at all
            window = self.runs["none"].windows.get(key)
        return window.rise if window is not None else 0

    def _base(self, key: tuple[str, int, int]):  # noqa: ANN202 - the Window fixed(w) is measured in
        """The window in the run without checkpoints, else in the first run that has it."""
        window = self.runs["none"].windows.get(key)
        if window is None:
            window = next(run.windows[key] for run in self.runs.values() if key in run.windows)
        return window

    def problem(self) -> Problem:
        """The linear program over every candidate's variants (the budget is the solver's)."""
        items = self.candidates.items
        variants = [c.variants for c in items]
        index = {(c.index, v): i for c in items for i, v in enumerate(c.variants)}
        seconds = [[self.seconds[(c.index, v)] for v in c.variants] for c in items]
        groups: dict[frozenset[tuple[int, int]], int] = {}
        rows = []
        for key in self.windows:
            fixed, referenced, holders = self._terms(key)
            row = Row(key, fixed + sum(self.sizes.get(n, 0) for n in referenced))
            for name, held_by in holders.items():
                pairs = frozenset((c, index[(c, v)]) for c, v in held_by)
                size = self.sizes.get(name, 0)
                if len({c for c, _ in pairs}) == 1:
                    for pair in pairs:
                        row.terms[pair] = row.terms.get(pair, 0) + size
                else:
                    g = groups.setdefault(pairs, len(groups))
                    row.groups[g] = row.groups.get(g, 0) + size
            owner = items[key[1]] if key[1] >= 0 else None
            if owner is None:
                row.constant += self._rise(key, None, "none")
            else:
                for v, variant in enumerate(owner.variants):
                    rise = self._rise(key, owner, variant)
                    row.terms[(owner.index, v)] = row.terms.get((owner.index, v), 0) + rise
            rows.append(row)
        tied = [((u.index, index[(u.index, "inside")]), (u.outer.index, index[(u.outer.index, "full")]))
                for u in items if u.outer is not None]
        ordered_groups = [tuple(sorted(g)) for g, _ in sorted(groups.items(), key=lambda item: item[1])]
        return Problem(variants, seconds, rows, ordered_groups, tied)

    # -- one plan --------------------------------------------------------------------------------
    def predict(self, variants: Mapping[int, str], problem: Problem | None = None) -> Prediction:
        """Peak, time and the window of the peak for ``{candidate index: variant}`` (others none)."""
        problem = problem or self.problem()
        choice = [c.variants.index(variants.get(c.index, "none")) for c in self.candidates.items]
        memory = problem.memory(choice)
        at = max(range(len(memory)), key=memory.__getitem__)
        return Prediction(memory[at], self.base_seconds + problem.time(choice), problem.rows[at].window)
