"""zero-sim: see where a data-parallel training step's time and memory go.

``simulate(**settings)`` runs the discrete-event model of DDP, ZeRO-1/2/3 and FSDP and
returns a :class:`~zero_sim.results.SimResult` whose ``.metrics`` is the CLI's JSON.

The package imports neither torch nor ``real_runs``.  Its names are loaded on first use,
so ``real_runs`` can import :mod:`zero_sim.vocabulary` without loading the simulator.
"""

from __future__ import annotations

import importlib

_EXPORTS = {"simulate": "zero_sim.scenario", "ScenarioError": "zero_sim.scenario",
            "SimResult": "zero_sim.results"}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'zero_sim' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
