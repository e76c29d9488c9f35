"""``python -m zero_sim``: the simulator's own commands (no torch needed)."""

import sys

from zero_sim.cli import main

sys.exit(main())
