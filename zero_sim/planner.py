"""The planner's short import path, kept for the notebooks and users' scripts:
``from zero_sim.planner import plan`` is :func:`zero_sim.plan.planner.plan`."""

from __future__ import annotations

from zero_sim.plan.planner import (  # noqa: F401
    FITS,
    NO_FIT,
    PLANNER_SKIPS,
    REFUSED,
    candidates,
    knobs_label,
    plan,
    ranked,
    tally,
    too_close_to_call,
)
