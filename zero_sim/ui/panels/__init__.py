"""The notebook panels, one module each; every one has the shape of :class:`zero_sim.ui.panel.Panel`.

* :class:`TimelineExplorer`: one scenario, a Gantt per rank x stream, memory over time,
  headline metrics, and a button that writes a Perfetto trace;
* :class:`ComparePanel`: several variants of one scenario side by side on one time axis;
* :class:`MemoryCalculator`: the ZeRO paper's per-rank model-state arithmetic, no simulation;
* :class:`NcclFitPanel`: paste nccl-tests output, fit latency and bus bandwidth;
* :class:`Planner`: which strategies and knobs fit in memory, and which is fastest;
* :class:`StepThrough`: one step of DDP and ZeRO-1/2/3 (or FSDP) on 4 ranks, played moment
  by moment: who keeps which shard, what is in flight, what runs on which link.

Exercises with a check and an answer button are in :mod:`zero_sim.ui.panels.exercises`.

Why panels and not plotting cells: the point of the suite is to *move* something
(bandwidth, bucket size, N) and see the step change.  ``simulate()`` is fast enough for
GPT-2 on 8 ranks that a panel can recompute on every slider release, and its figure is
redrawn in place (:class:`zero_sim.ui.figure.Figure`).
"""

from zero_sim.ui.panels.compare import ComparePanel
from zero_sim.ui.panels.memory import MemoryCalculator
from zero_sim.ui.panels.nccl_fit import NcclFitPanel
from zero_sim.ui.panels.planner import Planner
from zero_sim.ui.panels.step_through import StepThrough
from zero_sim.ui.panels.timeline import TimelineExplorer

__all__ = ["ComparePanel", "MemoryCalculator", "NcclFitPanel", "Planner", "StepThrough", "TimelineExplorer"]
