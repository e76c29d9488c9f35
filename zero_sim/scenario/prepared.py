"""A scenario prepared for its run: what :func:`zero_sim.scenario.pipeline.prepare` hands on.

Its own module so that both the pipeline, which builds it, and the reporting, which reads it
(:mod:`zero_sim.scenario.reporting`), can name it without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from zero_sim.calibration import Calibration
from zero_sim.scenario.settings import CommonSettings
from zero_sim.strategies import Context
from zero_sim.system.hardware import ComputeModel
from zero_sim.system.workload import Workload


@dataclass(frozen=True)
class Prepared:
    """A scenario checked up to the program: every setting resolved, the workload, topology,
    compute model and the strategy's context built, and the strategy's own checks passed."""

    reading: Any  # ConfigReading of a --*-config file, or None
    settings: CommonSettings
    knobs: Any  # the strategy's typed knobs
    strategy: Any
    calibration: Calibration | None
    workload: Workload
    topology: Any
    gpu: Any
    compute: ComputeModel
    ctx: Context
    stack_notes: tuple[str, ...] = ()
    stack_given: bool = False
