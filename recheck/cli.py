"""The ``recheck`` command line: a thin argparse shell over the subcommand modules.

Exit codes (docs/exit-codes.md): 0 clean, 1 findings, 2 usage, configuration or input error
(over findings), 130 interrupted.
Importing this module, and running ``rules``, ``explain``, ``lab`` or ``lint``, never
imports torch.
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys
from types import ModuleType
from typing import Sequence

from recheck import __version__
from recheck.commands import COMMAND_MODULES
from recheck.config import ConfigError
from recheck.dependencies import MissingDependency

__all__ = ["build_parser", "main"]

DESCRIPTION = (
    "recheck proves that activation checkpointing recomputes exactly what the forward computed: "
    "a bit-for-bit dynamic checker, a linter for checkpointed regions, and a rule catalogue."
)


def _commands() -> list[ModuleType]:
    modules = []
    for name in COMMAND_MODULES:
        try:
            modules.append(importlib.import_module(name))
        except ModuleNotFoundError as exc:  # a command left out of a partial install
            if exc.name != name:
                raise
    return modules


#: What argparse takes for a value rather than an option: by default only ``-5`` and ``-.5``,
#: so ``--budget -5GiB`` or ``--atol -1e-3`` read "expected one argument".  No recheck option
#: is spelled with a digit, so anything that starts ``-<digit>`` is a value and reaches the
#: option's own check, which says what is wrong with it.
_NEGATIVE_VALUE = re.compile(r"^-\.?\d")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="recheck", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"recheck {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in _commands():
        command = sub.add_parser(module.NAME, help=module.HELP, description=module.HELP)
        command._negative_number_matcher = _NEGATIVE_VALUE  # see _NEGATIVE_VALUE
        module.add_arguments(command)
        command.set_defaults(_run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)
    if not getattr(ns, "_run", None):
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(ns._run(ns))
    except ConfigError as exc:  # "<file>: <key>: <reason>"
        print(f"recheck: {exc}", file=sys.stderr)
        return 2
    except MissingDependency as exc:
        print(f"recheck: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("recheck: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `recheck lint | head`: not an error
        sys.stderr.close()
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
