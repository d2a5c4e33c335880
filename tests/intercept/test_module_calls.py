"""intercept/module_calls.py: every module call is told, at one frame, and torch is left as found."""

from __future__ import annotations

import threading

import pytest
import torch
from torch import nn
from torch.nn.modules import module as torch_module

from recheck.intercept import module_calls

_CALL_IMPL = nn.Module.__dict__["_call_impl"]


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 4), nn.Sequential(nn.ReLU(), nn.Linear(4, 2)))


def test_every_module_call_is_told_before_it_runs_in_call_order_and_torch_is_put_back():
    model, told = _model(), []
    stop = module_calls.listen(told.append)
    try:
        assert module_calls.listening() and nn.Module.__dict__["_call_impl"] is not _CALL_IMPL
        assert not torch_module._global_forward_pre_hooks  # no hook: torch's fast path stays
        out = model(torch.randn(3, 4))
    finally:
        stop()
    assert told == [model, model[0], model[1], model[1][0], model[1][1]]
    assert out.shape == (3, 2)
    assert nn.Module.__dict__["_call_impl"] is _CALL_IMPL and not module_calls.listening()
    stop()  # a second call does nothing
    model(torch.randn(3, 4))
    assert len(told) == 5


def test_the_module_still_runs_its_own_hooks_and_raises_its_own_errors():
    model, told, hooked = _model(), [], []
    model[0].register_forward_pre_hook(lambda module, args: hooked.append("pre"))
    model[0].register_forward_hook(lambda module, args, out: hooked.append("post"))
    stop = module_calls.listen(told.append)
    try:
        model(torch.randn(2, 4))
        with pytest.raises(RuntimeError):
            model(torch.randn(2, 5))  # a shape error from the first Linear
    finally:
        stop()
    assert hooked == ["pre", "post", "pre"] and told[:5] == [model, model[0], model[1], model[1][0], model[1][1]]
    assert nn.Module.__dict__["_call_impl"] is _CALL_IMPL


def test_nested_listens_share_one_patch_and_the_last_stop_removes_it():
    told = []
    first = module_calls.listen(told.append)
    second = module_calls.listen(told.append)
    patched = nn.Module.__dict__["_call_impl"]
    first()
    assert nn.Module.__dict__["_call_impl"] is patched
    nn.ReLU()(torch.ones(1))
    second()
    assert nn.Module.__dict__["_call_impl"] is _CALL_IMPL and len(told) == 1


def test_a_patch_put_over_ours_stays_and_ours_below_it_passes_calls_on_untold():
    told, theirs_seen = [], []

    def theirs(self, *args, **kwargs):
        theirs_seen.append(self)
        return below(self, *args, **kwargs)

    stop = module_calls.listen(told.append)
    below = nn.Module.__dict__["_call_impl"]
    nn.Module._call_impl = theirs
    try:
        stop()
        assert nn.Module.__dict__["_call_impl"] is theirs  # theirs is not taken away
        relu = nn.ReLU()
        relu(torch.ones(1))
        assert theirs_seen == [relu] and told == []
        again = module_calls.listen(told.append)  # a new patch above theirs; the old one stays silent
        relu(torch.ones(1))
        again()
        assert told == [relu] and nn.Module.__dict__["_call_impl"] is theirs
    finally:
        nn.Module._call_impl = _CALL_IMPL


def test_a_torch_whose_call_is_not_wrapped_call_impl_is_heard_through_the_global_hook(monkeypatch):
    def plain_call(self, *args, **kwargs):
        return self._call_impl(*args, **kwargs)

    monkeypatch.setattr(nn.Module, "__call__", plain_call)
    told = []
    stop = module_calls.listen(told.append)
    try:
        assert nn.Module.__dict__["_call_impl"] is _CALL_IMPL and len(torch_module._global_forward_pre_hooks) == 1
        relu = nn.ReLU()
        relu(torch.ones(1))
    finally:
        stop()
    assert told == [relu] and not torch_module._global_forward_pre_hooks


def test_calls_from_other_threads_are_told_too():
    told, relu = [], nn.ReLU()
    stop = module_calls.listen(told.append)
    try:
        worker = threading.Thread(target=lambda: relu(torch.ones(1)))
        worker.start()
        worker.join()
    finally:
        stop()
    assert told == [relu]


def test_a_held_patch_stays_silent_between_listens_and_goes_with_the_last_hold():
    told, relu = [], nn.ReLU()
    let_go = module_calls.hold()
    try:
        patched = nn.Module.__dict__["_call_impl"]
        assert patched is not _CALL_IMPL and not module_calls.listening()
        relu(torch.ones(1))
        for _ in range(2):  # listening sets the listener only: the class is left alone
            stop = module_calls.listen(told.append)
            assert nn.Module.__dict__["_call_impl"] is patched
            relu(torch.ones(1))
            stop()
            assert nn.Module.__dict__["_call_impl"] is patched
        relu(torch.ones(1))
    finally:
        let_go()
        let_go()  # once only
    assert told == [relu, relu] and nn.Module.__dict__["_call_impl"] is _CALL_IMPL


def test_a_call_replaced_while_the_patch_is_held_is_heard_through_the_global_hook(monkeypatch):
    """A listen finds the held patch in place only while ``Module.__call__`` still calls it."""
    told, relu = [], nn.ReLU()
    let_go = module_calls.hold()
    try:
        def plain_call(self, *args, **kwargs):
            return self.forward(*args, **kwargs)  # passes ``_call_impl`` by

        monkeypatch.setattr(nn.Module, "__call__", plain_call)
        stop = module_calls.listen(told.append)
        try:
            assert len(torch_module._global_forward_pre_hooks) == 1
        finally:
            stop()
        monkeypatch.undo()
        stop = module_calls.listen(told.append)  # the patch in place again: no hook
        try:
            assert not torch_module._global_forward_pre_hooks
            relu(torch.ones(1))
        finally:
            stop()
    finally:
        let_go()
    assert told == [relu] and nn.Module.__dict__["_call_impl"] is _CALL_IMPL


def test_calls_of_modules_passed_over_are_not_told_and_the_ids_are_read_as_they_grow():
    model, told = _model(), []
    known: dict[int, None] = {id(model[1][0]): None}
    stop = module_calls.listen(told.append)
    try:
        module_calls.pass_over(known)
        model(torch.randn(3, 4))
        assert told == [model, model[0], model[1], model[1][1]]  # the ReLU passed over
        known[id(model)] = None  # added to as the owner learns
        model(torch.randn(3, 4))
        assert told[4:] == [model[0], model[1], model[1][1]]
        module_calls.pass_over(None)  # every call told again
        model(torch.randn(3, 4))
        assert told[7:] == [model, model[0], model[1], model[1][0], model[1][1]]
        module_calls.pass_over(known)
    finally:
        stop()
    # the last listener gone, nothing is passed over any more: a new listener hears every call
    told.clear()
    stop = module_calls.listen(told.append)
    try:
        model(torch.randn(3, 4))
    finally:
        stop()
    assert told == [model, model[0], model[1], model[1][0], model[1][1]]
