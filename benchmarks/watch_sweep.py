"""``watch()`` overhead over a sweep of real architectures: transformers and timm, tiny configs.

Each model is built from its config class with tiny sizes (no weights), gradient checkpointing
on, in train mode; one training step (forward, backward, SGD) is timed plainly and inside
``recheck.watch()`` in turn, ``--repeats`` times interleaved, best of each on this process's
CPU clock after a warm-up, so load from other processes affects both alike.  Prints one line
per model and the median ratio per library.  Needs the real-library environment (torch 2.14.1, torchvision 0.29.1, transformers,
timm); a model that cannot be built is listed with the reason and left out of the median.

    python benchmarks/watch_sweep.py [--repeats 5] [--only hf|timm]

Target (issue 15): median <= 1.3x with digests.  Nothing here is asserted.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from typing import Any, Callable

from timing import best

CPU = time.process_time

#: transformers architectures (config class prefix, auto class)
HF = [
    ("Llama", "CausalLM"), ("Mistral", "CausalLM"), ("Qwen2", "CausalLM"), ("Qwen3", "CausalLM"),
    ("Gemma", "CausalLM"), ("Gemma2", "CausalLM"), ("Phi", "CausalLM"), ("Phi3", "CausalLM"),
    ("GPT2", "CausalLM"), ("GPTNeo", "CausalLM"), ("GPTNeoX", "CausalLM"), ("OPT", "CausalLM"),
    ("Bloom", "CausalLM"), ("Falcon", "CausalLM"), ("StableLm", "CausalLM"), ("Starcoder2", "CausalLM"),
    ("Olmo", "CausalLM"), ("Olmo2", "CausalLM"), ("Granite", "CausalLM"), ("Mixtral", "CausalLM"),
    ("Qwen2Moe", "CausalLM"), ("Bart", "Seq2SeqLM"), ("T5", "Seq2SeqLM"), ("Bert", "MaskedLM"),
]
#: timm models (name, extra create_model keyword arguments)
TIMM = [
    ("resnet10t", {}), ("resnet18", {}), ("resnet50", {}), ("convnext_atto", {}), ("efficientnet_b0", {}),
    ("mobilenetv3_small_050", {}), ("regnetx_002", {}), ("densenet121", {}), ("levit_128s", {"img_size": 64}),
    ("poolformer_s12", {}), ("vit_tiny_patch16_224", {"img_size": 64}), ("deit_tiny_patch16_224", {"img_size": 64}),
    ("mixer_s16_224", {"img_size": 64}), ("convmixer_768_32", {}), ("resmlp_12_224", {"img_size": 64}),
    ("ghostnet_050", {}), ("mnasnet_050", {}), ("dla34", {}), ("cspresnet50", {}), ("hrnet_w18_small", {}),
    ("nfnet_l0", {}), ("rexnet_100", {}),
]
#: tiny sizes, set where the config has the attribute
TINY = {
    "vocab_size": 128, "hidden_size": 32, "n_embd": 32, "d_model": 32, "intermediate_size": 64,
    "n_inner": 64, "ffn_dim": 64, "encoder_ffn_dim": 64, "decoder_ffn_dim": 64, "d_ff": 64,
    "num_hidden_layers": 2, "n_layer": 2, "num_layers": 2, "encoder_layers": 2, "decoder_layers": 2,
    "num_decoder_layers": 2, "num_attention_heads": 4, "n_head": 4, "num_heads": 4,
    "encoder_attention_heads": 4, "decoder_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
    "d_kv": 8, "max_position_embeddings": 64, "n_positions": 64, "num_local_experts": 4, "num_experts": 4,
    "num_experts_per_tok": 2, "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32,
    "attention_types": [[["global", "local"], 1]], "window_size": 16, "sliding_window": 16,
}


def hf_step(prefix: str, auto: str) -> Callable[[], Any]:
    import torch
    import transformers

    config = getattr(transformers, f"{prefix}Config")()
    for key, value in TINY.items():
        if hasattr(config, key):
            setattr(config, key, value)
    if hasattr(config, "layer_types") and config.layer_types is not None:
        config.layer_types = config.layer_types[: TINY["num_hidden_layers"]]
    torch.manual_seed(0)
    model = getattr(transformers, f"AutoModelFor{auto}").from_config(config)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    ids = torch.randint(0, TINY["vocab_size"], (2, 16))

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()

    return step


def timm_step(name: str, extra: dict[str, Any]) -> Callable[[], Any]:
    import timm
    import torch

    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False, num_classes=10, **extra)
    model.set_grad_checkpointing()
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(2, 3, 64, 64)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        optimizer.step()

    return step


def sweep(label: str, builders: list[tuple[str, Callable[[], Callable[[], Any]]]], repeats: int) -> list[float]:
    import recheck

    ratios = []
    for name, build in builders:
        try:
            step = build()
            step()  # warm-up
            with recheck.watch(raise_on_finding=False) as w:
                step()

            def watched() -> None:
                with recheck.watch(raise_on_finding=False):
                    step()

            # interleaved, on this process's CPU clock: load from other processes (and the
            # machine's own drift) affects both alike
            plain = timed = float("inf")
            for _ in range(repeats):
                plain, timed = min(plain, best(step, 1, CPU)), min(timed, best(watched, 1, CPU))
        except Exception as exc:  # noqa: BLE001 - a model that cannot be built or run is listed
            print(f"{label:<5} {name:<26} skipped: {type(exc).__name__}: {str(exc).splitlines()[0][:80]}")
            continue
        ratios.append(timed / plain)
        calls = w.report.stats.get("invocations", 0)
        print(f"{label:<5} {name:<26} {plain * 1e3:>9.1f}ms {timed * 1e3:>9.1f}ms {timed / plain:>6.2f}x  "
              f"{calls:>3} calls  {len(w.report)} finding(s)")
    return ratios


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--only", choices=("hf", "timm"))
    ns = parser.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    print(f"{'lib':<5} {'model':<26} {'plain':>11} {'watch':>11} {'ratio':>7}")
    medians = {}
    if ns.only in (None, "hf"):
        ratios = sweep("hf", [(p, lambda p=p, a=a: hf_step(p, a)) for p, a in HF], ns.repeats)
        medians["transformers"] = (statistics.median(ratios), len(ratios)) if ratios else None
    if ns.only in (None, "timm"):
        ratios = sweep("timm", [(n, lambda n=n, e=e: timm_step(n, e)) for n, e in TIMM], ns.repeats)
        medians["timm"] = (statistics.median(ratios), len(ratios)) if ratios else None
    for library, value in medians.items():
        print(f"median {library}: " + (f"{value[0]:.2f}x over {value[1]} models" if value else "no model ran"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
