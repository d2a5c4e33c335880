"""Evidence for fixtures/twins/dynamic_cache.py: check() and a plain-object cache; the twin of a step."""

import recheck
from twin import bypass_torch_checkpoint, load_fixture, show

fx = load_fixture("dynamic_cache")


def cache_state(model):
    cache = model.past_key_values
    if cache is None:
        return {"attr past_key_values": None}
    return {"attr past_key_values.key_cache": list(cache.key_cache),
            "attr past_key_values.value_cache": list(cache.value_cache)}


print("== check() with a plain-object cache argument")
for name in ("region_cache", "region_no_cache"):
    layer, args, *rest = getattr(fx, name)()
    kwargs = rest[0] if rest else {}
    for reentrant in (False, True):
        cache = kwargs.get("past_key_values")
        if cache is not None:
            cache.key_cache.clear()
            cache.value_cache.clear()
        report = recheck.check(layer, *args, use_reentrant=reentrant, kwargs=kwargs)
        entries = "no cache" if cache is None else (
            f"cache after the check: {len(cache)} layer entr{'y' if len(cache) == 1 else 'ies'}, "
            f"seq length {cache.get_seq_length()} (before: 0)")
        kinds = sorted({f.kind for f in report.findings})
        print(f"  {name} use_reentrant={reentrant}: ok={report.ok}, {len(report.findings)} finding(s) {kinds}; {entries}")
        for f in report.findings[:3]:
            print(f"      {f.kind}: {f.message}")

show("dynamic_cache: step (use_cache=True under reentrant checkpointing)", lambda: fx.make_step(),
     bypass_torch_checkpoint, cache_state)
show("dynamic_cache: fixed_step (use_cache=False)", lambda: fx.make_step(fixed=True),
     bypass_torch_checkpoint, cache_state)
