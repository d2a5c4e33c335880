"""The renderers of ``recheck.output``: one per format, over any list of findings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from recheck.findings import Finding, Invocation, Report
from recheck.output import FORMATS, render
from recheck.output.text import format_report, group, span


def _bn(index: int, of: int = 6, detail: str = "") -> Finding:
    return Finding("buffer", "BatchNorm statistics `bn.running_mean` updated again by the recompute",
                   code="RC106", region="Block.forward (model.py:8)", subject="buffer `bn.running_mean`",
                   detail=detail or f"bytes of call {index}", hint="see `recheck explain RC106`",
                   invocation=Invocation(index, of, {"microbatch": index - 1}, "train.py:30"))


@pytest.mark.parametrize(("numbers", "text"), [
    ([1, 2, 3, 5, 7, 8, 9], "1–3, 5, 7–9"), ([4], "4"), ([2, 1, 2], "1–2"), ([], ""),
])
def test_span(numbers, text):
    assert span(numbers) == text


def test_a_finding_repeated_over_invocations_is_shown_once_with_the_first_in_full():
    report = Report([_bn(i) for i in range(1, 7)], title="watch: 6 checkpoint invocation(s)")
    text = str(report)
    assert text.count("[1] buffer:") == 1 and "[2]" not in text
    assert "in Block.forward (model.py:8), calls 1–6 of 6 (microbatch=0–5), checkpointed at train.py:30" in text
    assert "bytes of call 1" in text and "bytes of call 2" not in text
    assert text.splitlines()[0].endswith("(6 differences)")


def test_other_headlines_are_not_folded():
    other = Finding("state", "attribute `self.calls` updated again", region="Block.forward (model.py:8)",
                    subject="attribute `self.calls`", invocation=Invocation(1, 6, {}, "train.py:30"))
    assert len(group([_bn(1), other, _bn(2)])) == 2


def test_a_single_check_has_no_location_line():
    finding = Finding("state", "x differs", region="Block (m.py:1)", subject="x",
                      invocation=Invocation(1, 1))
    assert "in Block" not in format_report(Report([finding]))


def test_every_format_renders_static_and_dynamic_findings(tmp_path):
    static = Finding("lint", "`self.calls` is incremented", code="RC104", path="m.py", line=3, column=9,
                     end_line=3, end_column=19, region="Block.forward")
    findings = [static, _bn(1)]
    for fmt in FORMATS:
        assert render(fmt, findings, root=tmp_path)
    records = json.loads(render("json", findings))
    assert [r["kind"] for r in records] == ["lint", "buffer"]
    assert Report.from_dict({"findings": records}).findings == findings
    annotations = render("github", findings).splitlines()
    assert annotations[0].startswith("::warning file=m.py,line=3,col=9,")
    # a dynamic finding lands on the line that checkpoints its region
    assert annotations[1].startswith("::warning file=train.py,line=30,title=recheck (RC106)::buffer: ")
    sarif = json.loads(render("sarif", findings, root=Path(".")))
    results = sarif["runs"][0]["results"]
    assert results[1]["ruleId"] == "RC106"
    assert results[1]["locations"][0]["physicalLocation"]["region"] == {"startLine": 30}


def test_unknown_format_is_refused():
    with pytest.raises(ValueError, match="unknown output format 'xml'"):
        render("xml", [])


@pytest.mark.parametrize("bad", [
    [], {"findings": "x"}, {"findings": [{"kind": "nope", "message": "m"}]},
    {"findings": [{"kind": "state", "message": "m", "line": "3"}]},
    {"findings": [{"kind": "state", "message": "m", "evil": 1}]},
    {"findings": [{"kind": "state", "message": "m", "invocation": {"index": "1"}}]},
    {"notes": [1]}, {"stats": []}, {"title": 3},
])
def test_report_documents_are_validated_on_load(bad):
    with pytest.raises(ValueError):
        Report.from_dict(bad)
    with pytest.raises(ValueError):
        Report.from_json(json.dumps(bad))


def test_report_from_json_refuses_text_that_is_not_json():
    with pytest.raises(ValueError, match="not a JSON report"):
        Report.from_json("cos\nsystem\n(S'echo PWNED'\ntR.")


# --- paths from the linted tree are data: never a forged output line, always a valid URI (issue 40) ---

NAMES = ["bad\nsrc/m.py:1:1: RC001 forged.py", "tab\there.py", "esc\x1b[31mred.py", "sep\u2028line.py"]


def _lint_finding(path: str) -> Finding:
    return Finding("lint", "`print(...)` prints", code="RC103", path=path, line=3, column=5, end_line=3,
                   end_column=10, region="f")


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("fmt", ["text", "github"])
def test_a_control_character_in_a_path_never_makes_another_line(fmt, name):
    from recheck.lint.files import FileError

    text = render(fmt, [_lint_finding(name)], [FileError(name, "does not parse")])
    lines = [*text.splitlines(), *str(FileError(name, "does not parse")).splitlines()]
    assert len(lines) == (2 if fmt == "text" else 3), lines
    assert not any(ch in "".join(lines) for ch in "\x1b\u2028\t")
    assert "\\n" in lines[0] or "\\t" in lines[0] or "\\x1b" in lines[0] or "\\u2028" in lines[0]


@pytest.mark.parametrize(("name", "uri"), [
    ("with space.py", "with%20space.py"), ("100%.py", "100%25.py"), ("q?#.py", "q%3F%23.py"),
    ("new\nline.py", "new%0Aline.py"), ("sub/é.py", "sub/%C3%A9.py"),
])
def test_sarif_uris_are_percent_encoded(tmp_path, name, uri):
    log = json.loads(render("sarif", [_lint_finding(str(tmp_path / name))], root=tmp_path))
    assert log["runs"][0]["results"][0]["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == uri
