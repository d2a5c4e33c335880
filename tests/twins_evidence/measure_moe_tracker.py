"""Twin evidence for fixtures/twins/moe_tracker.py (aux-loss tracker in parallel_state, recomputed)."""

from twin import bypass_torch_checkpoint, load_fixture, show

fx = load_fixture("moe_tracker")


def tracker(_model):
    from megatron_lite import parallel_state

    state = parallel_state.get_moe_layer_wise_logging_tracker()
    return {"attr parallel_state._MOE_LAYER_WISE_LOGGING_TRACKER": {k: v["values"].clone() for k, v in state.items()}}


show("moe_tracker: step (tracker written inside the region)", lambda: fx.make_step(), bypass_torch_checkpoint, tracker)
show("moe_tracker: fixed_step (tracker written after the checkpoint)", lambda: fx.make_step(fixed=True),
     bypass_torch_checkpoint, tracker)
