"""Twin evidence for fixtures/twins/diffusion_checkpoint.py (hand-written Function, no RNG restore)."""

from twin import bypass_apply, load_fixture, show

fx = load_fixture("diffusion_checkpoint")


def direct(run_function, length, *args):
    return run_function(*args[:length])


show("diffusion_checkpoint: step (no RNG restore)", lambda: fx.make_step(),
     lambda: bypass_apply(fx.CheckpointFunction, direct))
show("diffusion_checkpoint: fixed_step (RNG stashed and restored)", lambda: fx.make_step(fixed=True),
     lambda: bypass_apply(fx.RngCheckpointFunction, direct))
