"""Twin and watch() evidence for fixtures/twins/batchnorm_outside.py (BatchNorm after the region)."""

from twin import bypass_torch_checkpoint, load_fixture, show

fx = load_fixture("batchnorm_outside")

for kind in ("closure", "method", "partial", "inside"):
    show(f"batchnorm_outside: {kind}_step", lambda kind=kind: fx.make_step(kind), bypass_torch_checkpoint)
