"""``python -m real_runs.microbench ...``: see :mod:`real_runs.microbench` for the commands."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
