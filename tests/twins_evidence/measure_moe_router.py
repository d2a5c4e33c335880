"""Twin evidence for fixtures/twins/moe_router.py (aux loss recorded through a side list, reentrant)."""

from twin import bypass_torch_checkpoint, load_fixture, show

fx = load_fixture("moe_router")

show("moe_router: step (use_reentrant=True)", lambda: fx.make_step(), bypass_torch_checkpoint)
show("moe_router: fixed_step (use_reentrant=False)", lambda: fx.make_step(fixed=True), bypass_torch_checkpoint)
