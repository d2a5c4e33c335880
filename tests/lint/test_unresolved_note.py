"""A checkpoint call site the linter could not resolve is said in every output format.

"All checks passed!" over a call whose region the linter never saw is a false all-clear:
the default output names the count, JSON says it beside the list (on stderr, so the list
stays ruff's layout), SARIF carries a note per site, GitHub a notice per site.
"""

from __future__ import annotations

import json

OPAQUE = '''
from torch.utils.checkpoint import checkpoint
from elsewhere import build


class Model:
    def forward(self, x):
        return checkpoint(build(), x, use_reentrant=False)

    def other(self, x):
        return checkpoint(self.missing, x, use_reentrant=False)
'''

NOTE = "2 checkpoint call sites were not resolved to a region; `--statistics` lists them"


def test_text_output_ends_with_the_count_of_unresolved_sites(lint, write):
    write("m.py", OPAQUE)
    run = lint("m.py")
    assert run.code == 0
    assert run.lines[-1] == NOTE


def test_one_unresolved_site_is_singular(lint, write):
    write("m.py", OPAQUE.split("    def other")[0])
    assert lint("m.py").lines[-1] == ("1 checkpoint call site was not resolved to a region; "
                                      "`--statistics` lists them")


def test_no_note_when_every_site_resolves(lint, write, region_source):
    write("m.py", region_source)
    assert "not resolved" not in lint("m.py").out


def test_json_stays_a_list_and_says_it_on_stderr(lint, write):
    write("m.py", OPAQUE)
    run = lint("--format", "json", "m.py")
    assert json.loads(run.out) == []
    assert NOTE in run.err


def test_sarif_has_a_note_per_unresolved_site(lint, write):
    write("m.py", OPAQUE)
    run = lint("--format", "sarif", "m.py")
    log = json.loads(run.out)
    invocation = log["runs"][0]["invocations"][0]
    notes = [n for n in invocation["toolExecutionNotifications"] if n["level"] == "note"]
    assert len(notes) == 2
    assert invocation["executionSuccessful"] is True
    lines = sorted(n["locations"][0]["physicalLocation"]["region"]["startLine"] for n in notes)
    assert lines == [8, 11]
    assert all("not resolved to a region" in n["message"]["text"] for n in notes)
    assert "`self.missing`" in " ".join(n["message"]["text"] for n in notes)


def test_github_has_a_notice_per_unresolved_site(lint, write):
    write("m.py", OPAQUE)
    notices = [line for line in lint("--format", "github", "m.py").lines if line.startswith("::notice")]
    assert len(notices) == 2 and "file=m.py,line=8" in notices[0]
