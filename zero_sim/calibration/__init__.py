"""Measured inputs for the simulator: the calibration file (:mod:`.format`) and how
measurements become its figures (:mod:`.fit`).  Measuring itself is in ``sim2real.measure``."""

from zero_sim.calibration.fit import (
    compute_from_layers,
    cpu_from_sweep,
    fit_nccl_tests_text,
    fit_sweep,
    topology_from_imports,
)
from zero_sim.calibration.format import (
    FORMAT,
    Calibration,
    CalibrationError,
    CollectiveFit,
    ComputeCalibration,
    CpuCalibration,
)

__all__ = ["FORMAT", "Calibration", "CalibrationError", "CollectiveFit", "ComputeCalibration",
           "CpuCalibration", "compute_from_layers", "cpu_from_sweep", "fit_nccl_tests_text", "fit_sweep",
           "topology_from_imports"]
