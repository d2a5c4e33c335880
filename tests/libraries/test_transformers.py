"""transformers' own gradient checkpointing, enabled before watch() starts, is observed and clean."""

from __future__ import annotations

import pytest
from library_env import require

torch = require("torch")
transformers = require("transformers")

import recheck  # noqa: E402


def tiny(kind: str):
    torch.manual_seed(0)
    if kind == "llama":
        config = transformers.LlamaConfig(
            vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
            attention_dropout=0.1)
        model = transformers.LlamaForCausalLM(config)
    else:
        config = transformers.GPT2Config(vocab_size=128, n_embd=32, n_layer=2, n_head=4, n_positions=64)
        model = transformers.GPT2LMHeadModel(config)
    return model


def batch():
    return torch.randint(0, 128, (2, 16))


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
@pytest.mark.parametrize("reentrant", [False, True])
def test_gradient_checkpointing_runs_clean(kind, reentrant):
    model = tiny(kind)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    if reentrant:
        model.enable_input_require_grads()
    model.train()
    with recheck.watch() as w:
        for _ in range(2):
            ids = batch()
            model(input_ids=ids, labels=ids).loss.backward()
    assert w.report.ok, str(w.report)
    assert w.report.stats["invocations"] == 4  # 2 layers x 2 steps
    assert w.report.stats["verified"] == 4
    assert w.report.stats["regions"] == 1  # the decoder layer's forward, same call site


def test_weight_update_between_microbatches_is_reported():
    # Updating the decoder layers' weights before the second microbatch's backward: a plain
    # run would raise autograd's in-place error; with checkpointing nothing complains.
    model = tiny("llama")
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    with recheck.watch(raise_on_finding=False) as w:
        losses = []
        for microbatch in range(2):
            with recheck.tag(microbatch=microbatch):
                ids = batch()
                losses.append(model(input_ids=ids, labels=ids).loss)
        losses[0].backward()
        with torch.no_grad():
            for param in model.model.layers.parameters():
                param.add_(0.01)
        losses[1].backward()
    versions = w.report.by_kind("param_version")
    assert versions, str(w.report)
    assert {f.invocation.tags["microbatch"] for f in versions} == {1}
    assert "recompute" in w.report.kinds


def test_an_attention_function_swapped_before_backward_is_named_as_the_cause():
    # transformers' layers look their attention function up in a process-wide registry
    # (ALL_ATTENTION_FUNCTIONS, since 4.48) from a forward wrapped by a decorator shared with
    # other methods; a function registered between forward and backward is what the recompute runs
    registry = getattr(transformers.modeling_utils, "ALL_ATTENTION_FUNCTIONS", None)
    if registry is None:
        pytest.skip(f"transformers {transformers.__version__} has no attention registry")
    model = tiny("llama")
    model.config._attn_implementation = "sdpa"
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    sdpa = registry["sdpa"]

    def louder(*args, **kwargs):
        output, weights = sdpa(*args, **kwargs)
        return output * 1.5, weights

    ids = batch()
    with recheck.watch(raise_on_finding=False) as w:
        loss = model(input_ids=ids, labels=ids).loss
        registry["sdpa"] = louder
        try:
            loss.backward()
        finally:
            del registry["sdpa"]  # the registry's own entry shows again
    assert registry["sdpa"] is sdpa
    causes = w.report.by_kind("global")
    assert causes and all(f.subject.endswith(".ALL_ATTENTION_FUNCTIONS`") for f in causes), str(w.report)
    assert "RC101" in causes[0].hint
    assert w.report.by_kind("recompute"), str(w.report)
