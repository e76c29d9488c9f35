"""zero-sim: see where a data-parallel training step's time and memory go.

``simulate(**settings)`` runs the discrete-event model of DDP, ZeRO-1/2/3 and FSDP and
returns a :class:`~zero_sim.results.SimResult` whose ``.metrics`` is the CLI's JSON.
"""

from zero_sim.results import SimResult
from zero_sim.simulate import ScenarioError, simulate

__all__ = ["SimResult", "ScenarioError", "simulate"]
