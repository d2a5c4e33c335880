"""One table of checkpoint entry points: the linter and the interception read the same records."""

from __future__ import annotations

import dataclasses

import pytest

from recheck.entry_points import TABLE, TORCH_CHECKPOINT, TORCH_GENERATOR, EntryPoint, Intercept
from recheck.intercept import implementations
from recheck.lint import targets
from recheck.lint.engine import lint_sources
from recheck.lint.rules import rc109_saved_tensors_twice as rc109

ADAPTED = [record for record in TABLE if record.intercept is not None and record.intercept.adapter]


@pytest.mark.parametrize("record", ADAPTED, ids=[r.intercept.kind for r in ADAPTED if r.intercept])
def test_every_adapted_entry_point_means_the_same_to_the_linter_and_its_adapter(record):
    adapter = next(a for a in implementations.ADAPTERS if a.name == record.intercept.kind)
    assert record.names, "an adapted entry point the linter cannot recognise"
    for name in record.names:
        entry = targets.ENTRY_POINTS[name]
        assert entry.reentrant_default == adapter.reentrant, name
        assert (entry.rng_keyword is None) == bool(adapter.preserves_rng), name  # always restored, no way out
        assert name.split(".")[0] == adapter.library, name
        assert entry.library == record.library


def test_every_record_reaches_the_linter_and_every_adapter_comes_from_one():
    assert set(targets.ENTRY_POINTS) == {name for record in TABLE for name in record.names}
    assert [a.name for a in implementations.ADAPTERS] == [r.intercept.kind for r in ADAPTED if r.intercept]
    kinds = {r.intercept.kind for r in TABLE if r.intercept is not None}
    assert kinds - {a.name for a in implementations.ADAPTERS} <= {TORCH_CHECKPOINT, TORCH_GENERATOR}
    assert set(implementations.ADAPTER_CLASSES) <= kinds  # no adapter class without its record


def test_a_record_added_to_the_table_reaches_both_sides():
    new = EntryPoint("Acme", ("acme.ckpt.checkpoint", "acme.checkpoint"), reentrant=True, reentrant_keyword=None,
                     rng_keyword=None, intercept=Intercept("acme", "acme.ckpt", "Checkpoint.apply", function_index=1))
    table = (*TABLE, new)

    lint = targets.entry_points(table)
    assert set(lint) - set(targets.ENTRY_POINTS) == {"acme.ckpt.checkpoint", "acme.checkpoint"}
    assert lint["acme.checkpoint"] == targets.EntryPoint("acme.checkpoint", "Acme", reentrant_default=True,
                                                          reentrant_keyword=None, rng_keyword=None)

    adapter = implementations.adapters(table)[-1]
    assert type(adapter) is implementations.Adapter
    assert (adapter.name, adapter.library, adapter.module, adapter.target) == ("acme", "acme", "acme.ckpt",
                                                                              "Checkpoint.apply")
    assert (adapter.reentrant, adapter.preserves_rng, adapter.function_index) == (True, True, 1)
    assert len(implementations.adapters(table)) == len(implementations.ADAPTERS) + 1

    without_adapter = dataclasses.replace(new, intercept=None)
    assert [a.name for a in implementations.adapters((*TABLE, without_adapter))] == \
        [a.name for a in implementations.ADAPTERS]
    assert "acme.checkpoint" in targets.entry_points((*TABLE, without_adapter))


def _twice(entry: str, call: str) -> str:
    """RC109's Function that reads ``ctx.saved_tensors`` twice, checkpointed by ``entry``."""
    source = rc109._FUNCTION.format(backward=rc109._TWICE, reentrant=False)
    return (source.replace("from torch.utils.checkpoint import checkpoint", f"from {entry} import checkpoint")
            .replace("checkpoint(self.adapter, x, use_reentrant=False)", call))


@pytest.mark.parametrize(("entry", "call", "found"), [
    ("deepspeed.checkpointing", "checkpoint(self.adapter, x)", False),  # reentrant: ordinary saved tensors
    ("megatron.core.tensor_parallel", "checkpoint(self.adapter, False, x)", False),
    ("torch.utils.checkpoint", "checkpoint(self.adapter, x, use_reentrant=False)", True),
], ids=["deepspeed", "megatron", "torch-non-reentrant"])
def test_a_reentrant_library_checkpoint_is_linted_as_reentrant(entry, call, found):
    # the linter's table said DeepSpeed's and Megatron's checkpoints were non-reentrant, the
    # adapters that bypass them said reentrant: both now read the one record
    result = lint_sources({"case.py": _twice(entry, call)})
    assert not result.errors, result.errors
    assert any(f.code == "RC109" for f in result.findings) is found
    assert not any(f.code == "RC001" for f in result.findings)  # no use_reentrant to pass there
