"""From the runs of one check to the findings of its report.

:func:`judge` compares the plain run with the checkpointed run (outputs, gradients,
state after the step), the forward call with the recompute call inside the
checkpointed run (state at entry, outputs, saved tensors, side effects), and, when a
full replay ran, marks what only the replay showed as latent.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable

from recheck.runtime.explaining import with_likely_causes
from recheck.checker.compare import (Context, compare_entries, compare_grads, compare_observed,
                                     compare_outputs, context_findings, effect_findings,
                                     saved_tensor_findings)
from recheck.checker.run import RunResult
from recheck.findings import DYNAMIC_KINDS, Finding

__all__ = ["judge"]

_LATENT_WHY = ("latent: early stop ended the recompute before this ran; "
               "use_reentrant=True or early_stop=False run it")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    head = text[0] if text else ""
    if head.startswith("torch.utils.checkpoint: "):
        head = head[len("torch.utils.checkpoint: "):]
    return f"{type(exc).__name__}: {head}"[:160]


def _torch_text(exc: BaseException) -> str:
    """torch's message without its generic debugging tips."""
    text = str(exc)
    for marker in ("\nTip: ", "\n\nTip:", " Hint: enable anomaly detection"):
        if marker in text:
            text = text[: text.index(marker)]
    return "\n".join(line for line in text.strip().splitlines() if line.strip() != ".")


def _error_kind(exc: BaseException, input_mutated: bool) -> str:
    text = str(exc)
    if "leaf Variable that requires grad is being used in an in-place" in text:
        return "input_mutation"
    if "modified by an inplace operation" in text:
        return "input_mutation" if input_mutated else "param_version"
    return "recompute"


def _input_mutations(ctx: Context, plain: RunResult) -> list[Finding]:
    if not plain.calls:
        return []
    call = plain.calls[0]
    findings = []
    for path, (version, _copy) in call.inputs_entry.items():
        after = call.inputs_exit.get(path)
        if after is None or after == (version, True):
            continue
        how = (f"version {version} -> {after[0]}" if after[0] != version
               else "bytes changed without a version bump (.data or a view)")
        findings.append(ctx.finding("input_mutation", path,
                                    f"{path} is modified in place by the region", how, "RC107"))
    return findings


def _run_findings(ctx: Context, plain: RunResult, run: RunResult, input_mutated: bool,
                  latent: bool, buffers: frozenset[int], written: frozenset[str]) -> list[Finding]:
    findings: list[Finding] = []
    if run.forward_error is not None:
        exc = run.forward_error
        return [ctx.finding("output", "output", f"the checkpointed forward raised {_first_line(exc)}",
                            str(exc), latent=latent)]
    if not latent:
        findings += compare_outputs(ctx, plain.outputs, run.outputs)
    calls = run.calls
    recompute_calls = calls[1:]
    raised = [c for c in recompute_calls if c.outcome == "raised"
              and type(c.error).__name__ != "CheckpointError"]  # torch's own: see backward
    error = raised[0].error if raised else None
    if error is not None:
        findings.append(ctx.finding("recompute", "recompute",
                                    f"the region raised during recompute: {_first_line(error)}",
                                    str(error), latent=latent))
    elif run.backward_error is not None:
        exc = run.backward_error
        kind = _error_kind(exc, input_mutated)
        findings.append(ctx.finding(kind, "backward", f"torch raised in backward: {_first_line(exc)}",
                                    _torch_text(exc), ctx.explain(kind, ""),
                                    latent=latent))
    if run.saved is not None:
        findings += saved_tensor_findings(ctx, run.saved.mismatches, run.saved.compared,
                                          skip_storages=buffers, latent=latent)
    if recompute_calls:
        first = recompute_calls[0]
        if first.outcome == "returned" and calls[0].outputs is not None:
            findings += compare_outputs(ctx, calls[0].outputs, first.outputs, kind="recompute",
                                        labels=("forward", "recompute"), check_requires_grad=False,
                                        latent=latent, flat=True)
        shown = {k: (calls[0].shown.get(k, ""), first.shown.get(k, "")) for k in calls[0].entry}
        findings += compare_entries(ctx, calls[0].entry, first.entry, shown, latent=latent)
        findings += context_findings(ctx, calls[0].context, first.context, latent=latent)
        effects = [e for call in recompute_calls for e in call.effects]
        findings += effect_findings(ctx, effects, latent=latent)
    if not latent and run.backward_error is None and not raised:
        findings += compare_grads(ctx, plain.grads, run.grads)
    if run.baseline is None:
        findings += compare_observed(ctx, plain.post, run.post, when="after the step")
    else:  # the replay: whatever the whole recompute changes, a plain step never does
        findings += compare_observed(ctx, run.baseline, run.post, when="during the full recompute",
                                     labels=("before recompute", "after recompute"), latent=latent)
    return _drop_inert_counters(findings, written)


def _drop_inert_counters(findings: list[Finding], written: frozenset[str]) -> list[Finding]:
    """A global the region itself rewrites (a counter) is ``state``; it is also a ``global``
    finding only when some computed value (output, saved tensor, gradient) differs."""
    if any(f.kind in ("output", "recompute", "gradient") for f in findings):
        return findings
    return [f for f in findings if not (f.kind == "global" and f.subject in written)]


def _unique(findings: Iterable[Finding]) -> list[Finding]:
    seen: set[tuple[str, str | None]] = set()
    out = []
    for finding in findings:
        key = (finding.kind, finding.subject)
        if key not in seen:
            seen.add(key)
            out.append(finding)
    return out


def judge(ctx: Context, plain: RunResult, user: RunResult, replay: RunResult | None,
          buffers: frozenset[int] = frozenset(), written: frozenset[str] = frozenset()
          ) -> list[Finding]:
    """Every finding of one check, ordered by kind, latent ones last.

    ``buffers`` holds the storage pointers of module buffers (see :mod:`recheck.runtime.saved_tensors`);
    ``written`` the subjects (``global `mod.NAME```) of globals the region writes.
    """
    mutations = _input_mutations(ctx, plain)
    findings = mutations + _run_findings(ctx, plain, user, bool(mutations), False, buffers,
                                         written)
    if replay is not None:
        known = {(f.kind, f.subject) for f in findings}
        shown = {f.kind for f in findings if f.kind == "recompute"}  # one is enough
        for finding in _run_findings(ctx, plain, replay, bool(mutations), True, buffers,
                                      written):
            if (finding.kind, finding.subject) not in known and finding.kind not in shown:
                detail = "\n".join(t for t in (finding.detail, _LATENT_WHY) if t)
                findings.append(dataclasses.replace(finding, detail=detail))
    findings = _unique(findings)
    order = {kind: index for index, kind in enumerate(DYNAMIC_KINDS)}
    findings.sort(key=lambda f: (f.latent, order.get(f.kind, 99)))
    return with_likely_causes(findings)
