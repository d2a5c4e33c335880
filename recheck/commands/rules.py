"""``recheck rules``: list the rule catalogue (code, name, one line)."""

from __future__ import annotations

import argparse
import json

from recheck.catalogue import all_rules, entry

NAME = "rules"
HELP = "list the rules: code, name and what each finds"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--format", choices=("text", "json"), default="text", help="output format (default: text)")


def run(ns: argparse.Namespace) -> int:
    rules = all_rules()
    if ns.format == "json":
        print(json.dumps([{"code": r.code, "name": r.name, "summary": r.summary, "static": r.static,
                           "runtime_kinds": r.runtime_kinds, "explains": list(entry(r.code).kinds),
                           "advice": entry(r.code).advice, "fixable": entry(r.code).fixable, "doc": r.doc_ref}
                          for r in rules], indent=2))
        return 0
    width = max(len(r.name) for r in rules)
    for rule in rules:
        scope = "" if rule.static else "  (run time only)"
        print(f"{rule.code}  {rule.name:<{width}}  {rule.summary}{scope}")
    print(f"\n{len(rules)} rules; `recheck explain CODE` prints one in full.")
    return 0
