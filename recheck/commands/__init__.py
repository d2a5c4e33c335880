"""The ``recheck`` subcommands, one module each.

Each module defines ``NAME``, ``HELP``, ``add_arguments(parser)`` and ``run(ns) -> int``.
Importing a command module must stay cheap: torch is imported inside ``run``.
"""

#: The subcommands in the order ``recheck --help`` lists them.
COMMAND_MODULES = (
    "recheck.commands.check",
    "recheck.commands.run_program",  # `recheck run`
    "recheck.commands.lint",
    "recheck.commands.cost",
    "recheck.commands.rules",
    "recheck.commands.explain",
    "recheck.commands.lab",
)
