"""What the faces say about a difference, in the same words: causes, side effects, versions.

The rule registry (:mod:`recheck.catalogue`) maps kind + subject to a rule; this module holds
the rest of the explaining that ``check()`` and ``watch()`` share, so a hazard reads the same
in both:

* :func:`with_likely_causes` points an ``output``, ``recompute`` or ``gradient`` difference at
  the finding that explains it (an RNG stream, a global, a parameter version ...);
* :func:`effect_messages` words the side effects a recompute emitted again, one per channel;
* :func:`param_version_message` words parameters modified between forward and recompute.

Nothing here imports torch.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Iterable, Sequence

from recheck.catalogue import TRAINING_STATE, hint
from recheck.findings import DECLARED, parts_of
from recheck.runtime.naming import parameter_subject

if TYPE_CHECKING:  # pragma: no cover
    from recheck.findings import Finding
    from recheck.runtime.effects import Effect

__all__ = ["CAUSES", "SYMPTOMS", "effect_messages", "is_symptom", "param_version_message", "with_likely_causes"]

#: Kinds that explain a value difference, in their declared order (:data:`recheck.findings.DECLARED`).
CAUSES = tuple(k.name for k in DECLARED if k.cause)
#: Kinds that are the consequence of a cause: values that came out different.
SYMPTOMS = tuple(k.name for k in DECLARED if not k.cause)


def is_symptom(finding: Finding) -> bool:
    """A value that came out different: an output, a recompute, a gradient, or the parameters
    and optimizer state a training step updates from its gradients."""
    return finding.kind in SYMPTOMS or (finding.kind == "state" and parts_of(finding.subject).what in TRAINING_STATE)


def with_likely_causes(findings: Sequence[Finding]) -> list[Finding]:
    """``findings`` with every symptom that has no hint of its own pointed at the likeliest cause.

    The likeliest cause is the first cause kind in :data:`CAUSES`, a finding that
    happened (not latent) first; the symptom takes its rule code, a ``likely cause:`` hint, and the
    cause's kind as ``cause`` (what a report groups it under).
    """
    causes = [f for f in findings if f.kind in CAUSES and f.code and not is_symptom(f)]
    if not causes:
        return list(findings)
    cause = min(causes, key=lambda f: (f.latent, CAUSES.index(f.kind)))
    text = f"likely cause: {cause.message}"
    return [dataclasses.replace(f, code=cause.code, hint=hint(str(cause.code), text), cause=cause.kind)
            if f.hint is None and is_symptom(f) else f for f in findings]


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def effect_messages(effects: Iterable[Effect]) -> list[tuple[str, str, str]]:
    """``(channel, message, detail)`` for each channel that emitted during a recompute.

    Writes to stdout/stderr are joined and counted by line (``print`` writes the text and the
    newline separately); the detail shows the first five entries.
    """
    by_channel: dict[str, list[str]] = {}
    for effect in effects:
        by_channel.setdefault(effect.channel, []).append(effect.text)
    out = []
    for channel, texts in by_channel.items():
        if channel in ("stdout", "stderr"):
            texts = "".join(texts).splitlines() or [""]
            message = f"{_plural(len(texts), 'line')} written to {channel} again during recompute"
        else:
            noun = "logging record" if channel == "logging" else "warning"
            message = f"{_plural(len(texts), noun)} emitted again during recompute"
        shown = [f"{channel}: {t if len(t) <= 80 else t[:77] + '...'!r}" for t in texts[:5]]
        if len(texts) > 5:
            shown.append(f"... and {len(texts) - 5} more")
        out.append((channel, message, "\n".join(shown)))
    return out


#: parameters a ``param_version`` message names before "and N more" (the detail lists all)
_LISTED = 4


def param_version_message(versions: Sequence[tuple[str, object, object]]) -> tuple[str, str, str]:
    """``(subject, message, detail)`` for parameters (name, version at forward, at recompute)."""
    shown = [f"`{name}` (version {before} at forward, {after} at recompute)" for name, before, after in versions]
    listed = ", ".join(shown[:_LISTED]) + (f" and {len(shown) - _LISTED} more" if len(shown) > _LISTED else "")
    plural = "s" if len(versions) > 1 else ""
    detail = "an optimizer step or another in-place update ran between this invocation's forward and its recompute"
    if len(shown) > _LISTED:
        detail += "\n" + "\n".join(shown)
    subject = parameter_subject([name for name, _, _ in versions])
    return subject, f"parameter{plural} modified in place between forward and recompute: {listed}", detail
