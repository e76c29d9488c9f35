"""A CPU rank (the emulated cluster): the host thread computes, and gloo's threads take cores.

On a CPU the rules differ from a GPU's, and each comes from what the CPU calibration
measures (:mod:`zero_sim.calibration`, ``cpu`` section):

* the host thread *is* the compute stream: it runs each compute op itself, so it cannot issue
  ahead of it (communication still runs on gloo's own threads);
* a compute op that *starts* while a collective is in flight runs ``1 + overlap_slowdown``
  times longer: gloo's threads take cores from it for the whole op, not only for the part
  that overlaps (the rule the calibration's ``overlap_slowdown`` is fitted with).

The calibration's other CPU figures (per-collective CPU time, communication's pace while the
ranks compute) are cores shared with communication: :mod:`zero_sim.engine.shared_cores`.
"""

from __future__ import annotations

from zero_sim.engine.rank_kinds import Device


class CpuDevice(Device):
    host_runs_compute = True

    def __init__(self, overlap_slowdown: float = 0.0):
        self.overlap_slowdown = overlap_slowdown

    def duration(self, rank: int, op) -> float:
        seconds = op.seconds
        if self.overlap_slowdown and self.engine.comm_busy[rank]:
            seconds *= 1.0 + self.overlap_slowdown
        return seconds
