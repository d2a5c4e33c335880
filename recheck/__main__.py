"""``python -m recheck``: the same entry point as the ``recheck`` script."""

import sys

from recheck.cli import main

sys.exit(main())
