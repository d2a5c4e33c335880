"""Observed memory of a planning run by stage window: what each stage's forward and backward add.

A :class:`StageWindows` listens to the ledger of ``recheck cost --plan``'s one-process run and
cuts it into *windows*, the operators of one stage in one phase: in forward, those inside
``recheck.tag(stage=s)`` (operators outside every tag belong to the stage tagged last); in
backward, those of an autograd node made in stage ``s``'s forward (nodes are labelled when the
module that made them returns) or of a recompute of a region checkpointed there (a node made
outside every stage takes the stage of the operator before it); ``optimizer.step`` is one window.

Per window it keeps the *rise*: the most bytes alive during it above those alive when it opened.
A real pipeline's later backwards add to a ``.grad`` that exists already, where the planning run
allocates it, so the backward rise is also kept *with the gradients present*.  A forward window
also tells ``kept`` (bytes it created, still allocated at its close and not held by autograd:
what a schedule keeps per microbatch) and ``data`` (bytes made before the first stage that it
reads).  Needs torch 2.1's ``_current_autograd_node`` and ``Node.metadata`` (:func:`supported`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._pytree import tree_leaves

from recheck.cost.ledger import storage_key
from recheck.cost.trace import label_graph, running_label, tensor_storage
from recheck.runtime.tags import current_tags

__all__ = ["StageWindows", "WindowFigures", "supported"]

_NODE_KEY = "recheck_stage"
_BEFORE_STAGES = -1


def supported() -> bool:
    """Whether this torch can name the autograd node running an operator."""
    return hasattr(torch._C, "_current_autograd_node") and hasattr(torch.autograd.graph.Node, "metadata")


@dataclass
class WindowFigures:
    """One stage's windows in one planning run (bytes)."""

    forward_rise: int = 0
    backward_rise: int = 0
    backward_rise_with_gradients: int = 0
    gradients_absent: int = 0
    kept: int = 0
    data: int = 0


@dataclass
class _Window:
    phase: str
    stage: int | None
    opened_at: int
    absent_at_open: int
    peak: int
    peak_with_gradients: int
    created: list[tuple[int, Any]] = field(default_factory=list)


class StageWindows:
    """A ledger listener cutting a planning run into stage windows (see the module docstring).

    ``parameters_of(stage)`` lists the stage's parameters (read during backward, once every
    stage's forward has run).  Use :meth:`install` / :meth:`remove` around the run for the
    node labels, :meth:`attach` before entering the tracer, :meth:`finish` after it.
    """

    def __init__(self, parameters_of: Callable[[int], list[torch.Tensor]]) -> None:
        self.parameters_of = parameters_of
        self.tracer: Any = None
        self.ledger: Any = None
        self.window: _Window | None = None
        self.figures: dict[int, WindowFigures] = {}
        self.optimizer_rise = 0
        self.created_in: dict[int, int | None] = {}
        self.data_keys: dict[int, dict[int, int]] = {}
        self.last_stage: int | None = None
        self.last_backward_stage: int | None = None
        self._hook: Any = None

    # -- setup ----------------------------------------------------------------------------
    def install(self) -> None:
        """Label every autograd node a stage's modules make with the stage."""
        self._hook = torch.nn.modules.module.register_module_forward_hook(self._label_nodes)

    def remove(self) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None

    def attach(self, tracer: Any) -> None:
        """Listen to ``tracer``'s ledger (after the listeners already there)."""
        self.tracer, self.ledger = tracer, tracer.trace.ledger
        self.ledger.listeners.append(self)

    def finish(self) -> None:
        """Close the last window (call after the tracer has exited)."""
        self._close()

    @staticmethod
    def _label_nodes(_module: Any, _args: Any, output: Any) -> None:
        stage = current_tags().get("stage")
        if isinstance(stage, int) and torch._C._current_graph_task_id() == -1:
            label_graph(output, _NODE_KEY, stage)

    # -- where an operator belongs -----------------------------------------------------------
    def _where(self) -> tuple[str, int | None]:
        phase = self.tracer.phase()
        if phase == "forward":
            stage = current_tags().get("stage")
            if isinstance(stage, int):
                self.last_stage = stage
                return phase, stage
            return phase, self.last_stage if self.last_stage is not None else _BEFORE_STAGES
        if phase == "backward":
            stage = running_label(_NODE_KEY)
            if not isinstance(stage, int):  # a recompute carries the labels of its forward
                calls = self.tracer.router.calls()
                stage = calls[-1].labels.get("stage") if calls and calls[-1].recompute else None
            if not isinstance(stage, int):
                stage = self.last_backward_stage if self.last_backward_stage is not None else self.last_stage
            self.last_backward_stage = stage
            return phase, stage
        return phase, None

    def _absent_gradients(self, stage: int | None) -> int:
        if stage is None or stage < 0:
            return 0
        return sum(p.numel() * p.element_size() for p in self.parameters_of(stage) if p.requires_grad and p.grad is None)

    # -- the ledger's events ----------------------------------------------------------------
    def created(self, key: int) -> None:
        entry = self.ledger.entries[key]
        grew = entry.nbytes if entry.observed else 0
        phase, stage = self._sample(self.ledger.observed_total - grew)
        self.created_in[key] = stage if phase == "forward" and entry.base == "temporary" else None
        if entry.observed and self.window is not None:
            self.window.created.append((key, entry))

    def held(self, key: int, entry: Any, first: bool) -> None:
        # a storage held first by the operator that opens a window (the next stage saving
        # this stage's output) is still what the closing window kept
        self._sample(self.ledger.observed_total, entry if first else None)

    def read(self, args: Any, kwargs: Any) -> None:
        """An operator read ``args``: note data made before the first stage that a stage reads."""
        if self.tracer.phase() != "forward":
            return
        _, stage = self._where()
        if stage is None or stage < 0:
            return
        for leaf in tree_leaves((args, kwargs)):
            storage = tensor_storage(leaf)
            if storage is None:
                continue
            key = storage_key(storage)
            if self.created_in.get(key, 0) == _BEFORE_STAGES:
                self.data_keys.setdefault(stage, {})[key] = self.ledger.nbytes(key)

    # -- windows ------------------------------------------------------------------------------
    def _sample(self, total_before: int, just_held: Any = None) -> tuple[str, int | None]:
        phase, stage = self._where()
        window = self.window
        if window is None or (window.phase, window.stage) != (phase, stage):
            self._close(just_held)
            absent = self._absent_gradients(stage) if phase == "backward" else 0
            window = self.window = _Window(phase, stage, total_before, absent, total_before, total_before + absent)
        total = self.ledger.observed_total
        window.peak = max(window.peak, total)
        if phase == "backward":
            window.peak_with_gradients = max(window.peak_with_gradients, total + self._absent_gradients(stage))
        return phase, stage

    def _close(self, just_held: Any = None) -> None:
        window, self.window = self.window, None
        if window is None:
            return
        rise = window.peak - window.opened_at
        if window.phase == "optimizer":
            self.optimizer_rise = max(self.optimizer_rise, rise)
            return
        if window.stage is None or window.stage < 0:
            return
        figures = self.figures.setdefault(window.stage, WindowFigures())
        if window.phase == "forward":
            figures.forward_rise = max(figures.forward_rise, rise)
            entries = self.ledger.entries
            kept = {key: entry for key, entry in window.created
                    if entries.get(key) is entry and entry.ref() is not None
                    and (not entry.holders or entry is just_held)}
            figures.kept += sum(entry.nbytes for entry in kept.values())
            figures.data = sum(self.data_keys.get(window.stage, {}).values())
        else:
            figures.backward_rise = max(figures.backward_rise, rise)
            with_gradients = window.peak_with_gradients - window.opened_at - window.absent_at_open
            figures.backward_rise_with_gradients = max(figures.backward_rise_with_gradients, with_gradients)
            figures.gradients_absent = max(figures.gradients_absent, window.absent_at_open)

    def stage_figures(self, stage: int) -> WindowFigures:
        """The windows of ``stage`` (zeros when it ran none)."""
        return self.figures.get(stage, WindowFigures())

