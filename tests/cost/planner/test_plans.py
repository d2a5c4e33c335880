"""The plan format: what --suggest writes and apply_plan reads, and its errors."""

from __future__ import annotations

import json

import pytest

from recheck.cost.planner.plans import FORMAT_VERSION, SELECTIVE_OPS, Plan, PlanError, RegionChoice, load_plan

PLAN = Plan((("blocks.0", "full"), ("blocks.2", "selective")), (RegionChoice("tanh at m.py:4", False),), "ModuleDict")


def test_a_plan_round_trips_through_its_dict_its_json_and_a_file(tmp_path):
    assert Plan.from_dict(PLAN.to_dict()) == PLAN
    assert load_plan(PLAN.to_json()) == PLAN
    path = tmp_path / "plan.json"
    path.write_text(PLAN.to_json())
    assert load_plan(path) == load_plan(str(path)) == PLAN
    assert PLAN.to_dict()["recheck_plan"] == FORMAT_VERSION
    assert PLAN.to_dict()["selective_ops"] == list(SELECTIVE_OPS)


def test_a_plan_answers_per_module_and_says_itself_in_words():
    assert PLAN.variant("blocks.0") == "full" and PLAN.variant("blocks.1") == "none"
    assert PLAN.kept_regions() == frozenset()
    assert PLAN.describe() == "blocks.0 full, blocks.2 selective"
    assert Plan().describe() == "nothing checkpointed"


@pytest.mark.parametrize(("modules", "message"), [
    ((("a", "sometimes"),), "unknown variant 'sometimes'"),
    ((("a", "full"), ("a", "selective")), "'a' is listed twice"),
    ((("layers", "full"), ("layers.0", "full")), "'layers.0' is inside 'layers'"),
    ((("", "full"), ("layers.0", "full")), "inside 'the root'"),
])
def test_a_plan_that_cannot_be_applied_is_refused_when_made(modules, message):
    with pytest.raises(PlanError, match=message):
        Plan(modules)


@pytest.mark.parametrize(("data", "message"), [
    ([], "a plan is a JSON object"),
    ({"modules": []}, "not a recheck plan of format 1"),
    ({"recheck_plan": 1, "modules": {}}, "\"modules\" must be a list"),
    ({"recheck_plan": 1, "modules": ["blocks.0"]}, r"modules\[0\] must be an object"),
    ({"recheck_plan": 1, "regions": [{"region": "r"}]}, r"regions\[0\] must be an object"),
    ({"recheck_plan": 1, "selective_ops": "aten.mm"}, "must be a list of operator names"),
])
def test_a_bad_plan_document_says_what_is_wrong(data, message):
    with pytest.raises(PlanError, match=message):
        Plan.from_dict(data)


def test_unreadable_plans_say_why(tmp_path):
    with pytest.raises(PlanError, match="cannot read the plan file"):
        load_plan(tmp_path / "missing.json")
    with pytest.raises(PlanError, match="not valid JSON"):
        load_plan("{not json")
    with pytest.raises(PlanError, match="got int"):
        load_plan(3)  # type: ignore[arg-type]


def test_a_missing_variant_reads_as_full():
    plan = Plan.from_dict({"recheck_plan": 1, "modules": [{"path": "h.0"}]})
    assert plan.modules == (("h.0", "full"),)
    assert json.loads(plan.to_json())["modules"] == [{"path": "h.0", "variant": "full"}]
