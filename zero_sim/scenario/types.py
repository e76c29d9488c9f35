"""The typed scenario: one simulation's settings, resolved, frozen, and read by attribute.

``simulate(**keywords)`` is the friendly front; it checks the keywords against the schema
(:mod:`zero_sim.scenario.settings` and each strategy's knobs) and resolves what was left to
the simulator (the preset's name, the GPU, the overlap slowdown, ...) into a
:class:`Scenario`.  Everything downstream (results, traces, the overlay, validation) reads it
by attribute: ``result.scenario.cluster.gpus``, ``result.scenario.workload.params``,
``result.scenario.knobs.bucket_mb``.

The sections are derived from the schema: every common setting carries the ``section`` its
value belongs to, and each section class below is built from those declarations (their
names, types and order), plus the few values the simulator works out that no setting names
(:data:`DERIVED`).  :meth:`Scenario.to_dict` is the flat form ``--json`` and the trace files
have always carried, with the same keys in the same order.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from zero_sim.scenario.settings import COMMON
from zero_sim.settings import settings_record

SECTIONS = ("workload", "training", "cluster", "hardware", "simulation", "inputs")

# Values the simulator resolves that no setting names, by section, in the order the flat form
# lists them after the settings and the strategy's knobs.
DERIVED: dict[str, tuple[tuple[str, Any], ...]] = {
    "inputs": (("config_file", str | None),),  # the --*-config file read, if any
    "training": (("stack_given", bool),),  # the stack was named (or implied by a config), not defaulted
    "hardware": (
        ("collective_cpu_us", float),  # CPU time a collective takes from compute (CPU calibration)
        ("slowest_rank_factor", float),  # how much slower the slowest of N GPUs runs (gpu_spread)
        ("comm_rate_while_computing", float),  # pace of a collective's per-call work while ranks compute
        ("comm_bytes_rate_while_computing", float),  # pace of its bytes while ranks compute
    ),
    "cluster": (("topology_description", str),),  # the topology's links in words
    "workload": (("workload_description", str),),  # the model's shape in words
}
DERIVED_ORDER = ("stack_given", "config_file", "collective_cpu_us", "slowest_rank_factor",
                 "comm_rate_while_computing", "comm_bytes_rate_while_computing",
                 "topology_description", "workload_description")
_SECTION_OF_DERIVED = {name: section for section, values in DERIVED.items() for name, _ in values}


def _section_class(section: str) -> type:
    """A frozen dataclass: one field per setting of ``section`` (schema order), then its derived values."""
    return settings_record(f"{section.capitalize()}Settings", [s for s in COMMON if s.section == section],
                           DERIVED.get(section, ()), module=__name__)


WorkloadSettings = _section_class("workload")  # model preset or shape, sequence, attention, element-wise
TrainingSettings = _section_class("training")  # strategy, batch, accumulation, precision, recompute
ClusterSettings = _section_class("cluster")  # ranks, nodes, topology, GPU, links, collectives, stragglers
HardwareSettings = _section_class("hardware")  # compute efficiency, memory overheads, overlap slowdown
SimulationSettings = _section_class("simulation")  # steps, explicit ranks, the size budget
InputSettings = _section_class("inputs")  # calibration and configuration files
SECTION_CLASSES = {"workload": WorkloadSettings, "training": TrainingSettings, "cluster": ClusterSettings,
                   "hardware": HardwareSettings, "simulation": SimulationSettings, "inputs": InputSettings}


@dataclass(frozen=True)
class Scenario:
    """One simulation's resolved settings, by section; ``knobs`` are the strategy's own."""

    workload: Any  # WorkloadSettings
    training: Any  # TrainingSettings
    cluster: Any  # ClusterSettings
    hardware: Any  # HardwareSettings
    simulation: Any  # SimulationSettings
    inputs: Any  # InputSettings
    knobs: Any  # the strategy's knobs (zero_sim.strategies), a frozen dataclass

    @classmethod
    def from_values(cls, values: dict[str, Any], knobs: Any) -> Scenario:
        """Sort a flat name -> value mapping (every common setting and derived value) into sections."""
        sections = {}
        for section, klass in SECTION_CLASSES.items():
            sections[section] = klass(**{f.name: values[f.name] for f in fields(klass)})
        return cls(**sections, knobs=knobs)

    @property
    def strategy(self) -> str:
        return self.training.strategy

    def to_dict(self) -> dict[str, Any]:
        """The flat form: every common setting in schema order, the knobs, then the derived values."""
        flat = {s.name: getattr(getattr(self, s.section), s.name) for s in COMMON}
        flat |= {f.name: getattr(self.knobs, f.name) for f in fields(self.knobs)}  # declaration order
        for name in DERIVED_ORDER:
            flat[name] = getattr(getattr(self, _SECTION_OF_DERIVED[name]), name)
        return flat
