"""Twin evidence for fixtures/twins/amp_checkpoint.py (recompute under autocast's default dtype)."""

from twin import bypass_apply, load_fixture, show

fx = load_fixture("amp_checkpoint")


def direct(run_function, *args):
    return run_function(*args)


show("amp_checkpoint: step (enabled restored, dtype not)", lambda: fx.make_step(),
     lambda: bypass_apply(fx.CheckpointFunction, direct))
show("amp_checkpoint: fixed_step (enabled, dtype, cache_enabled restored)", lambda: fx.make_step(fixed=True),
     lambda: bypass_apply(fx.AmpCheckpointFunction, direct))
