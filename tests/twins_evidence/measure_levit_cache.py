"""Twin evidence for fixtures/twins/levit_cache.py (eval cache filled under no_grad, reentrant)."""

from twin import bypass_torch_checkpoint, load_fixture, show

fx = load_fixture("levit_cache")


def caches(model):
    return {f"attr {name}.attention_bias_cache": dict(m.attention_bias_cache)
            for name, m in model.named_modules() if isinstance(m, fx.attention)}


show("levit_cache: step (cache filled in the reentrant no_grad forward)", lambda: fx.make_step(),
     bypass_torch_checkpoint, caches)
show("levit_cache: fixed_step (no cache while the biases can train)", lambda: fx.make_step(fixed=True),
     bypass_torch_checkpoint, caches)
