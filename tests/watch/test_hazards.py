"""Planted hazards inside real training steps are reported with the right kind; clean runs stay clean."""

from __future__ import annotations

import random

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import recheck

SCALE = 1.0
VARIANTS = pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])


class Block(nn.Module):
    def __init__(self, width: int = 8, dropout: float = 0.0, norm: bool = False) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(width, width), nn.Linear(width, width)
        self.drop = nn.Dropout(dropout)
        self.norm = nn.BatchNorm1d(width) if norm else nn.Identity()

    def forward(self, x):
        return self.fc2(self.drop(torch.relu(self.norm(self.fc1(x)))))


class Net(nn.Module):
    def __init__(self, reentrant: bool, **block_options) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(**block_options) for _ in range(2))
        self.reentrant = reentrant

    def forward(self, x):
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=self.reentrant)
        return x


def inputs() -> torch.Tensor:
    return torch.randn(4, 8, requires_grad=True)


def scaled(x):
    return torch.tanh(x * SCALE) * 2


@VARIANTS
def test_clean_mlp_with_dropout_has_no_finding(reentrant):
    torch.manual_seed(0)
    net = Net(reentrant, dropout=0.3)
    with recheck.watch() as w:
        for _ in range(2):
            net(inputs()).sum().backward()
    assert w.report.ok, str(w.report)
    assert w.report.stats["verified"] == 4
    assert w.report.stats["regions"] == 1


@VARIANTS
def test_global_flipped_between_forward_and_backward(reentrant):
    global SCALE
    x = inputs()
    with recheck.watch(raise_on_finding=False) as w:
        y = checkpoint(scaled, x, use_reentrant=reentrant)
        SCALE = 3.0
        try:
            y.sum().backward()
        finally:
            SCALE = 1.0
    assert {"global", "recompute"} <= w.report.kinds, str(w.report)
    (finding,) = w.report.by_kind("global")
    assert finding.subject == f"global `{__name__}.SCALE`"
    assert "1.0 at forward and 3.0 at recompute" in finding.message
    assert finding.hint and "RC101" in finding.hint


@VARIANTS
def test_optimizer_step_before_a_microbatch_backward(reentrant):
    torch.manual_seed(0)
    net = Net(reentrant)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    with recheck.watch(raise_on_finding=False) as w:
        first = net(inputs()).sum()
        second = net(inputs()).sum()
        first.backward()
        optimizer.step()  # lands before the second microbatch's backward
        second.backward()
    versions = w.report.by_kind("param_version")
    assert versions, str(w.report)
    assert [f.invocation.index for f in versions] == [3, 4]  # the second microbatch's two calls: one finding each
    for finding, block in zip(versions, net.blocks):
        # each names every parameter of its block, with its version at forward and at recompute
        listed = ", ".join(f"`{name}` (version {p._version - 1} at forward, {p._version} at recompute)"
                           for name, p in block.named_parameters())
        assert finding.message == f"parameters modified in place between forward and recompute: {listed}"
        assert finding.subject == "parameters `fc1.weight`, `fc1.bias`, `fc2.weight`, `fc2.bias`"
        assert "RC201" in finding.hint


def test_param_version_lists_at_most_four_parameters_in_its_one_line_message():
    torch.manual_seed(0)
    wide = nn.Sequential(*(nn.Linear(8, 8) for _ in range(3)))
    single = nn.Linear(8, 8, bias=False)
    optimizer = torch.optim.SGD([*wide.parameters(), *single.parameters()], lr=0.1)
    for parameter in optimizer.param_groups[0]["params"]:
        parameter.grad = torch.ones_like(parameter)
    with recheck.watch(raise_on_finding=False) as w:
        outputs = [checkpoint(wide, inputs(), use_reentrant=False), checkpoint(single, inputs(), use_reentrant=False)]
        optimizer.step()
        sum(o.sum() for o in outputs).backward()
    many, one = w.report.by_kind("param_version")
    assert many.message.endswith(" and 2 more") and "\n" not in many.message
    assert many.message.count(" at recompute)") == 4
    assert [line for line in many.detail.splitlines() if line.startswith("`")] == [
        f"`{name}` (version 1 at forward, 2 at recompute)" for name, _ in wide.named_parameters()]
    assert one.message == ("parameter modified in place between forward and recompute: "
                           "`weight` (version 1 at forward, 2 at recompute)")
    assert one.subject == "parameter `weight`"


@VARIANTS
def test_batchnorm_in_train_mode_is_reported_as_buffer(reentrant):
    torch.manual_seed(0)
    net = Net(reentrant, norm=True)
    with recheck.watch(raise_on_finding=False) as w:
        net(inputs()).sum().backward()
    buffers = w.report.by_kind("buffer")
    assert buffers, str(w.report)
    assert any("BatchNorm statistics `norm.running_mean` updated again by the recompute" in f.message
               for f in buffers)
    assert w.report.kinds == {"buffer"}


def test_batchnorm_in_eval_mode_is_clean():
    net = Net(False, norm=True).eval()
    with recheck.watch() as w:
        net(inputs()).sum().backward()
    assert w.report.ok


@VARIANTS
def test_python_random_in_region_is_an_rng_finding(reentrant):
    def noisy(x):
        return (x * random.random()).sin()

    with recheck.watch(raise_on_finding=False) as w:
        checkpoint(noisy, inputs(), use_reentrant=reentrant).sum().backward()
    assert "rng" in w.report.kinds, str(w.report)
    assert w.report.by_kind("rng")[0].subject == "Python random"


def test_dropout_without_preserved_rng_state():
    drop = nn.Dropout(0.5)

    def region(x):
        return drop(x).exp()

    with recheck.watch(raise_on_finding=False) as w:
        checkpoint(region, inputs(), use_reentrant=False, preserve_rng_state=False).sum().backward()
    assert {"rng", "recompute"} <= w.report.kinds, str(w.report)


def test_the_saved_tensors_that_differ_are_counted_against_those_one_recompute_compared():
    """The input ``sin`` saves is recomputed equal; dropout's noise and ``exp``'s output are
    not.  Two backwards through one graph (two recomputes) compare the same three tensors."""
    drop = nn.Dropout(0.5)

    def region(x):
        return drop(x.sin()).exp()

    with recheck.watch(raise_on_finding=False) as w:
        out = checkpoint(region, inputs(), use_reentrant=False, preserve_rng_state=False).sum()
        out.backward(retain_graph=True)
        out.backward()
    (finding,) = [f for f in w.report.by_kind("recompute") if f.subject == "saved tensors"]
    assert finding.message == "2 of 3 tensors saved for backward differ when recomputed", str(w.report)
    assert finding.detail.startswith("saved tensor #1: ") and finding.detail.endswith("also differ: saved tensor #2")


def test_a_tensor_saved_by_two_operations_is_compared_at_each_place():
    """``y * y`` saves ``y`` twice (one tensor, printed once per forward and per recompute):
    a recompute that draws other noise differs at both places, and the input ``sin`` saves
    does not."""

    def region(x):
        y = x.sin() + torch.rand_like(x)
        return y * y

    with recheck.watch(raise_on_finding=False) as w:
        checkpoint(region, inputs(), use_reentrant=False, preserve_rng_state=False).sum().backward()
    (finding,) = [f for f in w.report.by_kind("recompute") if f.subject == "saved tensors"]
    assert finding.message == "2 of 3 tensors saved for backward differ when recomputed", str(w.report)
    with recheck.watch() as w:  # preserved: equal at every place, no finding
        checkpoint(region, inputs(), use_reentrant=False).sum().backward()
    assert not w.report.findings


class Counter(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        self.calls += 1
        return self.fc(x).sin()


@VARIANTS
def test_attribute_counter_is_a_state_finding(reentrant):
    counter = Counter()
    with recheck.watch(raise_on_finding=False) as w:
        checkpoint(counter, inputs(), use_reentrant=reentrant).sum().backward()
    (finding,) = w.report.by_kind("state")
    assert "attribute `self.calls` updated again by the recompute: 1 -> 2" in finding.message
    assert finding.subject == "attribute `self.calls`" and finding.code == "RC104"


def test_print_in_region_is_a_side_effect(capsys):
    def chatty(x):
        y = x.sin()
        print("inside the region")
        return y.cos()

    with recheck.watch(raise_on_finding=False) as w:
        checkpoint(chatty, inputs(), use_reentrant=True).sum().backward()
    assert "side_effect" in w.report.kinds
    assert capsys.readouterr().out.count("inside the region") == 2  # the user still sees both


@pytest.mark.parametrize("reentrant", [False, True])
def test_what_a_module_emits_while_a_recompute_imports_it_is_the_import_s(tmp_path, monkeypatch, capsys, reentrant):
    # torch imports parts of itself lazily, so the first import (and its log lines) can fall in
    # a recompute; that happens once per process and is not the region's, so not a finding
    name = f"lazily_imported_{int(reentrant)}"
    (tmp_path / f"{name}.py").write_text(
        "import logging, warnings\n"
        "print('loaded once')\n"
        "logging.getLogger('lazily').warning('compile_threads set to 2')\n"
        "warnings.warn('imported late')\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    def region(x):
        if torch._C._current_graph_task_id() != -1:  # only in backward, that is in the recompute
            __import__(name)
        y = x.sin()
        if torch._C._current_graph_task_id() != -1:
            print("inside the recompute")  # the region's own output stays a finding
        return y.cos()

    with pytest.warns(UserWarning, match="imported late"):
        with recheck.watch(raise_on_finding=False, early_stop=False) as w:
            checkpoint(region, inputs(), use_reentrant=reentrant).sum().backward()
    (finding,) = w.report.by_kind("side_effect")
    shown = str(w.report)
    assert "inside the recompute" in shown and "compile_threads" not in shown and "imported late" not in shown
    assert "loaded once" in capsys.readouterr().out  # the import's output reaches the stream as it was


@pytest.mark.parametrize("reentrant", [False, True])
def test_a_warning_the_filters_show_once_is_shown_once_and_is_no_finding(reentrant, capsys):
    # Python shows a warning once per location and text (the default filter): the recompute's is
    # not shown, so it repeats nothing; under watch() the user sees what they see without it
    import warnings

    def deprecated(x):
        warnings.warn(f"old_api is deprecated ({reentrant})", FutureWarning)
        return x.sin().cos()

    with warnings.catch_warnings():
        warnings.simplefilter("default")
        warnings.showwarning = lambda message, category, *rest, **more: print(f"shown: {message}")
        with recheck.watch(raise_on_finding=False) as w:
            checkpoint(deprecated, inputs(), use_reentrant=reentrant).sum().backward()
    assert w.report.ok, str(w.report)
    assert capsys.readouterr().out.count("shown: old_api is deprecated") == 1


@pytest.mark.parametrize("reentrant", [False, True])
def test_a_warning_the_filters_show_every_time_is_a_repeated_side_effect(reentrant, capsys):
    import warnings

    def loud(x):
        warnings.warn("shown at every call", UserWarning)
        return x.sin().cos()

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = lambda message, category, *rest, **more: print(f"shown: {message}")
        with recheck.watch(raise_on_finding=False) as w:
            checkpoint(loud, inputs(), use_reentrant=reentrant).sum().backward()
    assert any("warning" in finding.message for finding in w.report.by_kind("side_effect")), str(w.report)
    assert capsys.readouterr().out.count("shown: shown at every call") == 2  # forward and recompute, as without recheck


@pytest.mark.parametrize("reentrant", [False, True])
def test_a_log_call_its_logger_drops_repeats_nothing_and_one_it_emits_does(reentrant):
    # a framework's DEBUG records (FSDP's "pre_forward") make no record at the default level: the
    # recompute's call emits nothing, at forward as at recompute
    import logging

    logger = logging.getLogger("recheck-test-framework")

    def traced(x):
        logger.debug("pre_forward %s", tuple(x.shape))
        return x.sin().cos()

    logger.setLevel(logging.INFO)
    try:
        with recheck.watch(raise_on_finding=False) as quiet:
            checkpoint(traced, inputs(), use_reentrant=reentrant).sum().backward()
        logger.setLevel(logging.DEBUG)
        logger.addHandler(logging.NullHandler())
        with recheck.watch(raise_on_finding=False) as loud:
            checkpoint(traced, inputs(), use_reentrant=reentrant).sum().backward()
    finally:
        logger.setLevel(logging.NOTSET)
        logger.handlers.clear()
    assert quiet.report.ok, str(quiet.report)
    assert loud.report.kinds == {"side_effect"}, str(loud.report)


def test_early_stop_off_replays_fully_and_marks_latent_findings():
    def late_print(x):
        y = x.sin().exp()
        print("after the last saved tensor")
        return y

    for strict in (False, True):
        with recheck.watch(raise_on_finding=False, early_stop=False if strict else None) as w:
            checkpoint(late_print, inputs(), use_reentrant=False).sum().backward()
        if strict:
            (finding,) = w.report.by_kind("side_effect")
            assert finding.latent
            assert any("early_stop=False" in note for note in w.report.notes)
        else:
            assert w.report.ok, str(w.report)  # early stop: the print never runs again


def test_a_set_checkpoint_early_stop_block_is_what_the_calls_say_unless_the_watch_forces_it():
    from torch.utils.checkpoint import set_checkpoint_early_stop

    def late_print(x):
        y = x.sin().exp()
        print("after the last saved tensor")
        return y

    with set_checkpoint_early_stop(False):  # the user's block: every recompute runs to the end
        with recheck.watch(raise_on_finding=False) as w:
            checkpoint(late_print, inputs(), use_reentrant=False, early_stop=True).sum().backward()
        (finding,) = w.report.by_kind("side_effect")
        assert not finding.latent
        with recheck.watch(raise_on_finding=False, early_stop=True) as w:  # the watch's own beats it
            checkpoint(late_print, inputs(), use_reentrant=False).sum().backward()
        assert w.report.ok, str(w.report)
    with set_checkpoint_early_stop(True):
        with recheck.watch(raise_on_finding=False, early_stop=False) as w:
            checkpoint(late_print, inputs(), use_reentrant=False).sum().backward()
        (finding,) = w.report.by_kind("side_effect")
        assert finding.latent


def test_store_copy_reports_the_first_difference():
    global SCALE
    with recheck.watch(raise_on_finding=False, store="copy") as w:
        y = checkpoint(scaled, inputs(), use_reentrant=False)
        SCALE = 2.0
        try:
            y.sum().backward()
        finally:
            SCALE = 1.0
    (finding,) = w.report.by_kind("recompute")
    assert "first difference at index" in finding.detail
    assert "elements differ bitwise" in finding.detail


def test_tags_label_invocations_and_raise_at_exit():
    global SCALE
    with pytest.raises(recheck.RecomputeMismatch) as raised:
        with recheck.watch() as w:
            for microbatch in range(2):
                with recheck.tag(stage=1, microbatch=microbatch):
                    y = checkpoint(scaled, inputs(), use_reentrant=False)
                SCALE = 1.0 + microbatch
                try:
                    y.sum().backward()
                finally:
                    SCALE = 1.0
    report = raised.value.report
    assert report is w.report
    (finding,) = report.by_kind("global")
    assert dict(finding.invocation.tags) == {"stage": 1, "microbatch": 1}
    assert (finding.invocation.index, finding.invocation.of) == (2, 2)
    assert "call 2 of 2 (stage=1, microbatch=1)" in str(report)


def test_tag_nesting_merges_and_validates():
    with recheck.tag(stage=1):
        with recheck.tag(microbatch=2) as labels:
            assert dict(labels) == {"stage": 1, "microbatch": 2}
    with pytest.raises(TypeError, match="identifiers"):
        with recheck.tag(**{"not a name": 1}):
            pass


def test_invalid_options_are_clear_errors():
    with pytest.raises(ValueError, match="store must be one of"):
        recheck.watch(store="full")
    with pytest.raises(TypeError, match="early_stop"):
        recheck.watch(early_stop="yes")
    with pytest.raises(TypeError, match="strict"):
        recheck.watch(strict="yes")
    with pytest.raises(ValueError, match="atol was given without rtol"):
        recheck.watch(atol=1e-3)
    with pytest.raises(ValueError, match="store='copy'"):
        recheck.watch(atol=1e-3, rtol=0, store="digest")


def test_report_round_trips_through_json():
    global SCALE
    with recheck.watch(raise_on_finding=False) as w:
        with recheck.tag(microbatch=0):
            y = checkpoint(scaled, inputs(), use_reentrant=True)
        SCALE = 5.0
        try:
            y.sum().backward()
        finally:
            SCALE = 1.0
    again = recheck.Report.from_json(w.report.to_json())
    assert [f.kind for f in again] == [f.kind for f in w.report]
    assert again.stats == w.report.stats


def _rrelu_step(x: torch.Tensor) -> None:
    linear, act = nn.Linear(16, 16), nn.RReLU()
    checkpoint(lambda t: act(linear(t)), x, use_reentrant=False).sum().backward()


def test_rrelu_noise_filled_after_saving_is_clean_under_a_full_replay():
    # RReLU saves its noise buffer, then draws into it: a print taken when the tensor is
    # saved reads uninitialized bytes (a false `recompute` in 20 of 20 runs before the
    # forward's prints were deferred to the end of its forward).
    for _ in range(5):
        torch.manual_seed(0)
        with recheck.watch(early_stop=False, raise_on_finding=False) as w:
            _rrelu_step(torch.randn(32, 16, requires_grad=True))
        assert w.report.ok, str(w.report)
        assert w.report.stats["verified"] == 1


def test_rrelu_under_early_stop_is_reported_by_watch():
    # With early stop the recompute ends once the noise is saved, before it is filled
    # (pytorch#193671): backward uses noise the forward never drew -- unless the allocator
    # hands the recompute the forward's freed block, so it must show in one of 5 runs.
    reports = []
    for _ in range(5):
        torch.manual_seed(0)
        with recheck.watch(raise_on_finding=False) as w:
            _rrelu_step(torch.randn(32, 16, requires_grad=True))
        reports.append(w.report)
        if "recompute" in w.report.kinds:
            break
    assert "recompute" in reports[-1].kinds, str(reports[-1])


def test_strict_is_the_old_name_of_early_stop_false():
    with pytest.warns(DeprecationWarning, match="strict= is now early_stop=False"):
        w = recheck.watch(strict=True)
    assert w.options.early_stop is False and w.strict


def test_a_tolerance_lets_a_tolerated_difference_pass_and_keeps_integer_state_exact():
    global SCALE

    def scaled_by_global(x):
        return torch.tanh(x * SCALE) * 2

    SCALE = 1.0
    with recheck.watch(raise_on_finding=False, atol=1.0, rtol=1.0) as w:
        assert w.options.store == "copy"
        y = checkpoint(scaled_by_global, inputs(), use_reentrant=False)
        SCALE = 1.0 + 1e-6
        try:
            y.sum().backward()
        finally:
            SCALE = 1.0
    assert w.report.kinds == {"global"}, str(w.report)  # the value read is still a change


def test_a_full_replay_marks_latent_only_what_happens_after_the_last_saved_tensor():
    class Counted(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.before = 0
            self.after = 0

        def forward(self, x):
            self.before += 1          # runs again with early stop too: not latent
            y = x.sin().exp()
            self.after += 1           # past the last saved tensor: only a full replay reruns it
            print("after the last saved tensor")
            return y

    model = Counted()
    with recheck.watch(raise_on_finding=False, early_stop=False) as w:
        checkpoint(model, inputs(), use_reentrant=False).sum().backward()
    latent = {f.subject: f.latent for f in w.report}
    assert latent == {"attribute `self.before`": False, "attribute `self.after`": True, "stdout": True}, str(w.report)
    # and with the call's own early stop, exactly the non-latent one happens
    model = Counted()
    with recheck.watch(raise_on_finding=False) as w:
        checkpoint(model, inputs(), use_reentrant=False).sum().backward()
    assert {f.subject for f in w.report} == {"attribute `self.before`"}, str(w.report)


def test_a_recompute_that_raises_is_a_finding_naming_the_region_and_the_error():
    class Flaky(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(8, 8)
            self.runs = 0

        def forward(self, x):
            self.runs += 1
            if self.runs > 1:
                raise RuntimeError("weight cache was cleared")  # as autocast's cache under SAC
            return torch.tanh(self.fc(x))

    model = Flaky()
    with recheck.watch(raise_on_finding=False) as w:
        with pytest.raises(RuntimeError, match="weight cache was cleared"):
            checkpoint(model, inputs(), use_reentrant=False).sum().backward()
    (finding,) = [f for f in w.report.by_kind("recompute") if f.subject == "recompute"]
    assert finding.message == "the region raised during recompute: RuntimeError: weight cache was cleared"
    assert "Flaky.forward" in finding.region
    assert not any("never recomputed" in note for note in w.report.notes), w.report.notes


def test_a_recompute_that_saves_fewer_tensors_than_its_forward_is_a_finding():
    # under early stop the forward's outputs are not printed (no recompute returns them);
    # a recompute that returns all the same saved fewer tensors, and says so
    calls = [0]

    def region(x):
        calls[0] += 1
        y = x.sin()
        if calls[0] == 1:
            y = y.cos()  # one more saved tensor in the forward only
        return y * 2

    x = torch.randn(4, requires_grad=True)
    watcher = recheck.watch(raise_on_finding=False)
    with pytest.raises(torch.utils.checkpoint.CheckpointError), watcher:
        checkpoint(region, x, use_reentrant=False).sum().backward()
    found = [f for f in watcher.report if f.kind == "recompute"]
    assert [f.subject for f in found] == ["saved tensors"]
    assert "fewer than the 2 tensors its forward saved" in found[0].message


class _Registry:
    """A table of functions kept in a global, in the style of transformers' ``ALL_ATTENTION_FUNCTIONS``."""

    def __init__(self) -> None:
        self.local = {}

    def get(self, name):
        return self.local.get(name, torch.tanh)


REGISTRY = _Registry()


def registered(x):
    return REGISTRY.get("act")(x) * 2


def test_a_global_object_changed_inside_names_the_attribute_that_changed():
    x = inputs()
    with recheck.watch(raise_on_finding=False) as w:
        y = checkpoint(registered, x, use_reentrant=False)
        REGISTRY.local["act"] = torch.sigmoid
        try:
            y.sum().backward()
        finally:
            REGISTRY.local.clear()
    (finding,) = w.report.by_kind("global")
    assert finding.subject == f"global `{__name__}.REGISTRY`"
    # the object is the same one, so its repr is too: the message shows what changed inside it
    # and names the first element that differs inside it, with its value then (a key it did not hold)
    assert finding.message.startswith(f"global `{__name__}.REGISTRY` was _Registry with .local['act'] = <absent> "
                                      "at forward and .local['act'] = <built-in method s"), str(w.report)


class _Settings:
    """A plain object a layer holds, in the style of a config: numbers, a tensor, lists and dicts."""

    def __init__(self) -> None:
        self.scale, self.steps, self.table = 0.5, [1, 2], {"mode": "fast", "sizes": (4, 8)}
        self.offset = torch.zeros(2)


class _Configured(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc, self.settings = nn.Linear(8, 8), _Settings()

    def forward(self, x):
        s = self.settings
        return self.fc(x) * s.scale * len(s.steps) + s.offset.sum() + (s.table["mode"] == "fast")


@pytest.mark.parametrize("change, then, now", [
    (lambda s: s.table.__setitem__("mode", "slow"), ".table['mode'] = 'fast'", ".table['mode'] = 'slow'"),
    (lambda s: s.steps.append(3), ".steps[2] = <absent>", ".steps[2] = 3"),
    (lambda s: setattr(s, "scale", -0.0), ".scale = 0.5", ".scale = -0.0"),
    (lambda s: s.offset.add_(1), ".offset = float32[2] (version 0)", ".offset = float32[2] (version 1)"),
    (lambda s: s.table.__setitem__("sizes", (4, 16)), ".table['sizes'] = <another object>", ".table['sizes'] = (4, 16)"),
])
def test_an_attribute_changed_inside_shows_its_first_differing_element_then_and_now(change, then, now):
    layer, x = _Configured(), inputs()
    with recheck.watch(raise_on_finding=False) as w:
        y = checkpoint(layer, x, use_reentrant=False)
        change(layer.settings)
        y.sum().backward()
    (finding,) = [f for f in w.report if "settings" in f.subject]
    assert f"_Settings with {then} -> {now}" in finding.message, str(w.report)


class _Tabled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc, self.table = nn.Linear(8, 8), _Registry()

    def forward(self, x):
        return self.table.get("act")(self.fc(x))


def test_module_state_changed_between_forward_and_recompute_is_put_down_to_the_read_not_a_write():
    block = _Tabled()
    with recheck.watch(raise_on_finding=False) as w:
        y = checkpoint(block, inputs(), use_reentrant=False)
        block.table.local["act"] = torch.sigmoid  # by the training loop, outside the region
        y.sum().backward()
    (finding,) = w.report.by_kind("state")
    assert "changed between forward and recompute" in finding.message
    # the region reads state that changed under it (RC101), it does not write it (RC104)
    assert finding.code == "RC101" and "RC104" not in (finding.hint or ""), str(w.report)


class _LazyConfig:
    """A config in the style of omegaconf's ``DictConfig``: its first read of a field fills an
    internal memo (``_flags_cache``) that every later read reuses."""

    def __init__(self, **fields) -> None:
        self._fields, self._flags_cache = dict(fields), None

    def __getattr__(self, name):
        fields = object.__getattribute__(self, "_fields")
        if name not in fields:
            raise AttributeError(name)
        if object.__getattribute__(self, "_flags_cache") is None:
            self._flags_cache = {"struct": None}
        return fields[name]


LAZY = _LazyConfig(scale=2.0)


class _Tally:
    def __init__(self) -> None:
        self.calls = 0


TALLY = _Tally()


def _reads_lazy_config(x):
    return torch.tanh(x) * LAZY.scale


def _counts_its_calls(x):
    TALLY.calls += 1  # a counter bumped again by every recompute
    return torch.tanh(x) * TALLY.calls


def test_a_memo_the_forward_fills_behind_a_global_is_no_finding():
    # the forward's first read fills the memo; the recompute starts from it, leaves it so and
    # computes the same: a write that changes nothing (it was "global `LAZY` was ... at forward")
    LAZY._flags_cache = None
    with recheck.watch(raise_on_finding=False) as w:
        checkpoint(_reads_lazy_config, inputs(), use_reentrant=False).sum().backward()
    assert LAZY._flags_cache is not None and not w.report, str(w.report)


def test_a_counter_the_forward_bumps_behind_a_global_is_still_found():
    # bumped by the forward, then again by the recompute: a repeated side effect, whatever the
    # saved tensors say (tanh saves its output before the scale is applied)
    TALLY.calls = 0
    with recheck.watch(raise_on_finding=False) as w:
        checkpoint(_counts_its_calls, inputs(), use_reentrant=False).sum().backward()
    (finding,) = w.report.by_kind("global")
    assert finding.subject.endswith(".TALLY`") and "RC101" in finding.hint
    assert ".calls = 0 at forward and .calls = 1 at recompute" in finding.message, str(w.report)


class _CountingScale:
    """A callable helper a layer holds (not a module): it counts its calls."""

    def __init__(self) -> None:
        self.calls, self.factor = 0, 2.0

    def __call__(self, x):
        self.calls += 1
        return x * self.factor


class _ScaledFirst(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale, self.fc = _CountingScale(), nn.Linear(8, 8)

    def forward(self, x):
        return self.fc(self.scale(x))


def test_a_callable_object_bumped_again_by_the_recompute_is_found_by_watch_and_check():
    # a callable object of the project's class is state, not code: its counter, bumped again by
    # the recompute (its values alike), was printed by identity and never compared
    layer, x = _ScaledFirst(), inputs()
    with recheck.watch(raise_on_finding=False) as w:
        checkpoint(layer, x, use_reentrant=False).sum().backward()
    assert layer.scale.calls == 2
    (finding,) = w.report.by_kind("state")
    assert finding.code == "RC104" and "_CountingScale with .calls = 1 -> .calls = 2" in finding.message, str(w.report)
    report = recheck.check(layer, x)
    assert report.by_kind("state") and layer.scale.calls == 2, str(report)  # found, and put back
