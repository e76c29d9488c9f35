"""A scenario: what a user asked for, resolved, prepared and simulated.

The modules, in the order a call to :func:`simulate` meets them:

* :mod:`~zero_sim.scenario.settings`: the settings every simulation takes (``COMMON``), each a
  ``Setting`` of the one schema (:mod:`zero_sim.settings`) tagged with its section;
* :mod:`~zero_sim.scenario.inputs`: what a caller typed made into settings (preset names,
  the software stack's settings filled in);
* :mod:`~zero_sim.scenario.machine`: the machine a scenario runs on (topology, spread, compute
  model, who prices the host's launches, precision, FP8);
* :mod:`~zero_sim.scenario.types`: the typed, frozen ``Scenario`` a result carries;
* :mod:`~zero_sim.scenario.pipeline`: ``resolve``, ``prepare`` and ``simulate`` themselves.
"""

from __future__ import annotations

from zero_sim.scenario.pipeline import Prepared, Resolved, prepare, rank_figures, resolve, simulate
from zero_sim.settings import ScenarioError

__all__ = ["Prepared", "Resolved", "ScenarioError", "prepare", "rank_figures", "resolve", "simulate"]
