"""zero-sim: see where a data-parallel training step's time and memory go.

``simulate(**settings)`` runs the discrete-event model of DDP, ZeRO-1/2/3 and FSDP and
returns a :class:`~zero_sim.results.SimResult` whose ``.metrics`` is the CLI's JSON.

The package imports neither torch nor ``real_runs``.  Its names are loaded on first use,
so ``real_runs`` can import :mod:`zero_sim.vocabulary` without loading the simulator.  What
it does load is :mod:`zero_sim.results` and the ui's plots (not matplotlib, which loads with
the first picture): it joins them, so that results need not import the ui above it.
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


# A result's plot_timeline() and plot_memory() draw with the ui's plots.  results may not import
# the ui, which sits above it; the root, above both and imported before any result can exist,
# joins them.  Both modules are light: the plots load matplotlib only when they draw.
from zero_sim.results import draw_with  # noqa: E402
from zero_sim.ui.plots import plot_memory, plot_timeline  # noqa: E402

draw_with(timeline=plot_timeline, memory=plot_memory)
