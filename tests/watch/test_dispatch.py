"""watcher/dispatch.py: module calls are listened to only while a region's forward runs."""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch import nn
from torch.nn.modules import module as torch_module
from torch.utils.checkpoint import checkpoint

import recheck
from recheck.intercept import module_calls

_CALL_IMPL = nn.Module.__dict__["_call_impl"]


def _global_pre_hooks() -> int:
    return len(torch_module._global_forward_pre_hooks)


class Inner(nn.Module):
    def __init__(self, seen: list[int]) -> None:
        super().__init__()
        self.lin, self.seen = nn.Linear(4, 4), seen

    def forward(self, x):
        self.seen.append(len(self.seen))
        return torch.tanh(self.lin(x))


def test_module_calls_are_listened_to_only_in_a_regions_forward_and_never_through_a_global_hook(monkeypatch):
    before = _global_pre_hooks()
    events: list[str] = []
    listen = module_calls.listen

    def spied(listener):
        events.append("listen")
        stop = listen(listener)
        return lambda: (events.append("stop"), stop())

    monkeypatch.setattr(module_calls, "listen", spied)
    seen: list[int] = []
    inner, outside = Inner(seen), nn.Linear(4, 4)
    with recheck.watch(raise_on_finding=False) as w:  # `seen` grows on each run: a finding of its own
        assert not module_calls.listening() and nn.Module.__dict__["_call_impl"] is not _CALL_IMPL  # held
        y = checkpoint(inner, outside(torch.randn(2, 4)), use_reentrant=False)
        assert not module_calls.listening() and events == ["listen", "stop"]  # the rest calls torch's fast path
        y.sum().backward()
        nested = checkpoint(lambda x: checkpoint(inner, x, use_reentrant=False), torch.randn(2, 4, requires_grad=True),
                            use_reentrant=False)
        assert not module_calls.listening()
        nested.sum().backward()
    # one listen per outermost forward (the nested call's forward runs inside the outer one's),
    # none in a recompute
    assert events == ["listen", "stop"] * 2, events
    # torch as found; any global hook would have sent every module call down the slow path
    assert nn.Module.__dict__["_call_impl"] is _CALL_IMPL and _global_pre_hooks() == before
    assert {f.subject for f in w.report} == {"attribute `self.seen`"}, str(w.report)


def test_the_listening_stops_when_a_regions_forward_raises():
    def region(x):
        raise ValueError("planted")

    with recheck.watch(raise_on_finding=False):
        try:
            checkpoint(region, torch.randn(2, 4, requires_grad=True), use_reentrant=False)
        except ValueError:
            pass
        assert not module_calls.listening()


def _shape_changing_step(watched: bool) -> str:
    """A region whose recompute saves a tensor of another shape: torch's own check raises."""
    calls = []

    def region(x):
        calls.append(None)
        return (x[: 4 if len(calls) == 1 else 3] * 2).sin().sum()

    x = torch.randn(5, requires_grad=True)
    try:
        if watched:
            with recheck.watch(raise_on_finding=False):
                checkpoint(region, x, use_reentrant=False).backward()
        else:
            checkpoint(region, x, use_reentrant=False).backward()
    except torch.utils.checkpoint.CheckpointError as exc:
        return str(exc)
    raise AssertionError("torch's metadata check did not raise")


def test_torchs_own_metadata_check_and_message_are_unchanged_under_watch():
    # the saved tensors' metadata is read from recheck's prints, not made per tensor by torch
    plain, watched = _shape_changing_step(False), _shape_changing_step(True)
    assert "saved metadata: {'shape': torch.Size([4])" in plain
    assert watched == plain


def test_the_none_determinism_check_still_compares_nothing_but_recheck_still_prints():
    x = torch.randn(3, requires_grad=True)
    with recheck.watch(raise_on_finding=False) as w:
        checkpoint(lambda t: t.sin().sum(), x, use_reentrant=False, determinism_check="none").backward()
    assert w.report.ok and w.report.stats["verified"] == 1


def test_under_the_none_determinism_check_a_recompute_that_differs_by_its_bytes_is_still_reported():
    # torch compares nothing; the record still compares the bytes of what was saved
    calls = []

    def region(t):
        calls.append(None)
        return (t * len(calls)).sin().sum()  # the recompute saves other values, of the same shape

    x = torch.randn(3, requires_grad=True)
    with recheck.watch(raise_on_finding=False) as w:
        checkpoint(region, x, use_reentrant=False, determinism_check="none").backward()
    found = [f for f in w.report.findings if f.kind == "recompute" and f.subject == "saved tensors"]
    assert len(found) == 1 and "bytes differ" in found[0].detail, str(w.report)


def test_the_none_determinism_check_lets_a_changed_shape_through_as_torch_does():
    # under "none" torch compares no metadata: the backward then fails on its own, watched or not
    def failure(watched: bool, mode: str) -> BaseException:
        calls = []

        def region(x):
            calls.append(None)
            return x.sum().expand(4 if len(calls) == 1 else 3).clone().sin().sum()

        x = torch.randn(5, requires_grad=True)
        with pytest.raises(Exception) as caught:
            with recheck.watch(raise_on_finding=False) if watched else contextlib.nullcontext():
                checkpoint(region, x, use_reentrant=False, determinism_check=mode).backward()
        return caught.value

    plain, watched = failure(False, "none"), failure(True, "none")
    assert not isinstance(plain, torch.utils.checkpoint.CheckpointError)
    assert type(watched) is type(plain) and str(watched) == str(plain)
    assert isinstance(failure(True, "default"), torch.utils.checkpoint.CheckpointError)


def test_a_recompute_whose_effect_capture_cannot_start_is_still_compared(monkeypatch):
    from recheck.runtime import effects

    entered = []
    original = effects.EffectCapture.__enter__

    def enter(self):
        entered.append(None)
        raise RuntimeError("no capture today")

    x = torch.randn(3, requires_grad=True)
    with recheck.watch(raise_on_finding=False) as w:
        out = checkpoint(lambda t: t.sin().sum(), x, use_reentrant=False)
        monkeypatch.setattr(effects.EffectCapture, "__enter__", enter)
        out.backward()
        monkeypatch.setattr(effects.EffectCapture, "__enter__", original)
    assert entered and x.grad is not None
    assert w.report.stats["verified"] == 1
    assert any(note.startswith("could not capture the recompute's effects of ")
               and note.endswith(": RuntimeError: no capture today") for note in w.report.notes), w.report.notes


@pytest.mark.parametrize("early_stop", [True, False], ids=["early-stop", "full-replay"])
def test_a_watched_step_leaves_no_reference_cycle_holding_tensors(early_stop):
    """Saved prints hold the tensors the hook got (not detached copies), whose graph holds the
    checkpoint frame that holds the prints: what a watched step made is still freed when it ends,
    by reference counts, not when the garbage collector next runs."""
    import gc

    torch.manual_seed(0)
    blocks = torch.nn.ModuleList(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(), torch.nn.Dropout(0.1))
                                 for _ in range(2))

    def step():
        x = torch.randn(4, 8, requires_grad=True)
        for block in blocks:
            x = checkpoint(block, x.t().contiguous().t(), use_reentrant=False)  # a non-contiguous input too
        x.sum().backward()

    with recheck.watch(raise_on_finding=False, early_stop=early_stop):
        step()  # warm-up: lazy imports, caches
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        with recheck.watch(raise_on_finding=False, early_stop=early_stop) as watcher:
            step()
        gc.collect()
        kept = [type(o).__qualname__ for o in gc.garbage if isinstance(o, torch.Tensor)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        if was:
            gc.enable()
    assert watcher.report.ok, str(watcher.report)
    assert kept == []


def test_a_returned_forward_keeps_only_what_a_recompute_reads_and_frees_it_with_the_graph():
    """What a region's forward and its recompute made is not kept by the watch once torch frees
    the graph: the tensors both passes produced are collected after the backward, in the block."""
    import gc
    import weakref

    produced: list[weakref.ref] = []

    def keep(module, args, output):  # noqa: ANN001, ANN202
        produced.append(weakref.ref(output))

    block = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.ReLU(), torch.nn.Linear(3, 3))
    block[1].register_forward_hook(keep)  # its output is saved, by itself and the next Linear
    with recheck.watch(raise_on_finding=False) as watcher:
        out = checkpoint(block, torch.randn(2, 3, requires_grad=True), use_reentrant=False)
        out.sum().backward()
        del out
        gc.collect()
        assert len(produced) == 2 and [ref() for ref in produced] == [None, None]  # released with the graph
    assert watcher.report.ok, str(watcher.report)
    assert watcher.report.stats["verified"] == 1


def test_a_module_made_inside_a_region_is_not_kept_once_its_invocation_is_done():
    """A region that makes a module at each call (a wrapper built in ``forward``): a long
    ``watch()`` block must not keep one per invocation alive."""
    import gc
    import weakref

    made: list[weakref.ref] = []
    block = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.ReLU())

    def region(x):  # noqa: ANN001, ANN202
        scale = torch.nn.Identity()
        made.append(weakref.ref(scale))
        return scale(block(x))

    with recheck.watch(raise_on_finding=False):
        for _ in range(10):
            out = checkpoint(region, torch.randn(2, 3, requires_grad=True), use_reentrant=False)
            out.sum().backward()
            del out
        gc.collect()
        alive = sum(ref() is not None for ref in made)
    assert len(made) == 20 and alive == 0, f"{alive} of {len(made)} modules kept alive"


def test_a_module_found_only_by_running_is_named_alike_in_every_step():
    """A module reached through a plain object is found by running the region; let go of when
    each invocation is done, it is still named as when first found, so its findings agree."""

    class Holder:
        def __init__(self) -> None:
            self.bn = nn.BatchNorm1d(3)

        def run(self, x):  # noqa: ANN001, ANN202
            return self.bn(x)

    holder = Holder()
    with recheck.watch(raise_on_finding=False) as watcher:
        for _ in range(3):
            checkpoint(holder.run, torch.randn(4, 3, requires_grad=True), use_reentrant=False).sum().backward()
    subjects = [f.subject for f in watcher.report.findings if f.subject.endswith("running_mean`")]
    assert len(subjects) == 3 and len(set(subjects)) == 1, subjects


def test_a_saved_parameter_is_told_by_its_data_pointer_and_a_slice_from_elsewhere_in_it_by_its_bytes():
    """A parameter saved as itself or as a view from its first element (``weight.t()``) is kept
    by identity and version; a slice of a fused weight from past its first element is digested:
    exact either way, and a write through ``.data`` (no version bump) shows in its bytes."""
    from recheck.watcher.dispatch import DISPATCHER

    fused = torch.nn.Linear(3, 6, bias=False)  # a fused projection: two halves of one weight

    def region(x):
        first = x @ fused.weight[:3].t()  # from the first element: a parameter's view
        second = x @ fused.weight[3:].t()  # from its middle: digested by its bytes
        return (first * second).sum()

    def run(between=None):
        with recheck.watch(raise_on_finding=False) as watcher:
            out = checkpoint(region, torch.randn(2, 3, requires_grad=True), use_reentrant=False)
            forward = DISPATCHER.records[-1].forward
            kinds = ["viewed" if saved.viewed is not None else "digested" if saved.found is not None else "printed"
                     for saved in forward.saved]
            if between is not None:
                between()
            out.backward()
        return watcher.report, kinds

    report, kinds = run()
    assert report.ok, str(report)
    assert kinds.count("viewed") == 1 and "digested" in kinds and "printed" not in kinds, kinds

    def write_through_data():
        with torch.no_grad():
            fused.weight.data[4:] += 1.0  # no version bump: the middle slice's bytes differ

    report, _ = run(write_through_data)
    assert [(f.kind, f.subject) for f in report.findings] == [("recompute", "saved tensors")], str(report)
    # the slice itself and what was computed from it: told by their bytes
    assert report.findings[0].message.startswith("2 of 6 tensors saved for backward differ"), str(report)


def test_a_wrapper_subclass_parameter_and_activation_leave_the_program_as_it_is():
    """A tensor subclass without data of its own (FSDP2's DTensor; here torch's TwoTensor) has
    no storage to read: its pointer is 0, and asking for its storage raises.  Before, that
    failed the forward's record, whose saved metadata torch then found empty at the recompute:
    the user's backward raised ``CheckpointError``."""
    from recheck.watcher.dispatch import DISPATCHER

    two_tensor = pytest.importorskip("torch.testing._internal.two_tensor")

    def model():
        torch.manual_seed(0)
        layer = nn.Linear(3, 3)
        layer.weight = nn.Parameter(two_tensor.TwoTensor(torch.randn(3, 3), torch.randn(3, 3)))
        layer.register_buffer("scale", two_tensor.TwoTensor(torch.ones(3), torch.ones(3)))
        return layer

    def grads(watched):
        layer = model()
        x = two_tensor.TwoTensor(torch.ones(2, 3), torch.ones(2, 3)).requires_grad_()
        with recheck.watch(raise_on_finding=False) if watched else contextlib.nullcontext() as watcher:
            out = checkpoint(lambda t: (layer(t) * layer.scale).relu().sum(), x, use_reentrant=False)
            if watched:  # pointer 0 is no buffer's and no parameter's: a saved activation is not taken for one
                forward = DISPATCHER.records[-1].forward
                assert 0 not in forward.buffer_pointers and 0 not in forward.parameter_pointers
            out.backward()
        return watcher, layer.weight.grad

    watcher, watched = grads(True)
    _, plain = grads(False)
    assert watcher.report.ok, str(watcher.report)
    assert torch.equal(watched.a, plain.a) and torch.equal(watched.b, plain.b)


def test_a_backward_after_the_block_ended_runs_as_plain_torch_with_the_saved_prints_torch_holds():
    from recheck.watcher.dispatch import DISPATCHER

    x = torch.randn(4, requires_grad=True)
    with recheck.watch(raise_on_finding=False) as watcher:
        out = checkpoint(lambda t: t.sin().exp(), x, use_reentrant=False)
        (record,) = DISPATCHER.records
    out.sum().backward()  # the record is closed: its recompute runs unbracketed, torch compares its prints
    assert torch.equal(x.grad, (x.sin().exp() * x.cos()).detach())
    assert record.closed and record.recomputes == 0 and watcher.report.ok


def test_a_record_whose_forward_returned_is_told_no_more_module_calls():
    from recheck.runtime.naming import RegionKey
    from recheck.runtime.reach import Reach
    from recheck.watcher.records import InvocationRecord

    record = InvocationRecord(RegionKey("r", None, None), 1, {}, entry="checkpoint", function=None)
    record.begin_forward(Reach())
    first, late = torch.nn.Linear(2, 2), torch.nn.ReLU()
    record.add_module(first)
    record.end_forward(None, False)
    record.add_module(late)  # its forward's containers are let go (read-only): nothing is written to them
    assert [module for _, module in record.forward.state_modules] == [first]
    assert not record.forward.ran


def test_findings_repeated_at_every_invocation_share_their_words():
    from recheck.watcher.dispatch import DISPATCHER

    block = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.BatchNorm1d(3))
    with recheck.watch(raise_on_finding=False) as watcher:
        for _ in range(3):
            checkpoint(block, torch.randn(4, 3), use_reentrant=False).sum().backward()
        drafts = [[d for d in record.findings if "running_mean" in d.subject] for record in DISPATCHER.records]
    assert [len(found) for found in drafts] == [1, 1, 1]
    first, *others = (found[0] for found in drafts)
    assert all(d.message is first.message and d.hint is first.hint for d in others)  # one object each
    assert first.hint and "RC106" in first.hint
    assert len(watcher.report.by_kind("buffer")) >= 3


def test_a_saved_print_has_every_slot_its_constructor_sets():
    from recheck.runtime.naming import RegionKey
    from recheck.runtime.reach import Reach
    from recheck.runtime.digests import print_tensor
    from recheck.watcher.records import LAZY, InvocationRecord, Recomputed, SavedPrint

    record = InvocationRecord(RegionKey("r", None, None), 1, {}, entry="checkpoint", function=None)
    record.begin_forward(Reach())
    tensor = torch.randn(2)
    at_forward = record.saved_print(tensor)
    made = SavedPrint(LAZY, None, record, 0, tensor)
    assert [getattr(at_forward, n) for n in SavedPrint.__slots__] == [getattr(made, n) for n in SavedPrint.__slots__]
    record.end_forward(None, False)
    # read in place: what planned_digest gave is kept, and a print is made only where a recompute differs
    assert at_forward.found is not None and at_forward.print is None and at_forward.tensor is None
    at_recompute = record.saved_print(tensor)
    assert type(at_recompute) is Recomputed and at_recompute[0] is tensor  # torch's default check: the tensor
    assert not (at_forward != at_recompute) and at_forward.print is None  # compared, equal: nothing printed
    assert not (at_recompute != at_forward) and at_recompute == at_forward  # either side of the comparison
    assert repr(at_recompute) == repr(at_forward) == repr({"shape": torch.Size([2]), "dtype": torch.float32,
                                                           "device": torch.device("cpu")})
    assert at_forward.forward_print() == print_tensor(tensor, "digest")
    differing = record.saved_print(tensor + 1)
    record._pass_saved = {}  # a second recompute pass
    # torch's own check (shape, dtype, device) passes; the bytes differ, and both prints are made
    assert not (at_forward != differing) and at_forward.print is not None
    assert at_forward != record.saved_print(torch.randn(3))  # other metadata: torch's check fails
    assert record._saved_diffs[0] == (at_forward.print, print_tensor(tensor + 1, "digest"))


def test_a_long_watch_keeps_little_per_invocation_once_its_graph_is_freed():
    """A block keeps its records until it ends; once torch frees an invocation's graph the record
    keeps its findings and counts, not what its forward read (the CPU generator's state is 5 KiB)."""
    import gc
    import tracemalloc

    torch.manual_seed(0)
    blocks = torch.nn.ModuleList(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.1)) for _ in range(4))

    def step():
        x = torch.randn(4, 8)
        for block in blocks:
            x = checkpoint(block, x, use_reentrant=False)
        x.sum().backward()

    with recheck.watch(raise_on_finding=False) as watcher:
        for _ in range(5):
            step()  # warm-up: the block's caches, the kept reaches and layouts
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            for _ in range(50):
                step()
            gc.collect()
            kept = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
    assert watcher.report.ok and watcher.report.stats["verified"] == 55 * 4
    assert kept / (50 * 4) < 1024, f"{kept / 200:.0f} bytes kept an invocation"  # 8.7 KB before (MLP)


class _Counted(nn.Module):
    """A BatchNorm below a module whose forward reads its statistics without calling it."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))

    def forward(self, x):
        return self.body(x).tanh()


def test_a_module_below_one_that_ran_is_not_told_again_and_its_state_is_still_compared(monkeypatch):
    from recheck.watcher import records

    heard: list[type] = []
    add_module = records.InvocationRecord.add_module
    monkeypatch.setattr(records.InvocationRecord, "add_module",
                        lambda self, module: (heard.append(type(module)), add_module(self, module))[1])
    model = _Counted()
    with recheck.watch(raise_on_finding=False) as w:
        checkpoint(model, torch.randn(3, 4, requires_grad=True), use_reentrant=False).sum().backward()
    assert heard == [_Counted]  # its Sequential, Linear and BatchNorm are in its scope already
    # the BatchNorm's statistics, updated again by the recompute, are still found
    assert any(f.kind == "buffer" and "body.1.running_mean" in f.subject for f in w.report), str(w.report)


def test_a_nested_regions_forward_hears_the_modules_its_outer_region_knows():
    inner_model = _Counted()

    def run(module, x):  # the module is an argument: only its call tells the record it ran
        return module(x)

    def outer(x):
        inner_model(x)  # the outer region runs the model first: its modules are known to the outer record
        return checkpoint(run, inner_model, x, use_reentrant=False)

    with recheck.watch(raise_on_finding=False) as w:
        checkpoint(outer, torch.randn(3, 4, requires_grad=True), use_reentrant=False).sum().backward()
    by_region = {(f.region or "").split(" ")[0] for f in w.report if "running_mean" in (f.subject or "")}
    # the nested call's record compared the BatchNorm its own forward ran, as the outer one did
    assert any("run" in region for region in by_region), str(w.report)
    assert any("outer" in region for region in by_region), str(w.report)


@pytest.mark.parametrize("failing", ["pipelining.acquire", "hold_cwd", "launched_place"])
def test_a_block_whose_start_fails_part_way_undoes_what_it_had_done(monkeypatch, failing):
    import logging

    from recheck.intercept import patches
    from recheck.watcher import dispatch

    checkpoint_before = torch.utils.checkpoint.checkpoint
    code_before = checkpoint_before.__code__  # (patched in place where it is imported by name)
    logger_before = dict(logging.Logger.__dict__)

    def fails(*args, **kwargs):
        raise RuntimeError("cannot start")

    owner, _, name = failing.rpartition(".")
    monkeypatch.setattr(getattr(dispatch, owner) if owner else dispatch, name, fails)
    with pytest.raises(RuntimeError, match="cannot start"):
        with recheck.watch():
            pass
    monkeypatch.undo()
    # every original object is back: checkpoint, the module call, logging
    assert torch.utils.checkpoint.checkpoint is checkpoint_before and checkpoint_before.__code__ is code_before
    assert patches.installed() is None
    assert nn.Module.__dict__["_call_impl"] is _CALL_IMPL
    assert dict(logging.Logger.__dict__) == logger_before
    # and the next block starts and ends as ever
    with recheck.watch() as w:
        checkpoint(nn.Linear(4, 4), torch.randn(2, 4, requires_grad=True), use_reentrant=False).sum().backward()
    assert w.report.ok and w.report.stats["verified"] == 1
    assert torch.utils.checkpoint.checkpoint is checkpoint_before
