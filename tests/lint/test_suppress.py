"""Suppression comments and file-level ignores."""

from __future__ import annotations

import pytest

from recheck.lint.suppress import ALL, file_ignored, line_suppressions


@pytest.mark.parametrize(
    "comment, codes",
    [
        ("# noqa", {ALL}),
        ("# noqa: RC104", {"RC104"}),
        ("# noqa:RC104,RC103", {"RC104", "RC103"}),
        ("# NOQA: rc104 RC103", {"RC104", "RC103"}),
        ("# recheck: ignore[RC104]", {"RC104"}),
        ("# recheck: ignore[RC104, RC103]", {"RC104", "RC103"}),
        ("# recheck: ignore", {ALL}),
    ],
)
def test_comment_forms(comment, codes):
    assert line_suppressions(f"x = 1  {comment}\n") == {1: codes}


def test_string_that_looks_like_a_comment_is_not_one():
    assert line_suppressions("x = '# noqa'\n") == {}


def test_ignore_file_needs_its_own_line():
    assert file_ignored("# recheck: ignore-file\nx = 1\n")
    assert not file_ignored("x = '# recheck: ignore-file'\n")


def _suppressed_source(region_source: str, old: str, new: str) -> str:
    assert old in region_source
    return region_source.replace(old, new)


def test_noqa_on_the_line(lint, write, region_source):
    write("m.py", _suppressed_source(region_source, "self.calls += 1", "self.calls += 1  # noqa: RC104"))
    assert [line.split()[1] for line in lint().lines[:-1]] == ["RC103"]


def test_noqa_for_another_code_does_not_suppress(lint, write, region_source):
    write("m.py", _suppressed_source(region_source, "self.calls += 1", "self.calls += 1  # noqa: RC103"))
    assert [line.split()[1] for line in lint().lines[:-1]] == ["RC104", "RC103"]


def test_recheck_ignore_on_the_line(lint, write, region_source):
    write("m.py", _suppressed_source(region_source, 'print("block")', 'print("block")  # recheck: ignore[RC103]'))
    assert [line.split()[1] for line in lint().lines[:-1]] == ["RC104"]


def test_ignore_file(lint, write, region_source):
    write("m.py", "# recheck: ignore-file\n" + region_source)
    assert lint().code == 0
