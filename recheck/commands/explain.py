"""``recheck explain CODE``: print one rule's document."""

from __future__ import annotations

import argparse
import sys

from recheck.catalogue import all_rules, get_rule

NAME = "explain"
HELP = "print a rule's document (what it finds, why, examples, fix)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("rule", metavar="CODE", help="a rule code such as RC106, or its name")


def run(ns: argparse.Namespace) -> int:
    try:
        rule = get_rule(ns.rule)
    except KeyError:
        codes = ", ".join(r.code for r in all_rules())
        print(f"recheck explain: unknown rule {ns.rule!r}; known rules: {codes}", file=sys.stderr)
        return 2
    sys.stdout.write(rule.text if rule.text.endswith("\n") else rule.text + "\n")
    return 0
