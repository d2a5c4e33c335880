"""Turn what two runs saw into :class:`~recheck.findings.Finding` objects.

Every function takes a :class:`Context` (region, invocation, tolerance, configuration)
and returns a list of findings using the kind vocabulary of
:data:`recheck.findings.DYNAMIC_KINDS`.  Nothing here runs the region.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

import torch

from recheck.runtime.bits import Tolerance, bits_equal, compare_tensors, describe_tensor
from recheck.catalogue import explain, hint
from recheck.checker.message import value_detail
from recheck.runtime.fingerprints import Observed, alike_but_identity, fingerprint, show
from recheck.runtime.trees import leaves
from recheck.findings import Finding, Invocation, Subject

__all__ = ["Context", "compare_grads", "compare_observed", "compare_outputs"]

@dataclass(frozen=True)
class Context:
    """What every finding of one check shares."""

    region: str
    invocation: Invocation | None
    tolerance: Tolerance | None
    use_reentrant: bool
    #: None where one call's setting does not apply (a whole step)
    preserve_rng_state: bool | None

    def finding(self, kind: str, subject: str, message: str, detail: str = "",
                code: str | None = None, latent: bool = False) -> Finding:
        """A finding of this check; ``code`` (``RC106``) becomes the hint."""
        return Finding(kind=kind, message=message, code=code, region=self.region,
                       invocation=self.invocation, subject=subject, detail=detail,
                       hint=hint(code) if code else None, latent=latent)

    def explain(self, kind: str, subject: str) -> str | None:
        """The rule code the registry gives a finding of ``kind`` about ``subject``."""
        context: dict[str, object] = {"implementation": "torch"}
        if self.preserve_rng_state is not None:
            context["preserve_rng_state"] = self.preserve_rng_state
        return explain(kind, subject, **context)


def _tensor_finding(ctx: Context, kind: str, subject: str, original: torch.Tensor,
                    other: torch.Tensor, message: str, check_requires_grad: bool = True,
                    code: str | None = None, latent: bool = False) -> list[Finding]:
    if (ctx.tolerance is None and original.layout == torch.strided
            and (not check_requires_grad or original.requires_grad == other.requires_grad)
            and (original is other or bits_equal(original, other))):
        return []  # identical: no need to build the difference
    diff = compare_tensors(original, other, tolerance=ctx.tolerance,
                           check_requires_grad=check_requires_grad,
                           description=describe_tensor(original))
    if diff is None:
        return []
    if diff.metadata:
        message += " (metadata)"
    else:
        message += f" ({diff.mismatched:,} of {diff.numel:,} elements)"
    finding = ctx.finding(kind, subject, message, str(diff), code, latent)
    if code is None and original.device.type == "cuda":
        finding = dataclasses.replace(finding, hint=(
            "CUDA kernels may be non-deterministic: run under "
            "torch.use_deterministic_algorithms(True), or pass atol/rtol/max_ulp"))
    return [finding]


def compare_outputs(ctx: Context, original: Any, other: Any, *, kind: str = "output",
                    labels: tuple[str, str] = ("plain forward", "checkpointed forward"),
                    check_requires_grad: bool = True, latent: bool = False,
                    flat: bool = False) -> list[Finding]:
    """Outputs leaf by leaf: structure, tensors bit for bit, other values by content.

    With ``flat=True`` both values are already lists of :func:`~recheck.runtime.trees.leaves`.
    """
    left, right = (original, other) if flat else (leaves(original), leaves(other))
    if [p for p, _ in left] != [p for p, _ in right]:
        detail = value_detail(show([p for p, _ in left], 200), show([p for p, _ in right], 200),
                              labels)
        return [ctx.finding(kind, Subject("output", path="output"), f"the output structure differs from the {labels[0]}'s",
                            detail, latent=latent)]
    findings: list[Finding] = []
    for (path, a), (_, b) in zip(left, right):
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
            findings += _tensor_finding(ctx, kind, Subject("output", path=path), a, b,
                                        f"{path} differs from the {labels[0]}'s",
                                        check_requires_grad, latent=latent)
        elif fingerprint(a) != fingerprint(b):
            findings.append(ctx.finding(kind, Subject("output", path=path), f"{path} differs from the {labels[0]}'s",
                                        value_detail(show(a), show(b), labels), latent=latent))
    return findings


def compare_grads(ctx: Context, original: Mapping[str, torch.Tensor | None],
                  other: Mapping[str, torch.Tensor | None], *,
                  labels: tuple[str, str] = ("plain run", "checkpointed run"),
                  reference: str = "the uncheckpointed run") -> list[Finding]:
    """Gradients by name (``grad of `layer1.weight```), including None against a tensor.

    ``labels`` name the two runs in the detail, ``reference`` the original in the message.
    """
    findings: list[Finding] = []
    for name, a in original.items():
        b = other.get(name)
        if a is b:  # both None, or one value both runs left (check_step's twin shares what is alike)
            continue
        subject = Subject("gradient", path=name)  # the name as the caller quotes it: `w`, args[0]
        if a is None or b is None:
            detail = value_detail("None" if a is None else describe_tensor(a),
                                  "None" if b is None else describe_tensor(b),
                                  labels)
            state, there = ("missing", "a tensor") if b is None else ("extra", "None")
            findings.append(ctx.finding("gradient", subject,
                                        f"{subject} is {state} under checkpoint ({there} in {reference})", detail))
            continue
        findings += _tensor_finding(ctx, "gradient", subject, a, b,
                                    f"{subject} differs from {reference}'s",
                                    check_requires_grad=False)
    return findings


def compare_observed(ctx: Context, original: Mapping[tuple[str, str], Observed],
                     other: Mapping[tuple[str, str], Observed], *, when: str,
                     labels: tuple[str, str] = ("plain run", "checkpointed run"),
                     latent: bool = False, notes: list[str] | None = None) -> list[Finding]:
    """Side state after two runs (rng, buffers, attributes, globals, parameters).

    A value that differs only by objects whose state cannot be read (each run made its own) is
    no finding: it is named in ``notes``."""
    findings: list[Finding] = []
    for key, a in original.items():
        b = other.get(key)
        # the same object: a piece of state both runs left as captured (its copy, its print)
        if b is None or b.value is a.value:
            continue
        kind, subject = key
        message = f"{subject} differs {when}"
        if isinstance(a.value, torch.Tensor) and isinstance(b.value, torch.Tensor):
            findings += _tensor_finding(ctx, kind, subject, a.value, b.value, message,
                                        check_requires_grad=False, code=ctx.explain(kind, subject), latent=latent)
        elif alike_but_identity(a.value, b.value):
            if notes is not None and a.value != b.value:
                notes.append(f"recheck cannot compare {subject} between the runs: it differs only by objects "
                             "each run made anew whose state recheck cannot read (callables, modules, objects "
                             "without attributes, or held deeper than it looks)")
        elif a.value != b.value:
            detail = value_detail(a.shown or show(a.value), b.shown or show(b.value), labels)
            findings.append(ctx.finding(kind, subject, message, detail, ctx.explain(kind, subject), latent))
    return findings
