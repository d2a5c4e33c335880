"""recheck.integrations.hf_trainer: the first steps of a real ``transformers.Trainer`` run, watched.

Tiny GPT-2 models built from configs (no weights), trained on CPU for a few steps with
transformers' own gradient checkpointing; the hazard is a real misconfiguration: dropout
with ``preserve_rng_state=False`` passed through ``gradient_checkpointing_kwargs``.
"""

from __future__ import annotations

import logging

import pytest
from library_env import logged, require

torch = require("torch")
transformers = require("transformers")
require("accelerate")  # Trainer needs it

import torch.utils.checkpoint as torch_checkpoint  # noqa: E402

import recheck  # noqa: E402
from recheck.integrations.hf_trainer import LOGGER_NAME, RecheckCallback  # noqa: E402

ORIGINAL_CHECKPOINT = torch_checkpoint.checkpoint
LAYERS = 2


class Tokens(torch.utils.data.Dataset):
    def __init__(self, count: int = 16) -> None:
        generator = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, 128, (count, 16), generator=generator)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict:
        return {"input_ids": self.ids[index], "labels": self.ids[index]}


def train(tmp_path, callback, *, dropout: float = 0.0, preserve_rng_state: bool = True, max_steps: int = 3,
          accumulation: int = 2):
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=128, n_embd=32, n_layer=LAYERS, n_head=4, n_positions=32,
                                     resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout)
    model = transformers.GPT2LMHeadModel(config)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={
        "use_reentrant": False, "preserve_rng_state": preserve_rng_state})
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), max_steps=max_steps, per_device_train_batch_size=2,
        gradient_accumulation_steps=accumulation, learning_rate=1e-3, report_to=[], use_cpu=True,
        save_strategy="no", logging_strategy="no", disable_tqdm=True, dataloader_num_workers=0)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=Tokens(), callbacks=[callback])
    return trainer


@pytest.fixture
def messages():
    """What the callback logs through transformers' logger."""
    with logged(LOGGER_NAME) as records:
        yield records


def test_the_first_steps_are_watched_and_reported_clean(tmp_path, messages):
    callback = RecheckCallback(steps=2)
    train(tmp_path, callback).train()
    report = callback.report
    assert report.ok, str(report)
    # 2 watched optimizer steps x 2 accumulated micro-batches x 2 checkpointed layers; step 3 is not watched
    assert report.stats["invocations"] == report.stats["verified"] == 2 * 2 * LAYERS
    assert torch_checkpoint.checkpoint is ORIGINAL_CHECKPOINT
    texts = [r.getMessage() for r in messages]
    assert texts[0] == f"recheck: training step 1 of the 2 watched: {2 * LAYERS} checkpoint call(s) verified, " \
                       "recomputation identical"
    assert texts[-1].startswith("recheck: watched the first 2 training step(s): 8 checkpoint call(s), 8 verified, "
                                "0 finding(s)")
    assert all(r.levelno == logging.INFO for r in messages)


def test_a_hazard_is_logged_as_a_warning_and_training_goes_on(tmp_path, messages):
    callback = RecheckCallback(steps=1)
    trainer = train(tmp_path, callback, dropout=0.1, preserve_rng_state=False)
    trainer.train()
    assert trainer.state.global_step == 3
    assert not callback.report.ok
    assert {"recompute"} <= callback.report.kinds
    warning = next(r for r in messages if r.levelno == logging.WARNING)
    assert warning.getMessage().startswith("recheck: training step 1 of the 1 watched:")
    assert "recheck explain RC002" in warning.getMessage()


def test_fail_fast_stops_training_at_the_first_step_with_findings(tmp_path, messages):
    callback = RecheckCallback(steps=3, fail_fast=True)
    trainer = train(tmp_path, callback, dropout=0.1, preserve_rng_state=False)
    with pytest.raises(recheck.RecomputeMismatch) as caught:
        trainer.train()
    assert trainer.state.global_step == 1
    assert "recompute" in caught.value.report.kinds
    assert any(r.levelno == logging.WARNING for r in messages)  # logged before it raised
    assert torch_checkpoint.checkpoint is ORIGINAL_CHECKPOINT  # nothing left patched


def test_watch_options_are_passed_through(tmp_path):
    callback = RecheckCallback(steps=1, early_stop=False, store="copy")
    train(tmp_path, callback, max_steps=1, accumulation=1).train()
    assert callback.report.ok, str(callback.report)
    assert any("early_stop=False" in note for note in callback.report.notes)


@pytest.mark.parametrize("kwargs, error, message", [
    ({"steps": 0}, ValueError, "steps must be a whole number of at least 1"),
    ({"raise_on_finding": True}, TypeError, "pass fail_fast=True instead of raise_on_finding"),
    ({"store": "everything"}, ValueError, "store must be one of"),
    ({"stric": True}, TypeError, "stric"),
])
def test_bad_options_are_refused_when_the_callback_is_made(kwargs, error, message):
    with pytest.raises(error, match=message):
        RecheckCallback(**kwargs)


def test_a_run_that_raises_mid_step_leaves_nothing_patched(tmp_path):
    callback = RecheckCallback(steps=2)
    trainer = train(tmp_path, callback, max_steps=2, accumulation=1)

    def broken(*args, **kwargs):
        raise RuntimeError("the loss function broke")

    trainer.compute_loss = broken
    with pytest.raises(RuntimeError, match="the loss function broke"):
        trainer.train()
    assert callback.window.watching  # transformers has no hook for an exception ...
    callback.close()  # ... so the callback says how to end it
    assert torch_checkpoint.checkpoint is ORIGINAL_CHECKPOINT
    trainer.compute_loss = transformers.Trainer.compute_loss.__get__(trainer)
    trainer.train()  # a new run also closes whatever was left open
    assert torch_checkpoint.checkpoint is ORIGINAL_CHECKPOINT


def test_the_integrations_package_imports_no_framework():
    import subprocess
    import sys

    code = ("import sys, recheck.integrations, recheck.integrations.step_window\n"
            "print(sorted(m for m in ('transformers', 'lightning', 'pytorch_lightning') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
