"""``python -m real_runs.cluster ...``: see :mod:`real_runs.cluster` for the commands."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
