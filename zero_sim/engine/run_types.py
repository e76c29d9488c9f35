"""What the engine is given besides its program (:class:`EngineConfig`, :class:`Straggler`)
and what it gives back (:class:`RunOutput` per run, holding an
:class:`~zero_sim.vocabulary.records.OpRecord` per op).

The fields' meanings are the engine's rules (:mod:`zero_sim.engine.engine`); they live
here so that callers can build a configuration and read a result without the engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from zero_sim.engine.gpu_device import GpuDevice
from zero_sim.engine.rank_kinds import Device
from zero_sim.system.collectives import CollectivePlan
from zero_sim.vocabulary.records import OpRecord


@dataclass(frozen=True)
class Straggler:
    """Each rank stalls before a collective with ``probability``, for ``seconds`` (seeded)."""

    probability: float
    seconds: float
    seed: int = 0


@dataclass
class EngineConfig:
    steps: int = 2
    host_overhead_s: float = 10e-6
    explicit_ranks: bool = False  # simulate every rank (True) or rank 0 standing for all (False)
    straggler: Straggler | None = None
    # What the ranks are: a GPU (compute slowed beside collectives) or a CPU (the host thread
    # computes), either one with cores shared with communication; see zero_sim.engine.rank_kinds.
    device: Device = field(default_factory=GpuDevice)


@dataclass
class RunOutput:
    records: list[OpRecord]
    memory: dict[int, list[tuple[float, str, int]]]  # rank -> (t, category, total after change)
    resident: dict[str, int]
    step_ends: dict[int, list[float]]  # rank -> end time of each step
    simulated_ranks: list[int]
    events: int
    plans: dict[int, CollectivePlan] = field(default_factory=dict)  # op index -> plan
    # op index -> seconds it took in the last step on the first simulated rank (what
    # zero_sim.engine.retime re-times with sampled inputs); a sync op's is its wait.
    op_seconds: dict[int, float] = field(default_factory=dict)
