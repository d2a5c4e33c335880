"""torchtitan's Llama3 debug model on 2 gloo ranks (CPU), checkpointed by torchtitan's own full and
selective (per op; per layer where torchtitan has it) activation checkpointing and sharded by its
own FSDP2 code (scenario and what CPU demands: ``fixtures/distributed/world_torchtitan.py``):
``watch()`` around two steps and ``check_step`` on the first step report nothing on the clean
model, find the planted dropout without RNG preservation on each rank, never crash or hang, and
``check_step`` leaves the training state (sharded parameters, AdamW state) as it found it.  Skips
where torchtitan cannot be imported (CI does not install it).
"""

from __future__ import annotations

import pytest

pytest.importorskip("torchtitan.models.llama3", reason="torchtitan is not installed")

import world_torchtitan  # noqa: E402

from recheck.distributed.launch import run_world  # noqa: E402

#: seconds a mode's world (its 4 cases) may run before its ranks are killed (normal: 15-25 s)
WORLD_TIMEOUT = 400

_worlds: dict[str, list[dict] | BaseException] = {}


def outcomes(mode: str, hazard: str, face: str) -> list[dict]:
    """Each rank's outcome of one case; the mode's world runs once per session."""
    if mode == "selective_layer" and not world_torchtitan.layer_sac():
        pytest.skip("this torchtitan has no selective checkpointing by layer (0.3 has it per op only)")
    if mode not in _worlds:
        try:
            _worlds[mode] = run_world(world_torchtitan.titan_world, 2, args=(mode,), timeout=WORLD_TIMEOUT)
        except Exception as exc:  # noqa: BLE001 - re-raised by every case of the mode
            _worlds[mode] = exc
    result = _worlds[mode]
    if isinstance(result, BaseException):
        raise result
    found = [by_case[hazard, face] for by_case in result]
    for rank, one in enumerate(found):
        assert one["error"] is None and one["refusal"] is None, (rank, one)
        assert not any(note.startswith("could not") for note in one["notes"]), (rank, one["notes"])
        assert one["unchanged"] is (True if face == "check_step" else None), (rank, one)
    return found


MODES = pytest.mark.parametrize("mode", world_torchtitan.MODES)
FACES = pytest.mark.parametrize("face", ("watch", "check_step"))


@pytest.mark.slow
@MODES
@FACES
def test_torchtitan_debug_model_is_clean(mode, face):
    for rank, one in enumerate(outcomes(mode, "clean", face)):
        assert one["findings"] == [], (rank, one["findings"])


@pytest.mark.slow
@MODES
@FACES
def test_torchtitan_dropout_without_rng_preservation_is_found_on_each_rank(mode, face):
    for rank, one in enumerate(outcomes(mode, "dropout", face)):
        assert "rng" in {kind for kind, _, _ in one["findings"]}, (rank, one["findings"])
        assert all(tags["rank"] == rank for _, tags, _ in one["findings"] if tags), (rank, one["findings"])
