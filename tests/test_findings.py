"""The shared findings model: kinds, validation, text and JSON round trips."""

import json

import pytest

import recheck
from recheck.findings import DYNAMIC_KINDS, FIRST_LINE, KINDS, Finding, Invocation, Report, Subject, report_entries


def test_kinds_are_declared_once_causes_first_each_with_rules_that_exist():
    # one declaration per kind (recheck.findings.DECLARED): what every face, the docs' table and
    # `recheck explain` read; adding a kind touches that line, the code that observes it and its test
    from recheck.catalogue import all_rules
    from recheck.findings import DECLARED

    names = [kind.name for kind in DECLARED]
    assert tuple(DYNAMIC_KINDS) == tuple(names) and len(set(names)) == len(names)
    assert KINDS == (*DYNAMIC_KINDS, "lint")
    causes = [kind.cause for kind in DECLARED]
    assert causes == sorted(causes, reverse=True), "every cause is declared before every consequence"
    documented = {rule.code for rule in all_rules()}
    for kind in DECLARED:
        assert kind.meaning and "\n" not in kind.meaning
        assert set(kind.rules) <= documented, kind.name
        assert kind.rules or not kind.cause, f"cause {kind.name} names no rule"
    assert {"recompute", "output", "gradient"} <= set(DYNAMIC_KINDS)


def test_public_names_are_exported_without_torch():
    for name in ("Finding", "Report", "RecomputeMismatch", "Invocation", "KINDS"):
        assert hasattr(recheck, name)
    assert issubclass(recheck.RecomputeMismatch, AssertionError)


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({"kind": "nonsense", "message": "m"}, "unknown finding kind 'nonsense'"),
        ({"kind": "lint", "message": "m"}, "needs a rule code"),
        ({"kind": "state", "message": "two\nlines"}, "one line"),
    ],
)
def test_invalid_findings_are_rejected(kwargs, error):
    with pytest.raises(ValueError, match=error):
        Finding(**kwargs)


def test_static_finding_formats_like_ruff():
    f = Finding(kind="lint", code="RC104", message="`self.calls` is incremented", path="m.py", line=8, column=9)
    assert f.location == "m.py:8:9"
    assert f.format() == "m.py:8:9: RC104 `self.calls` is incremented"


def dynamic_finding(**extra):
    return Finding(
        kind="buffer",
        message="buffer `bn.running_mean` updated twice",
        region="Block._inner (model.py:12)",
        invocation=Invocation(index=2, of=3, tags={"microbatch": 1}, callsite="train.py:40"),
        subject="buffer `bn.running_mean`",
        detail="4 / 16 elements differ\nfirst difference at index (0,)",
        hint="see `recheck explain RC106`",
        **extra,
    )


def test_report_text_names_everything():
    report = Report([dynamic_finding(), dynamic_finding(latent=True)], title="region Block._inner", notes=["n1"])
    text = str(report)
    assert text.splitlines()[0] == f"{FIRST_LINE} (2 differences)"
    assert "[1] buffer: buffer `bn.running_mean` updated twice" in text
    assert "[2] buffer (latent):" in text
    assert "first difference at index (0,)" in text
    assert "hint: see `recheck explain RC106`" in text
    assert "note: n1" in text
    assert not report.ok and len(report) == 2 and report.kinds == {"buffer"}


def test_clean_report():
    report = Report()
    assert report.ok
    assert str(report) == "recheck: no difference found"


def test_json_round_trip_keeps_invocation_and_latent():
    report = Report([dynamic_finding(latent=True)], notes=["compiled regions were not observed"])
    data = json.loads(report.to_json())
    assert data["ok"] is False
    assert data["findings"][0]["invocation"] == {
        "index": 2,
        "of": 3,
        "tags": {"microbatch": 1},
        "callsite": "train.py:40",
    }
    again = Report.from_json(report.to_json())
    assert again.findings == report.findings
    assert again.notes == report.notes


def test_invocation_text():
    assert str(Invocation(index=3, of=8, tags={"stage": 1}, callsite="a.py:9")) == (
        "call 3 of 8 (stage=1), checkpointed at a.py:9"
    )


def test_recompute_mismatch_carries_the_report():
    report = Report([dynamic_finding()])
    exc = recheck.RecomputeMismatch(report)
    assert exc.report is report
    assert str(exc) == str(report)


def test_one_line_collapses_whitespace_and_cuts_with_the_full_length():
    from recheck.findings import one_line

    assert one_line("Config {\n  \"a\": 1\n}\n") == 'Config { "a": 1 }'
    assert one_line("short") == "short"
    text = one_line("word " * 100, 40)
    assert len(text) <= 40 and text.endswith("... (499 chars)")


def test_one_line_pair_cuts_both_texts_around_their_first_difference():
    from recheck.findings import one_line_pair

    before, after = one_line_pair("x" * 300 + "old" + "y" * 300, "x" * 300 + "new" + "y" * 300, 60)
    assert "old" in before and "new" in after and len(before) <= 60 and len(after) <= 60
    assert one_line_pair("a\nb", "a\nc") == ("a b", "a c")


def test_could_not_is_one_bounded_line_naming_the_error():
    from recheck.findings import could_not

    note = could_not("compare the recompute of Block.forward (m.py:8), call 1", RuntimeError("a\nb" * 200))
    assert note.startswith("could not compare the recompute of Block.forward (m.py:8), call 1: RuntimeError: a b")
    assert "\n" not in note and len(note) < 300


def test_a_subject_is_data_that_reads_as_its_text_and_survives_json():
    """Issue 41: a finding's subject is data (what, owner, name, path), its text rendered from it."""
    subject = Subject("buffer", "running_mean", owner="bn")
    assert subject == "buffer `bn.running_mean`"
    assert (subject.what, subject.owner, subject.name, subject.path) == ("buffer", "bn", "running_mean", "")
    with pytest.raises(AttributeError):
        subject.owner = "other"  # type: ignore[misc]
    finding = Finding("buffer", "BatchNorm statistics `bn.running_mean` updated again", subject=subject)
    data = finding.to_dict()
    assert type(data["subject"]) is str and data["subject"] == "buffer `bn.running_mean`"
    assert data["subject_data"] == {"what": "buffer", "name": "running_mean", "owner": "bn", "path": "", "more": []}
    back = Finding.from_dict(json.loads(json.dumps(data)))
    assert back == finding and isinstance(back.subject, Subject) and back.subject.owner == "bn"
    # a record without parts (an older report, one written by hand) loads with its text alone
    older = Finding.from_dict({k: v for k, v in data.items() if k != "subject_data"})
    assert older.subject == subject and not isinstance(older.subject, Subject)
    with pytest.raises(ValueError, match="unknown subject kind 'layer'"):
        Finding.from_dict({**data, "subject_data": {**data["subject_data"], "what": "layer"}})
    with pytest.raises(ValueError, match="subject_data has unknown field"):
        Finding.from_dict({**data, "subject_data": {"what": "buffer", "device": "cpu"}})
    assert Subject("parameter", "w", owner="fc", more=("fc.b",)) == "parameters `fc.w`, `fc.b`"
    assert Subject("gradient", path="args[0]") == "grad of args[0]" and Subject("attribute", "calls") == \
        "attribute `self.calls`"


def test_report_groups_by_the_subject_s_parts_never_its_wording():
    """The buffers one recompute changed in several modules join as one ``modules`` entry when their
    subjects say so; a text that merely reads like a module's buffer is not taken apart."""
    def found(subject, module, name):
        return Finding("buffer", f"buffer `{module}.{name}` updated again", subject=subject, region="B.forward",
                       invocation=Invocation(1, 1))

    typed = [found(Subject("buffer", n, owner=m), m, n) for m in ("bn1", "bn2") for n in ("running_mean", "running_var")]
    (entry,) = report_entries(typed)
    assert entry.form == "modules" and entry.family == ("running_mean", "running_var")
    assert entry.modules == ("B.forward: bn1", "B.forward: bn2")
    texts = [found(f"buffer `{m}.{n}`", m, n) for m in ("bn1", "bn2") for n in ("running_mean", "running_var")]
    assert [e.form for e in report_entries(texts)] == ["finding"] * 4


def _cpu_rng_cause() -> Finding:
    return Finding("rng", "cpu RNG state at recompute differs", code="RC002", region="B.forward",
                   subject=Subject("device RNG", owner="cpu"), invocation=Invocation(1, 1))


def test_a_consequence_is_told_by_the_cause_it_points_at_never_by_its_hint_s_wording():
    """Issue 41: whether an end-of-step difference is a consequence is data (``cause``, the kind of
    the finding it follows from), so rewording the hint changes no grouping."""
    reworded = Finding("gradient", "grad of `w` differs", code="RC002", region="step train",
                       subject=Subject("gradient", "w"), hint="follows from: cpu RNG state at recompute", cause="rng")
    assert [(e.form, e.count) for e in report_entries([_cpu_rng_cause(), reworded])] == \
        [("finding", 1), ("consequences", 1)]
    # a hint that merely reads like a pointer makes no consequence
    own = Finding("global", "global `pkg.N` differs", code="RC101", region="step train",
                  subject=Subject("global", "N", owner="pkg"), hint="likely cause: a global of its own")
    assert [e.form for e in report_entries([_cpu_rng_cause(), own])] == ["finding", "finding"]
    # and the pointer survives JSON
    again = Report.from_json(Report([_cpu_rng_cause(), reworded]).to_json())
    assert again.findings[1].cause == "rng" and [e.form for e in again.entries()][-1] == "consequences"


def test_one_hazard_in_several_modules_is_joined_by_its_subjects_whatever_the_wording():
    """The ``modules`` entry is decided by kind, rule and subject parts: a message that does not
    quote its buffer as ``module.name`` still joins."""
    found = [Finding("buffer", f"running statistics of {m} ({n}) updated again", code="RC106", region="B.forward",
                     subject=Subject("buffer", n, owner=m), invocation=Invocation(1, 1))
             for m in ("bn1", "bn2") for n in ("running_mean", "running_var")]
    (entry,) = report_entries(found)
    assert entry.form == "modules" and entry.family == ("running_mean", "running_var") and entry.count == 4


def test_two_attributes_one_recompute_changed_are_one_entry_saying_what_they_share():
    found = [Finding("state", f"attribute `gate.{n}` updated again by the recompute: {a} -> {b}", region="B.forward",
                     subject=Subject("attribute", n, owner="gate"), invocation=Invocation(1, 1))
             for n, a, b in (("calls", 1, 2), ("steps", 5, 6))]
    (entry,) = report_entries(found)
    assert (entry.form, entry.family) == ("modules", ("calls", "steps"))
    assert entry.message == "attribute `calls`, `steps` updated again by the recompute in 1 module of 1 region"
