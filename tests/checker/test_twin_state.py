"""``check_step`` puts back the Python state a step reaches, and compares plain objects by state.

Each case is a pattern of real training code: a data list the step pops a batch from, an
iterator it advances, a metrics object that appends to a list and divides by its length, and a
pipeline schedule object held in a global (no ``__eq__``, the same repr every run).
"""

from __future__ import annotations

import functools
import warnings

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import recheck


def _check(step):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return recheck.check_step(step)


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 1))


def _forward(model, x):
    return checkpoint(model, x, use_reentrant=False)


def test_a_batch_list_the_step_pops_from_is_put_back_between_the_twins():
    """A closure's list the step pops a batch from: both twins get the same batch, and after
    the check the list holds every batch it held before."""
    model = _model()
    data = [torch.randn(2, 4) for _ in range(5)]
    batches = list(data)

    def train_step():
        x = batches.pop()
        _forward(model, x).sum().backward()

    report = _check(train_step)
    assert report.ok, report.findings
    assert len(batches) == 5 and all(a is b for a, b in zip(batches, data))


def test_a_batch_the_step_scales_in_place_is_put_back():
    model = _model()
    batches = [torch.randn(2, 4) for _ in range(3)]
    before = [b.clone() for b in batches]

    def train_step():
        x = batches[0].mul_(0.5)  # normalised in place, as some loaders' transforms do
        _forward(model, x).sum().backward()

    report = _check(train_step)
    assert report.ok, report.findings
    assert all(torch.equal(a, b) for a, b in zip(batches, before))


def test_a_step_that_advances_an_iterator_is_refused_naming_it():
    """An iterator's position cannot be put back: the check says so up front, naming it, and
    the iterator is not advanced."""
    model = _model()
    data = [torch.randn(2, 4) for _ in range(5)]
    batches = iter(data)

    def train_step():
        x = next(batches)
        _forward(model, x).sum().backward()

    with pytest.raises(RuntimeError, match=r"iterator `batches` \(closure of .*train_step\).*pass the batch in"):
        _check(train_step)
    assert next(batches) is data[0]


BATCHES = iter([torch.randn(2, 4) for _ in range(3)])


def test_a_step_that_reads_a_global_generator_is_refused_naming_it():
    model = _model()

    def train_step():
        _forward(model, next(BATCHES)).sum().backward()

    with pytest.raises(RuntimeError, match=r"iterator `[\w.]*BATCHES` \(a global\).*pass the batch in"):
        _check(train_step)


def test_a_counter_and_a_losses_list_in_the_closure_are_put_back():
    model = _model()
    x = torch.randn(2, 4)
    losses: list[float] = []
    step = 0

    def train_step():
        nonlocal step
        step += 1
        loss = _forward(model, x * step).sum()
        loss.backward()
        losses.append(loss.item())

    report = _check(train_step)
    assert report.ok, report.findings
    assert step == 0 and losses == []


def _loader(data):
    """A batch function made once, as scripts do (``get_batch = loader(data)``)."""
    queue = list(data)

    def get_batch():
        return queue.pop(0)

    return get_batch


get_batch = _loader([torch.randn(2, 4) for _ in range(4)])


def test_a_batch_list_in_the_closure_of_a_global_function_is_put_back():
    model = _model()

    def train_step():
        _forward(model, get_batch()).sum().backward()

    first = get_batch.__closure__[0].cell_contents[0]
    report = _check(train_step)
    assert report.ok, report.findings
    assert get_batch() is first


class Metrics:
    """torchtitan's metrics processor: appends each loss, later reports their mean."""

    def __init__(self) -> None:
        self.values: list[float] = []

    def log(self, loss: torch.Tensor) -> None:
        self.values.append(loss.item())

    def mean_and_reset(self) -> float:
        mean = sum(self.values) / len(self.values)
        self.values.clear()
        return mean


def test_a_list_on_an_object_the_step_reaches_is_put_back():
    """The metrics' list is the same list with the same items after the check: the next real
    step behaves as without the check."""
    model = _model()
    x = torch.randn(2, 4)

    class Trainer:
        def __init__(self) -> None:
            self.metrics = Metrics()

        def step(self) -> float:
            loss = _forward(model, x).sum()
            loss.backward()
            self.metrics.log(loss)
            return self.metrics.mean_and_reset()

    trainer = Trainer()
    values = trainer.metrics.values
    report = _check(trainer.step)
    assert report.ok, report.findings
    assert trainer.metrics.values is values and values == []
    assert isinstance(trainer.step(), float)  # the next real step: no ZeroDivisionError


class Token:
    def __init__(self, piece: str) -> None:
        self.piece = piece


def test_a_metrics_list_is_put_back_behind_a_large_reach(monkeypatch):
    """torchtitan's trainer: a tokenizer, a dataset and the model hold far more values than a
    snapshot looks into (here its bound lowered to stand for a real model's); the metrics list
    its step divides by the length of and clears is still put back, so the next real step,
    after the next batch is loaded, runs as it would have without the check."""
    import recheck.runtime.snapshot as snapshot

    monkeypatch.setattr(snapshot, "_MAX_HELD", 64)
    model = _model()
    model.vocab = [Token(str(i)) for i in range(200)]  # the model's modules are looked into first
    x = torch.randn(2, 4)

    class Trainer:
        def __init__(self) -> None:
            self.dataset = [Token(str(i)) for i in range(200)]  # and ahead of the metrics here
            self.metrics = Metrics()

        def next_batch(self) -> torch.Tensor:
            self.metrics.values.append(1.0)  # the data-loading time, logged by the next step
            return x

        def train_step(self) -> float:
            _forward(model, x).sum().backward()
            return self.metrics.mean_and_reset()

    trainer = Trainer()
    trainer.next_batch()
    report = _check(trainer.train_step)
    assert report.ok, report.findings
    assert trainer.metrics.values == [1.0]
    assert trainer.train_step() == 1.0  # the real step: no ZeroDivisionError


class Schedule:
    """A pipeline schedule: no ``__eq__``, a repr the same every run, and its state as attributes."""

    def __init__(self, n_microbatches: int) -> None:
        self.n_microbatches = n_microbatches
        self.steps = 0
        self.last: list[int] = []

    def __repr__(self) -> str:
        return f"Schedule(n_microbatches={self.n_microbatches})"


SCHEDULE = Schedule(2)


def test_a_schedule_object_held_in_a_global_is_no_finding_on_a_clean_step():
    model = _model()
    x = torch.randn(2, 4)

    def train_step():
        global SCHEDULE
        SCHEDULE = Schedule(SCHEDULE.n_microbatches)  # a fresh schedule each step, as equal as the last
        for _ in range(SCHEDULE.n_microbatches):
            _forward(model, x).sum().backward()

    before = SCHEDULE
    report = _check(train_step)
    assert report.ok, report.findings
    assert SCHEDULE is before


def test_a_schedule_whose_state_differs_is_still_a_finding():
    """Equal prints are not enough: a differing attribute is a finding."""
    model = _model()
    x = torch.randn(2, 4)
    calls = []

    def region(inp):
        calls.append(1)
        return model(inp)

    def train_step():
        global SCHEDULE
        SCHEDULE = Schedule(SCHEDULE.n_microbatches)
        checkpoint(region, x, use_reentrant=False).sum().backward()
        SCHEDULE.steps = len(calls)  # 2 under checkpoint (forward and recompute), 1 bypassed

    calls_before = list(calls)
    report = _check(train_step)
    assert any("SCHEDULE" in str(f.subject) for f in report.findings), report.findings
    assert calls == calls_before


class CallableSchedule(Schedule):
    """A schedule that is called to run: an object of the project's class, compared by its state."""

    def __call__(self) -> None:
        pass


RUNNER = CallableSchedule(2)


def _run(n_microbatches: int) -> None:
    pass


_MADE: list = []  # (no code the step runs names it: each run's partial lives on, its id its own)


class _Runner(functools.partial):
    def __new__(cls, *args, **kwargs):
        made = super().__new__(cls, *args, **kwargs)
        _MADE.append(made)
        return made


def test_a_fresh_object_whose_state_cannot_be_compared_is_a_note_not_a_finding():
    model = _model()
    x = torch.randn(2, 4)

    def train_step():
        global RUNNER
        RUNNER = _Runner(_run, 2)  # a partial: code, compared by identity, and each step's is another
        _forward(model, x).sum().backward()

    before = RUNNER
    report = _check(train_step)
    assert report.ok, report.findings
    assert any("RUNNER" in note and "cannot compare" in note for note in report.notes), report.notes
    assert RUNNER is before


def test_a_fresh_callable_object_is_compared_by_its_state():
    model = _model()
    x = torch.randn(2, 4)

    def train_step():
        global RUNNER
        RUNNER = CallableSchedule(2)  # equal state in both runs: alike, nothing to note
        _forward(model, x).sum().backward()

    before = RUNNER
    report = _check(train_step)
    assert report.ok and not any("RUNNER" in note for note in report.notes), (report.findings, report.notes)
    assert RUNNER is before


_PIPELINE = """
import sys, warnings
warnings.simplefilter("ignore")
import torch, torch.distributed as dist
from torch import nn
from torch.utils.checkpoint import checkpoint
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe
import recheck

dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        return checkpoint(self.lin, x, use_reentrant=False)


torch.manual_seed(0)
model = nn.Sequential(Block(), nn.Tanh(), Block())
schedule = ScheduleGPipe(PipelineStage(model, 0, 1, torch.device("cpu")), n_microbatches=2,
                         loss_fn=lambda o, t: ((o - t) ** 2).mean())
x, y = torch.randn(4, 8), torch.randn(4, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.1)


def train_step():
    opt.zero_grad()
    schedule.step(x, target=y, losses=[])
    opt.step()


train_step()
report = recheck.check_step(train_step)
print("findings:", [str(f.subject) for f in report.findings])
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_a_real_pipeline_schedule_is_no_finding_on_a_clean_step(tmp_path):
    """torch's ScheduleGPipe in a global, one stage in a world of one: its objects made anew by
    each step (no __eq__, printed by identity) are no finding."""
    import subprocess
    import sys

    pytest.importorskip("torch.distributed.pipelining")
    script = tmp_path / "pipeline.py"
    script.write_text(_PIPELINE)
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "store")], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "findings: []" in done.stdout, done.stdout


class WrappedOptimizer(torch.optim.Optimizer):
    """An optimizer wrapper in accelerate's shape: ``state``, ``param_groups`` and ``defaults``
    are properties that answer the wrapped optimizer's own."""

    def __init__(self, optimizer):  # no super().__init__: the wrapped optimizer holds the state
        self.optimizer = optimizer
        self.skipped = False

    state = property(lambda self: self.optimizer.state)
    param_groups = property(lambda self: self.optimizer.param_groups)
    defaults = property(lambda self: self.optimizer.defaults)

    def state_dict(self):
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict):
        self.optimizer.load_state_dict(state_dict)

    def step(self, closure=None):
        return self.optimizer.step(closure)

    def zero_grad(self, set_to_none=True):
        self.optimizer.zero_grad(set_to_none)


class WrappedScheduler:
    def __init__(self, scheduler, optimizer):
        self.scheduler, self.optimizers = scheduler, [optimizer]


class CallbackHandler:
    def __init__(self, model, optimizer, lr_scheduler):
        self.model, self.optimizer, self.lr_scheduler = model, optimizer, lr_scheduler
        self.callbacks = [object(), object()]


class MiniTrainer:
    """A transformers ``Trainer`` in miniature: its optimizer, scheduler and callback handler
    hold the optimizer's state several levels down; ``training_step`` runs forward and backward
    only (the loop steps the optimizer and the scheduler outside it)."""

    def __init__(self):
        self.model = _model()
        inner = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        self.optimizer = WrappedOptimizer(inner)
        self.lr_scheduler = WrappedScheduler(torch.optim.lr_scheduler.LambdaLR(inner, lambda s: 1.0 / (s + 1)),
                                             self.optimizer)
        self.callback_handler = CallbackHandler(self.model, self.optimizer, self.lr_scheduler)
        self.x = torch.randn(2, 4)

    def training_step(self):
        loss = _forward(self.model, self.x).sum()
        loss.backward()
        return loss.detach()

    def train(self, steps):
        for _ in range(steps):
            self.training_step()
            self.optimizer.step()
            self.lr_scheduler.scheduler.step()
            self.optimizer.zero_grad()


def test_a_wrapped_optimizer_the_step_does_not_step_is_no_difference_and_left_in_place():
    """A Trainer-like object whose wrapped optimizer (state behind properties) sits several levels
    down: the twins leave the same optimizer state, so nothing is reported about it, and the
    check puts it back in place (the very same state dict, groups and tensors), not as a copy."""
    trainer = MiniTrainer()
    trainer.train(2)
    inner = trainer.optimizer.optimizer
    state, groups = inner.state, inner.param_groups
    entries = {id(p): (entry, dict(entry)) for p, entry in state.items()}
    report = _check(trainer.training_step)
    assert report.ok, report.findings
    assert not [note for note in report.notes if "cannot compare" in note], report.notes
    assert inner.state is state and inner.param_groups is groups
    assert all(state[p] is entries[id(p)][0] and all(state[p][k] is v for k, v in entries[id(p)][1].items())
               for p in state)


def test_a_scheduler_the_step_advances_is_put_back_with_its_own_objects():
    """A step that steps its scheduler: the twins compare alike, and the check leaves the scheduler
    at its epoch holding the very lists it held (``load_state_dict`` alone binds copies)."""
    trainer = MiniTrainer()
    trainer.train(2)
    scheduler = trainer.lr_scheduler.scheduler
    held = dict(vars(scheduler))

    def train_step():
        trainer.training_step()
        trainer.optimizer.step()
        scheduler.step()

    report = _check(train_step)
    assert report.ok, report.findings
    assert not [note for note in report.notes if "cannot compare" in note], report.notes  # (fresh lr lists)
    assert scheduler.last_epoch == held["last_epoch"]
    assert all(vars(scheduler)[key] is value for key, value in held.items() if isinstance(value, list))
