"""Property: ``recheck lint --fix`` changes no byte of a file but the keyword it inserts.

Random sources hold RC001-flagged checkpoint calls of several shapes (one line, one argument a
line with a trailing comma, a keyword, a starred or a parenthesized last argument, a ``**``
splat that is never flagged) among comments, strings and identifiers with non-ASCII text, in
UTF-8 with and without a BOM, latin-1 and cp1252 with a coding line, with LF, CRLF or CR line
endings and form feeds.  Each goes through the real CLI; the result must be the original with
exactly the inserted text added, decode with the same encoding, and parse (issue 40).
"""

from __future__ import annotations

import ast
import codecs
import contextlib
import io
import re
import tempfile
import tokenize
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from recheck.cli import main

KEYWORD = "use_reentrant=False"
INSERTED = re.compile(rb",(?:\r\n|\r|\n)[ \t]*use_reentrant=False|, use_reentrant=False")

ENCODINGS = {  # name -> (coding line, BOM, the characters it can hold)
    "utf-8": ("", b"", None),
    "utf-8-sig": ("", b"\xef\xbb\xbf", None),
    "latin-1": ("# -*- coding: latin-1 -*-", b"", "".join(map(chr, range(1, 256)))),
    "cp1252": ("# coding: cp1252", b"", "".join(bytes([b]).decode("cp1252") for b in range(1, 256)
                                                 if b not in (0x81, 0x8D, 0x8F, 0x90, 0x9D))),
}
LINE_BREAKS = "\r\n"  # inside a comment or a one-line string anything else goes: \f, \x85, \u2028 included


def _text(alphabet: str | None, banned: str) -> st.SearchStrategy[str]:
    if alphabet is None:
        characters = st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00" + LINE_BREAKS + banned)
    else:
        characters = st.sampled_from([c for c in alphabet if c not in LINE_BREAKS + banned])
    return st.text(characters, max_size=12)


# (original, fixed) shapes of a call; {a} is an argument name, {nl} the file's line ending
SHAPES = [
    ("cp.checkpoint(block, {a})", "cp.checkpoint(block, {a}, use_reentrant=False)"),
    ("cp.checkpoint(block, {a}, preserve_rng_state=True)",
     "cp.checkpoint(block, {a}, preserve_rng_state=True, use_reentrant=False)"),
    ("cp.checkpoint(block, *{a})", "cp.checkpoint(block, *{a}, use_reentrant=False)"),
    ("cp.checkpoint(block, ({a}) )", "cp.checkpoint(block, ({a}), use_reentrant=False )"),
    ("cp.checkpoint(block,{a},)", "cp.checkpoint(block,{a}, use_reentrant=False,)"),
    ("cp.checkpoint({nl}        block,{nl}        {a},{nl}    )",
     "cp.checkpoint({nl}        block,{nl}        {a},{nl}        use_reentrant=False,{nl}    )"),
    ("cp.checkpoint(block, {a}  # {c}{nl}    )", "cp.checkpoint(block, {a}, use_reentrant=False  # {c}{nl}    )"),
    ("cp.checkpoint_sequential([block], 1, {a})", "cp.checkpoint_sequential([block], 1, {a}, use_reentrant=False)"),
    ("cp.checkpoint(block, {a}, **options)", "cp.checkpoint(block, {a}, **options)"),  # never flagged
]


@st.composite
def sources(draw) -> tuple[str, bytes, bytes, int]:
    """``(encoding, original bytes, expected bytes, calls fixed)``."""
    encoding = draw(st.sampled_from(sorted(ENCODINGS)))
    coding, bom, alphabet = ENCODINGS[encoding]
    # CR alone only in UTF-8: tokenize.detect_encoding (the linter's reader) reads no coding line in a
    # file without \n, so a latin-1 one is "not valid UTF-8" there and never fixed
    nl = draw(st.sampled_from(["\n", "\r\n", "\r"] if coding == "" else ["\n", "\r\n"]))
    comment = _text(alphabet, "")
    string = _text(alphabet, "'\\")
    original, fixed, count = [], [], 0

    def both(line: str, fixed_line: str | None = None) -> None:
        original.append(line)
        fixed.append(line if fixed_line is None else fixed_line)

    if coding:
        both(coding)
    both(("\f" if draw(st.booleans()) else "") + "import torch.utils.checkpoint as cp")
    both("# " + draw(comment))
    both("caf\u00e9 = '" + draw(string) + "'")
    both("")
    both("def run(block, x, xs, options):")
    for index in range(draw(st.integers(1, 4))):
        shape, fixed_shape = draw(st.sampled_from(SHAPES))
        fill = {"a": draw(st.sampled_from(["x", "xs", "caf\u00e9"])) if "*" not in shape else "xs",
                "c": draw(comment), "nl": nl}
        prefix = f"    s{index} = '{draw(string)}'; " if draw(st.booleans()) else "    "
        if draw(st.booleans()):
            both("    # " + draw(comment))
        both(f"{prefix}y{index} = {shape.format(**fill)}", f"{prefix}y{index} = {fixed_shape.format(**fill)}")
        count += shape != fixed_shape
    both("    return x" + ("\f" if draw(st.booleans()) else ""))
    ending = nl if draw(st.booleans()) else ""
    codec = "utf-8" if encoding == "utf-8-sig" else encoding
    return (encoding, bom + (nl.join(original) + ending).encode(codec),
            bom + (nl.join(fixed) + ending).encode(codec), count)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sources())
def test_fix_changes_no_byte_outside_the_inserted_text(case):
    encoding, original, expected, count = case
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder, "m.py")
        path.write_bytes(original)
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(["lint", "--no-cache", "--fix", str(path)])
        result = path.read_bytes()
    assert err.getvalue() == ""
    assert code == 0, out.getvalue()
    assert out.getvalue().startswith(f"Fixed {count} finding" if count else "All checks passed!")
    assert INSERTED.sub(b"", result) == original  # every byte outside the inserted text is the file's own
    assert result == expected
    assert codecs.lookup(tokenize.detect_encoding(io.BytesIO(result).readline)[0]) == codecs.lookup(encoding)
    ast.parse(result.decode(encoding))
