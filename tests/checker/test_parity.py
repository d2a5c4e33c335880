"""``recheck.check()`` and ``recheck.watch()`` tell the same story about the same region.

Every region of the bundled zoo is checked with :func:`recheck.check` and, separately, run
under :func:`recheck.watch` by a step that checkpoints it the same way (same variant,
``preserve_rng_state``, inputs and upstream gradient).  For every kind both faces can see,
the two must report the same set of (kind, subject, rule code).  ``gradient`` and ``output``
need the uncheckpointed twin, which only ``check()`` runs, except for what ``watch()`` can
tell from the checkpointed run alone: a parameter whose gradient is never computed.
"""

from __future__ import annotations

import functools
import warnings
from pathlib import Path

import pytest
import torch
from torch.utils.checkpoint import checkpoint

from source_modules import load_file

import recheck
from recheck.checker.twin import make_upstream
from recheck.runtime.trees import leaves
from recheck.watcher.failure import ONLY_WHEN_CHECKPOINTED

#: Kinds watch() sees in the checkpointed run alone.
SHARED = {"rng", "context", "buffer", "state", "global", "side_effect", "param_version", "input_mutation", "recompute"}


def _build(zoo, name):
    built = getattr(zoo, name)()
    fn, args = built[0], built[1]
    return fn, args, (built[2] if len(built) > 2 else {})


def _triples(report, kinds):
    # "the step fails only when checkpointed" is check() reporting the exception its own step
    # caught; under watch() that exception reaches the program, which sees it itself
    return {(f.kind, f.subject, f.code) for f in report
            if f.kind in kinds and not f.latent and f.subject != ONLY_WHEN_CHECKPOINTED}


def _watched_step(zoo, name, options):
    fn, args, kwargs = _build(zoo, name)
    with warnings.catch_warnings(), recheck.watch(raise_on_finding=False) as w:
        warnings.simplefilter("ignore")
        try:
            reentrant = options.get("use_reentrant", False)
            if reentrant and kwargs:  # the reentrant variant takes no keyword arguments
                fn, kwargs = functools.partial(fn, **kwargs), {}
            out = checkpoint(fn, *args, use_reentrant=reentrant,
                             preserve_rng_state=options.get("preserve_rng_state", True), **kwargs)
            outputs = dict(leaves(out))
            upstream = make_upstream(outputs, None)
            pairs = [(outputs[p], g) for p, g in upstream if outputs[p].requires_grad]
            if pairs:
                torch.autograd.backward([t for t, _ in pairs], [g for _, g in pairs])
        except RuntimeError:
            pass  # torch's own error for a hazard (a version counter, a checkpoint mismatch)
    return w.report


@pytest.mark.parametrize("variant", ["own", "reentrant", "non-reentrant"])
def test_check_and_watch_agree(zoo, zoo_name, variant):
    if zoo_name in zoo.SHOWS_BY_CHANCE:
        pytest.skip("shows only when the allocator does not hand back the forward's block")
    options = dict(zoo.CHECK_OPTIONS.get(zoo_name, {}))
    if variant != "own":
        options["use_reentrant"] = variant == "reentrant"
    fn, args, kwargs = _build(zoo, zoo_name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the warning example's own warning
        checked = recheck.check(fn, *args, kwargs=kwargs, **options)
    watched = _watched_step(zoo, zoo_name, options)
    a, b = _triples(checked, SHARED), _triples(watched, SHARED)
    assert a == b, (f"check only: {sorted(a - b, key=str)}\nwatch only: {sorted(b - a, key=str)}\n"
                    f"--- check\n{checked}\n--- watch\n{watched}")
    # what watch() says of gradients (a gradient never computed) check() says too
    assert _triples(watched, {"gradient"}) <= _triples(checked, {"gradient"}), str(watched)


def test_watch_sees_a_reentrant_region_whose_inputs_need_no_grad(zoo):
    name = "region_reentrant_input_without_grad"
    watched = _watched_step(zoo, name, zoo.CHECK_OPTIONS[name])
    fn, args, kwargs = _build(zoo, name)
    checked = recheck.check(fn, *args, kwargs=kwargs, **zoo.CHECK_OPTIONS[name])
    missing = {f.subject for f in checked.by_kind("gradient")}
    assert missing and {f.subject for f in watched.by_kind("gradient")} == missing, str(watched)


CONTEXT = Path(__file__).resolve().parents[2] / "fixtures" / "models" / "context_regions.py"


@pytest.mark.parametrize("variant", ["reentrant", "non-reentrant"])
@pytest.mark.parametrize("name", ["region_leaky_precision", "region_scoped_precision"])
def test_check_and_watch_agree_on_the_context(name, variant):
    regions = load_file(CONTEXT, "recheck_context_regions")
    options = {"use_reentrant": variant == "reentrant"}
    try:
        fn, args, kwargs = _build(regions, name)
        checked = recheck.check(fn, *args, kwargs=kwargs, **options)
        assert torch.get_default_dtype() == torch.float32  # check() leaves no trace
        watched = _watched_step(regions, name, options)
    finally:
        torch.set_default_dtype(torch.float32)
    kinds = SHARED | {"context"}
    assert {(k, s) for k, s, _ in _triples(checked, {"context"})} == regions.EXPECTED[name], str(checked)
    assert _triples(checked, kinds) == _triples(watched, kinds), f"--- check\n{checked}\n--- watch\n{watched}"


def _warns_first(x):
    warnings.warn("region: falling back", UserWarning, stacklevel=1)
    return torch.exp(x).mean(-1)


def test_a_full_replay_counts_a_warning_of_the_forward_before_its_last_saved_tensor():
    # the warning comes before any saved tensor: an early-stopped recompute emits it too, so it
    # is no latent finding, whether check() or watch(early_stop=False) replays the recompute
    x = torch.randn(3, 4, requires_grad=True)
    with warnings.catch_warnings(), recheck.watch(raise_on_finding=False, early_stop=False) as w:
        warnings.simplefilter("always")  # shown at every call: the recompute's is shown again
        warnings.showwarning = lambda *args, **kwargs: None
        checkpoint(_warns_first, x, use_reentrant=False, early_stop=True).sum().backward()
        checked = recheck.check(_warns_first, x)
    for report in (w.report, checked):
        assert [(f.kind, f.latent) for f in report] == [("side_effect", False)], str(report)
