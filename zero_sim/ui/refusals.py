"""What ``simulate()`` would refuse, found without simulating: the checks it makes before the program.

A panel offers a value only where the simulator accepts it beside the other settings
(:mod:`zero_sim.ui.offers`).  Asking ``simulate()`` itself about every stop of every control
would run dozens of simulations per slider release, so :func:`refusal` asks
:func:`zero_sim.scenario.pipeline`, the part of ``simulate()`` that makes every check
before the program is built (settings, presets, workload, topology, the strategy's own
``validate``, the size budget).  It returns the sentence the simulator would refuse
with, or None.

What only the built program can tell (its exact op count against the size budget) is not
checked here; the simulator still refuses it when the panel simulates, and the panel shows
that sentence once.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from zero_sim.scenario import prepare


def refusal(settings: Mapping[str, Any]) -> str | None:
    """The one sentence ``simulate(**settings)`` would refuse these settings with, from every check
    it makes before building the program; None when they pass those checks.

    Answers are cached: a panel asks about the same few hundred combinations on every change."""
    key = tuple(sorted(settings.items(), key=lambda kv: kv[0]))
    try:
        hash(key)
    except TypeError:  # a value that is not hashable (a Calibration object): checked afresh
        return _refusal(dict(settings))
    return _cached(key)


@functools.lru_cache(maxsize=65_536)
def _cached(key: tuple) -> str | None:
    return _refusal(dict(key))


def _refusal(kwargs: dict) -> str | None:
    try:
        prepare(**kwargs)
    except ValueError as exc:  # ScenarioError, StrategyError, TopologyError, WorkloadError: one sentence
        return str(exc)
    return None


__all__ = ["refusal"]
