"""intercept/module_calls.py: every module call is told while someone listens, and torch is left as found."""

from __future__ import annotations

import threading

import pytest
import torch
from torch import nn
from torch.nn.modules import module as torch_module

from recheck.intercept import module_calls

_CALL_IMPL = nn.Module.__dict__["_call_impl"]


def _hooks() -> int:
    return len(torch_module._global_forward_pre_hooks)


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 4), nn.Sequential(nn.ReLU(), nn.Linear(4, 2)))


def test_every_module_call_is_told_before_it_runs_in_call_order_and_torch_is_put_back():
    model, told = _model(), []
    stop = module_calls.listen(told.append)
    try:
        assert module_calls.listening() and _hooks() == 1
        out = model(torch.randn(3, 4))
    finally:
        stop()
    assert told == [model, model[0], model[1], model[1][0], model[1][1]]
    assert out.shape == (3, 2)
    assert _hooks() == 0 and nn.Module.__dict__["_call_impl"] is _CALL_IMPL and not module_calls.listening()
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


def test_nested_listens_share_one_hook_and_the_last_stop_removes_it():
    told = []
    first = module_calls.listen(told.append)
    second = module_calls.listen(told.append)
    first()
    assert _hooks() == 1
    nn.ReLU()(torch.ones(1))
    second()
    assert _hooks() == 0 and len(told) == 1


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
