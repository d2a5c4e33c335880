"""transformers' sequence-classification head under recheck: the run is never broken.

``*ForSequenceClassification`` sets ``config.problem_type`` at its first loss: after the
checkpointed decoder layers ran, before backward recomputes them.  Every layer holds that
config, whose ``repr`` is JSON over many lines.  recheck observed it, then raised
``ValueError: Finding.message is one line`` from watch(), check_step and the Trainer callback
at step 0.  Now every message is one bounded line and the step completes.
"""

from __future__ import annotations

import pytest
from library_env import require

torch = require("torch")
transformers = require("transformers")

import recheck  # noqa: E402

VARIANTS = pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])


def tiny(reentrant: bool):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, num_labels=3, pad_token_id=0)
    model = transformers.LlamaForSequenceClassification(config)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    if reentrant:
        model.enable_input_require_grads()
    return model.train()


def batch():
    torch.manual_seed(1)
    return torch.randint(1, 128, (2, 16)), torch.tensor([0, 2])


def _bounded(report) -> None:
    for finding in report:
        assert "\n" not in finding.message and len(finding.message) <= 400, finding.message


@VARIANTS
def test_watch_survives_the_head_setting_problem_type(reentrant):
    model = tiny(reentrant)
    ids, labels = batch()
    assert model.config.problem_type is None
    with recheck.watch(raise_on_finding=False) as w:
        model(input_ids=ids, labels=labels).loss.backward()
    assert model.config.problem_type == "single_label_classification"
    assert w.report.stats["verified"] == 2, str(w.report)
    _bounded(w.report)


@VARIANTS
def test_a_region_is_named_by_the_decoder_layer_s_forward(reentrant):
    """5.16 checkpoints ``partial(super().__call__, **kwargs)``, 5.24 ``self.forward``: either way
    the region is the decoder layer's forward, never torch's ``Module._wrapped_call_impl``."""
    import inspect

    model = tiny(reentrant)
    ids, labels = batch()
    with recheck.watch(raise_on_finding=False) as w:
        loss = model(input_ids=ids, labels=labels).loss
        with torch.no_grad():  # a hazard, so that findings name the region: weights moved before backward
            for param in model.model.layers.parameters():
                param.add_(0.01)
        loss.backward()
    layer = transformers.models.llama.modeling_llama.LlamaDecoderLayer
    forward = inspect.unwrap(layer.forward)
    line = f"{forward.__code__.co_filename.rsplit('/', 1)[-1]}:{forward.__code__.co_firstlineno})"
    regions = {f.region for f in w.report}
    assert regions and all(r.startswith("LlamaDecoderLayer.forward (") and r.endswith(line) for r in regions), \
        str(w.report)


@VARIANTS
def test_check_step_survives_the_head_setting_problem_type(reentrant):
    model = tiny(reentrant)
    ids, labels = batch()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def step():
        optimizer.zero_grad()
        model(input_ids=ids, labels=labels).loss.backward()
        optimizer.step()

    report = recheck.check_step(step)
    assert report.stats["watch"]["verified"] == 2, str(report)
    _bounded(report)
    assert model.config.problem_type is None  # the check leaves no trace


class Sentences(torch.utils.data.Dataset):
    def __init__(self, count: int = 8) -> None:
        generator = torch.Generator().manual_seed(0)
        self.ids = torch.randint(1, 128, (count, 16), generator=generator)
        self.labels = torch.randint(0, 3, (count,), generator=generator)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict:
        return {"input_ids": self.ids[index], "labels": self.labels[index]}


@VARIANTS
def test_the_trainer_callback_survives_the_head_setting_problem_type(tmp_path, reentrant):
    require("accelerate")  # Trainer needs it
    from recheck.integrations.hf_trainer import RecheckCallback

    model = tiny(reentrant)
    callback = RecheckCallback(steps=2)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=2, learning_rate=1e-3, report_to=[],
        use_cpu=True, save_strategy="no", logging_strategy="no", disable_tqdm=True, dataloader_num_workers=0)
    transformers.Trainer(model=model, args=args, train_dataset=Sentences(), callbacks=[callback]).train()
    assert model.config.problem_type == "single_label_classification"
    assert len(callback.window.reports) == 2 and callback.report.stats["verified"] == 4, str(callback.report)
    _bounded(callback.report)
