"""For each mechanism of issue 42 and each classic hazard: caught by ``check_step``, ``watch()``, or both.

Every row runs a fixture's hazard and its fixed variant under both faces: ``check_step(step)``
(what it reports: its kinds, or "step fails only when checkpointed" with the cause it names) and
one run of the step inside ``watch()`` (its findings, and the explanation it appends to an error
the step raises).  Hand-written ``autograd.Function`` rows are audited by ``check_step`` and by
``check_function`` too.  Rows of false patterns have a fixed variant that is the correct code a
face once reported, and a hazard variant that reads what changed and must stay a finding.

The table is printed as markdown.  Exit status 1 when a hazard is not caught by ``check_step``,
or not by ``watch()`` where the row says ``watch()`` can see it, or when a fixed variant is not
clean under both faces (or raises).

    python benchmarks/check_step_fixtures.py
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import io
import logging
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from torch.utils.checkpoint import checkpoint

ROOT = Path(__file__).resolve().parents[1]
TWINS = ROOT / "fixtures" / "twins"

Step = Callable[[], Any]


def load(path: Path, fresh: bool = True):
    """The module at ``path``, executed anew (fresh module-level state) unless ``fresh`` is off."""
    name = path.stem
    if not fresh and name in sys.modules:
        return sys.modules[name]
    sys.path[:0] = [str(path.parent)]
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)  # type: ignore[union-attr]
        return module
    finally:
        del sys.path[0]


def twin(name: str):
    return load(TWINS / f"{name}.py")


def made(name: str, **options) -> Callable[[], Step]:
    """A fresh step of a ``make_step`` fixture of ``fixtures/twins``."""
    return lambda: twin(name).make_step(**options)[0]


def attribute(name: str, attr: str) -> Callable[[], Step]:
    """A fresh step that is a module-level attribute of a ``fixtures/twins`` file."""
    return lambda: getattr(twin(name), attr)


def zoo_region(region: str, **options) -> Callable[[], Step]:
    """A step that checkpoints a region of ``fixtures/models/zoo.py`` and backpropagates its output."""
    def build() -> Step:
        fn, args, *kwargs = getattr(load(ROOT / "fixtures" / "models" / "zoo.py"), region)()

        def step() -> None:
            out = checkpoint(fn, *args, use_reentrant=False, **(kwargs[0] if kwargs else {}), **options)
            out.sum().backward()
        return step
    return build


def train_step(name: str) -> Callable[[], Step]:
    return lambda: getattr(load(ROOT / "fixtures" / "steps" / "train_steps.py", fresh=False), name)


def watch_model(build: Callable[[Any], Step]) -> Callable[[], Step]:
    """A step of the models in ``tests/watch/read_state.py`` (its helpers import each other)."""
    def make() -> Step:
        folder = ROOT / "tests" / "watch"
        sys.path[:0] = [str(folder)]
        try:
            return build(load(folder / "read_state.py", fresh=False))
        finally:
            del sys.path[0]
    return make


def gate(restore: bool):
    def build(rs) -> Step:
        torch.manual_seed(0)
        moe_gate = rs.MoEGate()
        return lambda: rs.gate_step(moe_gate, restore=restore)
    return watch_model(build)


def carrier(accumulate: bool):
    def build(rs) -> Step:
        torch.manual_seed(0)
        layer = rs.CarrierAttention(rs.KVCarrier(accumulate=accumulate))
        x = torch.randn(4, 8, requires_grad=True)

        def step() -> None:
            for _ in range(2):
                checkpoint(layer, x, use_reentrant=False).sum().backward()
        return step
    return watch_model(build)


def classification(reading: bool):
    def build(rs) -> Step:
        model, inputs, labels = sys.modules["classification_head"].build()  # read_state's own import
        if reading:
            for layer in model.model.layers:
                layer.__class__ = rs.ReadingLayer

        def step() -> None:
            model.config.problem_type = None  # a fresh head: the first loss decides it
            loss, _ = model(inputs, labels)
            loss.backward()
        return step
    return watch_model(build)


def lightning(reading: bool):
    def build(rs) -> Step:
        torch.manual_seed(0)
        model = rs.ReadingLitModel() if reading else rs.LitModel()
        return lambda: rs.lightning_step(model)
    return watch_model(build)


_LOG = logging.getLogger("recheck_bench")


def logged_after() -> Step:
    """The fix of the zoo's ``region_logging``: the same region, its log line after the checkpoint."""
    torch.manual_seed(20)
    x = torch.randn(3, 4, requires_grad=True)

    def step() -> None:
        out = checkpoint(lambda t: torch.tanh(t).square(), x, use_reentrant=False)
        _LOG.info("region input norm %.3f", float(x.detach().norm()))
        out.sum().backward()
    return step


def function_audit(name: str, fixed: bool) -> Callable[[], Step]:
    return lambda: getattr(twin("hand_functions"), name)(fixed)[0]


@dataclass
class Row:
    mechanism: str
    where: tuple[str, str]  # (file relative to the root, the name of what shows the mechanism there)
    hazard: Callable[[], Step] | None
    fixed: list[Callable[[], Step]]
    watch_sees: bool = True  # False: watch() cannot see it by design (the note says why)
    note: str = ""
    audit: tuple[str, Callable[[], tuple]] | None = None  # (Function class name, its arguments)


def _rms_args():
    generator = torch.Generator().manual_seed(1)
    return ((torch.randn(4, 8, generator=generator) * 3).requires_grad_(), torch.ones(8, requires_grad=True), 1e-6)


def _linear_args():
    generator = torch.Generator().manual_seed(1)
    return (torch.randn(3, 4, 8, generator=generator).requires_grad_(),
            torch.randn(5, 8, generator=generator).requires_grad_())


T = "fixtures/twins/"
ROWS: list[tuple[str, list[Row]]] = [
    ("Errors as evidence (issue 42, 1)", [
        Row("TorchFunctionMode around the forward only", (T + "forward_only_mode.py", "make_step"),
            made("forward_only_mode"), [made("forward_only_mode", fixed=True)]),
        Row("dispatch mode around the forward only", (T + "forward_only_dispatch.py", "make_step"),
            made("forward_only_dispatch"), [made("forward_only_dispatch", fixed=True)]),
        Row("forward hooks of an outer call, removed before backward", (T + "forward_only_hooks.py", "Probe"),
            made("forward_only_hooks"), [made("forward_only_hooks", fixed=True)]),
        Row("forward-pre hooks of an outer call, removed before backward", (T + "forward_only_hooks.py",
                                                                              "group_input_pairs"),
            made("forward_only_hooks", pre=True), [made("forward_only_hooks", fixed=True, pre=True)]),
        Row("size from a runtime flag that differs at recompute", (T + "runtime_size.py", "attention_chunks"),
            made("runtime_size"), [made("runtime_size", fixed=True)]),
        Row("compile fallback: compiled forward, eager recompute", (T + "compile_fallback.py", "make_step"),
            made("compile_fallback"), [made("compile_fallback", fixed=True)]),
        Row("mixed-precision cast for the wrapper's call only", (T + "forward_only_cast.py", "mixed_precision"),
            made("forward_only_cast"), [made("forward_only_cast", fixed=True)]),
        Row("selective checkpointing with autocast's weight cache", (T + "sac_autocast_cache.py", "make_step"),
            made("sac_autocast_cache"), [made("sac_autocast_cache", fixed=True)],
            note="fails on CPU with torch 2.13 (selective checkpointing's RuntimeError, not CheckpointError)"),
    ]),
    ("Hand-written recomputation (issue 42, 2)", [
        Row("Function re-normalises a tensor it saved normalised", (T + "hand_functions.py", "RMSNormReapplied"),
            function_audit("make_step", False), [function_audit("make_step", True)], watch_sees=False,
            note="watch() by design: a Function's backward is no recompute of a checkpoint",
            audit=("RMSNormReapplied", _rms_args)),
        Row("Function writes a leaf's `.grad` and returns it", (T + "hand_functions.py", "AccumulatingLinear"),
            function_audit("make_linear_step", False), [function_audit("make_linear_step", True)],
            watch_sees=False, note="watch() by design: no checkpoint call", audit=("AccumulatingLinear", _linear_args)),
        Row("hand-written checkpoint Function without RNG stash (guided-diffusion)",
            (T + "diffusion_checkpoint.py", "CheckpointFunction"),
            attribute("diffusion_checkpoint", "step"), [attribute("diffusion_checkpoint", "fixed_step")],
            watch_sees=False, note="watch() by design: it intercepts torch's checkpoint, not a project's Function"),
        Row("hand-written checkpoint Function re-enters autocast without its dtype",
            (T + "amp_checkpoint.py", "CheckpointFunction"),
            attribute("amp_checkpoint", "step"), [attribute("amp_checkpoint", "fixed_step")],
            watch_sees=False, note="watch() by design: it intercepts torch's checkpoint, not a project's Function"),
    ]),
    ("False patterns: the fixed variant is correct code and must be clean (issue 42, 3)", [
        Row("counter bumped again by the recompute; fixed: a `context_fn` that saves and restores it (MoE gate)",
            ("tests/watch/read_state.py", "restoring_context"), gate(False), [gate(True)]),
        Row("recompute writes into a holder object; fixed: the same bytes again (shared K/V carrier)",
            ("tests/watch/read_state.py", "KVCarrier"), carrier(True), [carrier(False)]),
        Row("config attribute changed between forward and recompute; fixed: no region reads it (`problem_type`)",
            ("tests/watch/classification_head.py", "ForSequenceClassification"), classification(True),
            [classification(False)]),
        Row("trainer's hook name changed before backward; fixed: no region reads it (Lightning)",
            ("tests/watch/read_state.py", "LitModel"), lightning(True), [lightning(False)]),
    ]),
    ("Classic hazards", [
        Row("dropout without RNG preservation; fixed: `preserve_rng_state=True`", ("fixtures/models/zoo.py", "region_dropout_rng_not_preserved"),
            zoo_region("region_dropout_rng_not_preserved", preserve_rng_state=False),
            [zoo_region("region_dropout_rng_not_preserved")]),
        Row("BatchNorm (training) inside the region; fixed: outside it (DenseNet)",
            (T + "batchnorm_outside.py", "dense_layer"), attribute("batchnorm_outside", "inside_step"),
            [attribute("batchnorm_outside", s) for s in ("closure_step", "method_step", "partial_step")]),
        Row("logging inside the region; fixed: logged after the checkpoint", ("fixtures/models/zoo.py",
                                                                              "_logging_region"),
            zoo_region("region_logging"), [logged_after]),
        Row("global the region reads changed before backward; fixed: nothing changed in between", ("fixtures/steps/train_steps.py",
                                                                "global_flipped_step"),
            train_step("global_flipped_step"), [train_step("clean_step")]),
        Row("parameter changed (optimizer step) before backward; fixed: nothing changed in between", ("fixtures/steps/train_steps.py",
                                                                   "optimizer_before_backward_step"),
            train_step("optimizer_before_backward_step"), [train_step("clean_step")]),
        Row("reentrant forward under no_grad: side-recorded router logits (HF Mixtral)",
            (T + "moe_router.py", "record_outputs"), attribute("moe_router", "step"),
            [attribute("moe_router", "fixed_step")], watch_sees=False,
            note="watch() by design: forward and recompute agree; only gradients against a twin differ"),
        Row("eval-mode cache filled under no_grad (timm LeViT)", (T + "levit_cache.py", "attention"),
            attribute("levit_cache", "step"), [attribute("levit_cache", "fixed_step")], watch_sees=False,
            note="watch() by design: forward and recompute agree; only gradients against a twin differ"),
        Row("aux-loss tracker in another module written again (Megatron MoE)", (T + "moe_tracker.py", "top_k_router"),
            attribute("moe_tracker", "step"), [attribute("moe_tracker", "fixed_step")], watch_sees=False,
            note="watch() does not reach state returned by a function call "
                 "(`get_moe_layer_wise_logging_tracker()`); the twin's end state does"),
        Row("compiler recomputes dropout (`activation_memory_budget < 1`)", (T + "compiled_budget.py", "make_step"),
            attribute("compiled_budget", "step"), [attribute("compiled_budget", "fixed_step")], watch_sees=False,
            note="watch() by design: no checkpoint call exists"),
        Row("plain-object cache argument appended again (`DynamicCache`)", (T + "dynamic_cache.py", "dynamic_cache"),
            attribute("dynamic_cache", "step"), [attribute("dynamic_cache", "fixed_step")]),
        Row("(clean) encoder-decoder cross-attention, reentrant and not", (T + "encoder_decoder.py", "make_step"),
            None, [attribute("encoder_decoder", "step"), attribute("encoder_decoder", "nonreentrant_step")]),
        Row("(clean) nested checkpoints (timm MetaFormer)", (T + "nested_checkpoint.py", "make_step"), None,
            [attribute("nested_checkpoint", s) for s in ("reentrant_step", "mixed_step", "nonreentrant_step")]),
    ]),
]


def where(row: Row) -> str:
    file, name = row.where
    module = load(ROOT / file, fresh=False) if not file.startswith("tests/") else None
    if module is None:  # a test helper: found by its text, it imports its neighbours
        lines = (ROOT / file).read_text().splitlines()
        line = next(i for i, text in enumerate(lines, 1) if text.startswith((f"class {name}", f"def {name}")))
    else:
        line = inspect.getsourcelines(getattr(module, name))[1]
    return f"`{file}:{line}`"


def _cause(text: str) -> str:
    for line in text.splitlines():
        if line.strip().startswith("cause: "):
            return line.strip()[len("cause: "):]
    return ""


def _short(text: str, limit: int = 120) -> str:
    text = text.replace("|", "\\|")
    return text if len(text) <= limit else text[:limit - 1] + "…"


def run_check_step(build: Callable[[], Step]) -> tuple[bool, str]:
    """Whether ``check_step`` found something, and what, in a table cell."""
    import recheck
    from recheck.watcher.failure import ONLY_WHEN_CHECKPOINTED

    try:
        report = recheck.check_step(build())
    except Exception as exc:  # noqa: BLE001 - the step fails without checkpointing too
        return False, f"raised {_short(f'{type(exc).__name__}: {exc}', 60)}"
    failed = [f for f in report.findings if f.subject == ONLY_WHEN_CHECKPOINTED]
    if failed:
        cause = _cause(failed[0].detail or "")
        return True, "step fails only when checkpointed" + (f" (cause: {_short(cause)})" if cause else "")
    return (not report.ok), ", ".join(sorted(report.kinds)) or "clean"


def run_watch(build: Callable[[], Step]) -> tuple[bool, str]:
    """Whether a ``watch()`` around one run of the step found something, and what."""
    import recheck

    step = build()
    raised = None
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            with recheck.watch(raise_on_finding=False) as watched:
                step()
        except Exception as exc:  # noqa: BLE001 - torch's error for a hazard; recheck appends its note
            raised = exc
    kinds = ", ".join(sorted({f.kind for f in watched.report})) or ""
    if raised is not None:
        notes = [n for n in getattr(raised, "__notes__", []) if n.startswith("recheck:")]
        told = f"{type(raised).__name__} explained" if notes else f"{type(raised).__name__}, no explanation"
        cause = _cause(notes[0]) if notes else ""
        text = ", ".join(filter(None, [kinds, told])) + (f" (cause: {_short(cause)})" if cause else "")
        return bool(notes) or bool(kinds), text
    return (not watched.report.ok), kinds or "clean"


def run_audit(audit: tuple[str, Callable[[], tuple]]) -> tuple[bool, str]:
    import recheck

    name, arguments = audit
    report = recheck.check_function(getattr(twin("hand_functions"), name), *arguments())
    return (not report.ok), "check_function: " + (", ".join(sorted(report.kinds)) or "clean")


def main() -> int:
    warnings.simplefilter("ignore")
    problems: list[str] = []
    counts = {"hazards": 0, "check_step": 0, "watch": 0, "both": 0, "watch_expected": 0, "fixed": 0, "clean": 0}
    print("| mechanism | fixture | `check_step` | `watch()` | caught by | fixed variant (`check_step` / `watch()`) "
          "| note |")
    print("|---|---|---|---|---|---|---|")
    for group, rows in ROWS:
        print(f"| **{group}** | | | | | | |")
        for row in rows:
            by = "–"
            step_cell = watch_cell = "–"
            if row.hazard is not None:
                counts["hazards"] += 1
                step_caught, step_cell = run_check_step(row.hazard)
                if row.audit is not None:
                    audit_caught, audit_cell = run_audit(row.audit)
                    step_cell += f"; {audit_cell}"
                    step_caught = step_caught and audit_caught
                watch_caught, watch_cell = run_watch(row.hazard)
                counts["check_step"] += step_caught
                counts["watch"] += watch_caught
                counts["both"] += step_caught and watch_caught
                counts["watch_expected"] += row.watch_sees
                by = {(True, True): "both", (True, False): "`check_step`", (False, True): "`watch()`",
                      (False, False): "**neither**"}[step_caught, watch_caught]
                if not step_caught:
                    problems.append(f"{row.mechanism}: check_step did not catch it")
                if row.watch_sees and not watch_caught:
                    problems.append(f"{row.mechanism}: watch() did not catch it")
            fixed_cells = []
            for build in row.fixed:
                counts["fixed"] += 1
                step_dirty, step_text = run_check_step(build)
                watch_dirty, watch_text = run_watch(build)
                clean = not step_dirty and not watch_dirty and "raised" not in step_text
                counts["clean"] += clean
                fixed_cells.append(f"{step_text} / {watch_text}")
                if not clean:
                    problems.append(f"{row.mechanism}: a fixed variant is not clean ({step_text} / {watch_text})")
            fixed = "; ".join(dict.fromkeys(fixed_cells)) + (f" ({len(fixed_cells)} variants)"
                                                             if len(fixed_cells) > 1 else "")
            print(f"| {row.mechanism} | {where(row)} | {step_cell} | {watch_cell} | {by} | {fixed} | {row.note} |")
            sys.stdout.flush()
    print()
    print(f"hazards caught: check_step {counts['check_step']} of {counts['hazards']}, watch() {counts['watch']} of "
          f"{counts['hazards']} ({counts['watch_expected']} it can see by design), both {counts['both']}; "
          f"fixed variants clean under both: {counts['clean']} of {counts['fixed']}")
    for problem in problems:
        print(f"FAILED: {problem}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
