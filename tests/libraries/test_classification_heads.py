"""transformers' task heads under recheck: the run is never broken, clean models report nothing,
regions are the layers' ``forward``, and a planted hazard is found.

``*ForSequenceClassification`` sets ``config.problem_type`` at its first loss: after the
checkpointed decoder layers ran, before backward recomputes them.  Every layer holds that
config, whose ``repr`` is JSON over many lines.  recheck observed it, then raised
``ValueError: Finding.message is one line`` from watch(), check_step and the Trainer callback
at step 0.  Now every message is one bounded line and the step completes.

The other heads (token classification, question answering, image classification) and a second
family (an encoder, BERT; ModernBERT; ViT and Swin, whose stages checkpoint layers that checkpoint
themselves) run under both checkpoint variants: clean, they report nothing; with dropout whose RNG
the checkpoint does not preserve, or a layer counting its calls, the hazard is found and named by
the layer.  MobileViT checkpoints layers holding BatchNorm, a hazard of the library itself.
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


def _layer_forward(layer: type) -> str:
    """``Layer.forward (file.py:N)``, where ``N`` is the line of the ``forward`` the class defines."""
    import inspect

    forward = inspect.unwrap(layer.forward)
    code = forward.__code__
    return f"{layer.__qualname__}.forward ({code.co_filename.rsplit('/', 1)[-1]}:{code.co_firstlineno})"


def _text(family: str, labels: int, dropout: float):
    common = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  max_position_embeddings=64, num_labels=labels)
    if family == "Llama":
        return transformers.LlamaConfig(**common, num_key_value_heads=2, pad_token_id=0, attention_dropout=dropout)
    if family == "Bert":
        return transformers.BertConfig(**common, hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
    return transformers.ModernBertConfig(**common, pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1,
                                         sep_token_id=2, attention_dropout=dropout, mlp_dropout=dropout)


def _image(family: str, dropout: float):
    if family == "ViT":
        return transformers.ViTConfig(image_size=16, patch_size=4, hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=2, num_attention_heads=4, num_labels=3,
                                      hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
    return transformers.SwinConfig(image_size=16, patch_size=2, embed_dim=16, depths=[1, 1], num_heads=[2, 2],
                                   window_size=4, num_labels=3, hidden_dropout_prob=dropout,
                                   attention_probs_dropout_prob=dropout)


#: (family, head): each head, a decoder and encoders for the text heads, a plain and a nested vision one
HEADS = [("Llama", "QuestionAnswering"), ("Bert", "SequenceClassification"),
         ("Bert", "TokenClassification"), ("Bert", "QuestionAnswering"), ("ModernBert", "TokenClassification"),
         ("ViT", "ImageClassification"), ("Swin", "ImageClassification")]
#: family: its modeling module and the layer classes that checkpoint themselves
LAYERS = {"Llama": ("llama", ["LlamaDecoderLayer"]), "Bert": ("bert", ["BertLayer"]),
          "ModernBert": ("modernbert", ["ModernBertEncoderLayer"]), "ViT": ("vit", ["ViTLayer"]),
          "Swin": ("swin", ["SwinLayer", "SwinStage"])}
EACH_HEAD = pytest.mark.parametrize("family,head", HEADS, ids=[f + h for f, h in HEADS])


def head_model(family: str, head: str, reentrant: bool, dropout: float = 0.1, preserve_rng_state: bool = True):
    """A tiny ``<family>For<head>`` in training mode, checkpointed the way the variant asks."""
    torch.manual_seed(0)
    image = head == "ImageClassification"
    config = _image(family, dropout) if image else _text(family, 2 if head == "QuestionAnswering" else 3, dropout)
    model = getattr(transformers, f"{family}For{head}")(config)
    options = {"use_reentrant": reentrant, **({} if preserve_rng_state else {"preserve_rng_state": False})}
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=options)
    if reentrant and not image:
        model.enable_input_require_grads()
    return model.train()


def head_batch(head: str) -> dict:
    torch.manual_seed(1)
    if head == "ImageClassification":
        return {"pixel_values": torch.randn(2, 3, 16, 16), "labels": torch.tensor([0, 2])}
    ids = torch.randint(3, 128, (2, 16))
    if head == "QuestionAnswering":
        return {"input_ids": ids, "start_positions": torch.tensor([1, 3]), "end_positions": torch.tensor([4, 9])}
    return {"input_ids": ids, "labels": torch.randint(0, 3, (2, 16) if head == "TokenClassification" else (2,))}


def _named_by_layers(report, family: str) -> None:
    """Every region a finding names is one of the family's layers' ``forward`` with its
    ``file:line``; the step's own differences are the step's."""
    module, names = LAYERS[family]
    modeling = getattr(transformers.models, module)
    layers = {_layer_forward(getattr(getattr(modeling, f"modeling_{module}"), name)) for name in names}
    for finding in report:
        assert "_wrapped_call_impl" not in finding.region and "partial" not in finding.region, str(report)
        if not finding.region.startswith("step "):
            assert any(finding.region.startswith(layer.split(" (")[0] + " (") and
                       finding.region.endswith(layer.split(" (")[1]) for layer in layers), str(report)


def _watched(model, batch: dict):
    with recheck.watch(raise_on_finding=False) as w:
        loss = model(**batch).loss
        loss.backward()
    assert torch.isfinite(loss) and all(p.grad is not None for p in model.parameters() if p.requires_grad)
    _bounded(w.report)
    return w.report


def _stepped(model, batch: dict):
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    before = {k: v.clone() for k, v in model.state_dict().items()}

    def step():
        optimizer.zero_grad()
        model(**batch).loss.backward()
        optimizer.step()

    report = recheck.check_step(step)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # the check leaves no trace
    _bounded(report)
    return report


@EACH_HEAD
@VARIANTS
def test_a_clean_head_reports_nothing(family, head, reentrant):
    model, batch = head_model(family, head, reentrant), head_batch(head)
    watched = _watched(model, batch)
    assert not watched.findings and watched.stats["verified"] == watched.stats["invocations"] >= 2, str(watched)
    stepped = _stepped(head_model(family, head, reentrant), batch)
    assert not stepped.findings and stepped.stats["watch"]["verified"] >= 2, str(stepped)


@EACH_HEAD
@VARIANTS
def test_dropout_without_preserved_rng_is_found_in_each_layer(family, head, reentrant):
    model, batch = head_model(family, head, reentrant, preserve_rng_state=False), head_batch(head)
    watched = _watched(model, batch)
    assert {f.kind for f in watched} >= {"rng", "recompute"}, str(watched)
    _named_by_layers(watched, family)
    stepped = _stepped(head_model(family, head, reentrant, preserve_rng_state=False), batch)
    assert {f.kind for f in stepped} >= {"rng", "recompute"}, str(stepped)
    _named_by_layers(stepped, family)


class CountingBertLayer(transformers.models.bert.modeling_bert.BertLayer):
    """A layer that counts its calls: the recompute counts again."""

    calls = 0

    def forward(self, *args, **kwargs):
        self.calls += 1
        return super().forward(*args, **kwargs)


@VARIANTS
def test_a_layer_counting_its_calls_is_found(reentrant):
    model, batch = head_model("Bert", "TokenClassification", reentrant), head_batch("TokenClassification")
    for layer in model.bert.encoder.layer:
        layer.__class__ = CountingBertLayer  # transformers wraps a subclass's forward too
    counter = _layer_forward(CountingBertLayer)
    for report in (_watched(model, batch), _stepped(model, batch)):
        counted = [f for f in report if f.kind == "state" and not f.region.startswith("step ")]
        assert len(counted) == 2 and all(f.region.endswith(counter.split(" (")[1]) and "`self.calls`" in f.message
                                         and f.region.startswith("CountingBertLayer.forward (") for f in counted), \
            str(report)
    assert [layer.calls for layer in model.bert.encoder.layer] == [2, 2]  # the watched run's, not the check's


@VARIANTS
def test_batchnorm_in_mobilevit_s_checkpointed_layers_is_found(reentrant):
    """MobileViT checkpoints layers that hold BatchNorm: the recompute updates its statistics again."""
    torch.manual_seed(0)
    config = transformers.MobileViTConfig(image_size=16, hidden_sizes=[16, 24, 32], num_attention_heads=2,
                                          neck_hidden_sizes=[8, 8, 16, 16, 24, 24, 48], num_labels=3)
    model = transformers.MobileViTForImageClassification(config)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    report = _watched(model.train(), {"pixel_values": torch.randn(2, 3, 16, 16), "labels": torch.tensor([0, 2])})
    statistics = [f for f in report if f.kind == "buffer" and "BatchNorm statistics" in f.message]
    layer = _layer_forward(transformers.models.mobilevit.modeling_mobilevit.MobileViTLayer)
    assert statistics and all(f.region.startswith("MobileViTLayer.forward (") and
                              f.region.endswith(layer.split(" (")[1]) for f in statistics), str(report)


def test_pytest_recheck_fails_only_the_head_with_the_hazard(pytester, monkeypatch):
    """Under ``pytest --recheck`` a test training a clean head passes and one whose dropout's RNG
    the checkpoint does not preserve fails, the finding naming the layer."""
    import os

    pytester.makepyfile(test_heads=f"""
        import sys
        import pytest
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        from test_classification_heads import head_batch, head_model

        @pytest.mark.parametrize("preserve", [True, False])
        @pytest.mark.parametrize("family,head", [("Bert", "QuestionAnswering"), ("ViT", "ImageClassification")])
        def test_train(family, head, preserve):
            head_model(family, head, reentrant=True, preserve_rng_state=preserve)(**head_batch(head)).loss.backward()
    """)
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")  # the plugin by -p alone, as tests/watch/test_plugin.py
    result = pytester.runpytest_subprocess("-p", "recheck._pytest_plugin", "--recheck", "-W", "ignore::FutureWarning")
    result.assert_outcomes(passed=2, failed=2)
    result.stdout.fnmatch_lines(["*test_train?Bert-QuestionAnswering-False?*", "*test_train?ViT-ImageClassification-False?*"])
    output = result.stdout.str()
    assert "in BertLayer.forward (transformers/models/bert/modeling_bert.py:" in output
    assert "in ViTLayer.forward (transformers/models/vit/modeling_vit.py:" in output
