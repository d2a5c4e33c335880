"""MkDocs hook: the rule reference, one page per rule, generated at build time from ``rules/*.md``,
and the table of dynamic finding kinds, from :data:`recheck.findings.DECLARED`.

The documents stay where ``recheck explain`` and the wheel read them; this hook parses them with
the catalogue's own parser (so a document the catalogue rejects fails the build) and lays each out
in ruff's shape: *What it does*, *Why is this bad?*, *Example*, *Use instead*, then the rest.
"""

from __future__ import annotations

from mkdocs.structure.files import File, Files

from recheck.catalogue import all_rules
from recheck.findings import DECLARED

#: where a page takes the table of finding kinds
KINDS_MARKER = "<!-- kinds: generated from recheck.findings.DECLARED -->"
#: the catalogue's heading -> ruff's
HEADINGS = {"Why it breaks recomputation": "Why is this bad?"}
NAV_TITLE = "Rules"


def _page(rule) -> str:
    lines = [f"# {rule.code} {rule.name}", ""]
    lines += [f"*Found by:* {'the linter and the dynamic checker' if rule.static else 'the dynamic checker only'}."]
    for heading, body in rule.sections.items():
        lines += ["", f"## {HEADINGS.get(heading, heading)}", "", body.rstrip()]
    lines += ["", f"Source: `{rule.doc_ref}`; in a terminal: `recheck explain {rule.code}`.", ""]
    return "\n".join(lines)


def _index() -> str:
    lines = [
        "# Rules",
        "",
        "Every finding carries a rule code; `recheck rules` lists them (`--format json` for a program) and",
        "`recheck explain RC106` (a code or a name) prints a rule's document (what it finds, why it breaks",
        "recomputation, an example, the fix, how the dynamic checker reports it). The documents live in",
        "`rules/` and ship inside the wheel; these pages are generated from them when the site is built.",
        "RC0xx rules are about the checkpoint call, RC1xx about what runs inside a region, RC2xx about what",
        "happens around it (found at run time only). Suppress one on a line with `# noqa: RC104` or",
        "`# recheck: ignore[RC104]`, in a file with `# recheck: ignore-file`, in a project with `ignore` in",
        "[`[tool.recheck]`](../configuration.md).",
        "",
        "| code | name | what it finds |",
        "|---|---|---|",
    ]
    lines += [f"| [{r.code}]({r.code}.md) | {r.name} | {r.summary} |" for r in all_rules()]
    return "\n".join(lines) + "\n"


def on_config(config):
    """Replace the ``Rules`` navigation entry by the index and one entry per rule."""
    for item in config["nav"]:
        if isinstance(item, dict) and NAV_TITLE in item:
            item[NAV_TITLE] = [{"Overview": "rules/index.md"}] + [
                {f"{r.code} {r.name}": f"rules/{r.code}.md"} for r in all_rules()]
    return config


def on_files(files: Files, config) -> Files:
    files.append(File.generated(config, "rules/index.md", content=_index()))
    for rule in all_rules():
        files.append(File.generated(config, f"rules/{rule.code}.md", content=_page(rule)))
    return files


def kinds_table() -> str:
    """Every dynamic finding kind in severity order, its meaning and the rules that name its cause."""
    lines = ["| kind | meaning | rules |", "|---|---|---|"]
    lines += [f"| `{k.name}` | {k.meaning} | {', '.join(f'[{c}](rules/{c}.md)' for c in k.rules) or '(a consequence)'} |"
              for k in DECLARED]
    return "\n".join(lines)


def on_page_markdown(markdown: str, page, config, files) -> str:
    return markdown.replace(KINDS_MARKER, kinds_table())
