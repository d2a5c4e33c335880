"""``--fix`` changes no byte but the ones it inserts: encodings, BOM, form feeds, line endings (issue 40)."""

from __future__ import annotations

import pytest

INSERTED = b", use_reentrant=False"

FLAGGED = b"import torch.utils.checkpoint as cp\n\n\ndef run(block, x):\n    return cp.checkpoint(block, x)\n"
FIXED = FLAGGED.replace(b"checkpoint(block, x)", b"checkpoint(block, x" + INSERTED + b")")


LATIN_1 = ("# -*- coding: latin-1 -*-\n# caf\xe9 \xb5s \x85 \xff\nimport torch.utils.checkpoint as cp\n\n\n"
           "def run(block, x):\n    s = '\xe0 la \xe7a'\n    return cp.checkpoint(block, x)  # na\xefve\n")
CP1252 = ("# coding: cp1252\n# \u20ac \u2026 \u201cquoted\u201d\nimport torch.utils.checkpoint as cp\n\n\n"
          "def run(block, x):\n    return cp.checkpoint(block, '\u2018\u20ac\u2019', x)\n")


@pytest.mark.parametrize("original", [
    pytest.param(LATIN_1.encode("latin-1"), id="latin-1"),
    pytest.param(CP1252.encode("cp1252"), id="cp1252"),
    pytest.param(b"\xef\xbb\xbf" + FLAGGED, id="utf-8-bom"),
    pytest.param(b"\x0c" + FLAGGED, id="leading-form-feed"),
    pytest.param(FLAGGED.replace(b"\n", b"\r\n"), id="crlf"),
    pytest.param(b"\xef\xbb\xbf\x0c" + FLAGGED.replace(b"\n", b"\r\n"), id="bom-form-feed-crlf"),
    pytest.param(FLAGGED.replace(b"\n", b"\r"), id="cr"),
    pytest.param(FLAGGED.replace(b"return", "# \u00e9\u2028\u0085\n    s = '\u00e9'; return".encode(), 1),
                 id="utf-8-line-separators"),
])
def test_fix_changes_no_byte_but_the_inserted_ones(lint, write, original):
    path = write("m.py", original)
    run = lint("--fix")
    assert run.code == 0, run.out + run.err
    fixed = path.read_bytes()
    at = fixed.find(INSERTED)
    assert at > 0 and fixed[:at] + fixed[at + len(INSERTED):] == original
    assert fixed[at - 1:at] == b"x" and fixed[at + len(INSERTED):at + len(INSERTED) + 1] == b")"


def test_fix_inserts_the_files_own_line_ending_in_a_multiline_call(lint, write):
    original = b"import torch.utils.checkpoint as cp\r\n\r\nout = cp.checkpoint(\r\n    f,\r\n    x,\r\n)\r\n"
    path = write("m.py", original)
    assert lint("--fix").code == 0
    assert path.read_bytes() == original.replace(b"    x,\r\n)", b"    x,\r\n    use_reentrant=False,\r\n)")
