"""What the overlay calls things: op categories, the phase rows of its tables, its error.
"""

from __future__ import annotations

from zero_sim.vocabulary import (
    COLLECTIVES,
    parse_op_name,
)


class OverlayError(ValueError):
    """A run that cannot be overlaid on this prediction; the message is one sentence saying why."""


# Op categories in the order tables list them.
CATEGORIES = ("fwd", "bwd", "recompute", "opt", *COLLECTIVES, "wait")
PHASE_ROWS = ("step time", "compute", "exposed comm", "forward", "backward", "optimizer",
              "optimizer wait", "optimizer update")


def op_kind(name: str) -> str | None:
    """``fwd``, ``bwd``, ``opt``, a collective or ``wait`` (None for a name outside the vocabulary)."""
    try:
        return parse_op_name(name).kind
    except ValueError:
        return None
