"""``recheck.check_step()`` on real models: the hazards the issue measured, and no false findings.

* transformers' MoE models under reentrant checkpointing: the router logits recorded for the
  load-balancing loss carry no graph, so the gate trains differently (watch() alone says ok);
* timm LeViT in eval with reentrant checkpointing: the attention-bias cache is filled under
  no_grad, so every ``attention_biases`` gets no gradient (watch() alone says ok);
* dense models checkpointed both ways: nothing but rounding notes.
"""

from __future__ import annotations

import warnings

import pytest
from library_env import require

torch = require("torch")
transformers = require("transformers")
timm = require("timm")

import recheck  # noqa: E402


def _quiet_check_step(step):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return recheck.check_step(step)


def moe(kind: str, reentrant: bool):
    torch.manual_seed(0)
    common = dict(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                  num_attention_heads=2, num_key_value_heads=1, output_router_logits=True,
                  router_aux_loss_coef=0.02, max_position_embeddings=32)
    if kind == "mixtral":
        model = transformers.MixtralForCausalLM(transformers.MixtralConfig(
            num_local_experts=4, num_experts_per_tok=2, **common))
    else:
        model = transformers.Qwen2MoeForCausalLM(transformers.Qwen2MoeConfig(
            num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
            shared_expert_intermediate_size=16, **common))
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    ids = torch.randint(0, 64, (2, 16))

    def step():
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return out.loss.detach()

    return step


@pytest.mark.parametrize("kind", ["mixtral", "qwen2_moe"])
def test_moe_router_under_reentrant_checkpointing_trains_another_gate(kind):
    with recheck.watch() as w:  # what watch() alone says: every recompute matches its forward
        moe(kind, True)()
    assert w.report.ok
    report = _quiet_check_step(moe(kind, True))
    gates = [f for f in report.by_kind("state") if f.subject.endswith("mlp.gate.weight`")]
    assert len(gates) == 2, str(report)
    assert all("differs from the uncheckpointed step" in f.message for f in gates)


@pytest.mark.parametrize("kind", ["mixtral", "qwen2_moe"])
def test_moe_router_without_reentrant_checkpointing_is_its_twin(kind):
    report = _quiet_check_step(moe(kind, False))
    assert report.ok, str(report)


def test_levit_eval_cache_under_reentrant_checkpointing_leaves_every_attention_bias_without_gradient():
    torch.manual_seed(0)
    model = timm.create_model("levit_128s", pretrained=False, num_classes=10, img_size=64)
    model.set_grad_checkpointing()
    model.eval()
    x = torch.randn(2, 3, 64, 64, requires_grad=True)

    def step():
        out = model(x)
        out.sum().backward()
        return out.detach()

    previous = timm.layers.use_reentrant_ckpt()
    timm.layers.set_reentrant_ckpt(True)
    try:
        report = _quiet_check_step(step)
    finally:
        timm.layers.set_reentrant_ckpt(previous)
    missing = [f for f in report.by_kind("gradient") if "attention_biases" in f.subject]
    assert len(missing) == 11 and all("is missing under checkpoint" in f.message for f in missing), str(report)


def dense(kind: str, reentrant: bool):
    torch.manual_seed(0)
    if kind == "llama":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
            vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, attention_dropout=0.1))
    elif kind == "gpt2":
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=128, n_embd=32, n_layer=2,
                                                                     n_head=4, n_positions=64))
    else:
        model = transformers.BartForConditionalGeneration(transformers.BartConfig(
            vocab_size=128, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
            decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64))
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    if reentrant:
        model.enable_input_require_grads()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 128, (2, 16))

    def step():
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        return loss.detach()

    return step


@pytest.mark.parametrize("kind", ["llama", "gpt2", "bart"])
@pytest.mark.parametrize("reentrant", [False, True])
def test_dense_models_have_no_false_finding(kind, reentrant):
    report = _quiet_check_step(dense(kind, reentrant))
    assert report.ok, str(report)  # summation order shows, when it does, as a rounding note
