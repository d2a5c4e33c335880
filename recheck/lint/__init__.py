"""``recheck lint``: a static linter for activation-checkpointed regions.

Phase one (:mod:`recheck.lint.extract`) reads each candidate file into plain facts;
phase two (:mod:`recheck.lint.regions`) finds the regions across files and reports the
hazards inside them.  This package never imports torch; ``--fix``
(:mod:`recheck.lint.fix`) splices its insertions into the file's bytes at :mod:`ast` positions.
"""

from __future__ import annotations

from recheck.lint.engine import LintResult, lint_paths, lint_sources
from recheck.lint.settings import LintOptions

__all__ = ["LintOptions", "LintResult", "lint_paths", "lint_sources"]
