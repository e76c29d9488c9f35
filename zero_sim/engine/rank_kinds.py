"""What a device or a collective library adds to the engine's core: two small protocols.

The core (:mod:`zero_sim.engine.engine`) knows host threads, FIFO streams, collectives that
start when every member arrives, and fluid links.  What differs between a GPU and a CPU rank,
or between NCCL and gloo, plugs in beside it, the way a simpy resource subclass overrides
``_do_put`` and ``_do_get``:

* a :class:`Device` says how long a compute op takes given the communication in flight when
  it starts (:meth:`Device.duration`) and how that time is spent while collectives start and
  end beside it (:meth:`Device.run`), hears when a collective starts and ends on its rank,
  says how a collective's per-call latency is paid (:meth:`Device.latency`), and whether the
  host thread runs compute itself (``host_runs_compute``).  Kinds:
  :class:`~zero_sim.engine.gpu_device.GpuDevice`, :class:`~zero_sim.engine.cpu_device.CpuDevice`;
  :class:`~zero_sim.engine.shared_cores.SharedCores` wraps either one with the cost of cores
  shared between compute and communication that a CPU calibration measures.
* a :class:`Backend` says how a comm stream admits its collectives (:meth:`Backend.admit`),
  how a plan stage's latency is paid among the calls of one process group
  (:meth:`Backend.stage_latency`), and whether every collective follows the compute issued
  before it (``always_after_compute``).  This module's :class:`Backend` is NCCL's behaviour;
  :class:`~zero_sim.engine.gloo_backend.GlooBackend` is gloo's.

The base classes are the plain behaviour: compute takes its own time, a latency is a plain
wait, and one collective of a stream runs at a time.  ``attach(engine)`` hands each plug-in
the :class:`~zero_sim.engine.engine.Engine` it serves (its ``env``, ``ranks``, ``comm_busy``,
``net``, ``device`` and ``collective()``).
"""

from __future__ import annotations

import simpy

from zero_sim.engine.program import Op
from zero_sim.system.collectives import Stage


class Device:
    """A rank's hardware as the engine sees it: the plain behaviour, compute unaffected by communication."""

    host_runs_compute = False  # True: the host thread waits for each compute op (CPU training)
    overlap_slowdown = 0.0  # reported with the scenario; each kind applies it its own way

    def attach(self, engine) -> None:
        """Called once by the engine before it runs: keep what the rules below need."""
        self.engine, self.env = engine, engine.env

    def compute(self, rank: int, op: Op):
        """Run compute op ``op`` on ``rank`` (a simpy generator): its duration, spent by :meth:`run`."""
        seconds = self.duration(rank, op)
        if seconds > 0:
            yield from self.run(rank, seconds)

    def duration(self, rank: int, op: Op) -> float:
        """How long ``op`` takes given the communication in flight on ``rank`` as it starts: its own time."""
        return op.seconds

    def run(self, rank: int, seconds: float):
        """Spend ``seconds`` (> 0) of compute on ``rank`` (a simpy generator): a plain wait."""
        yield self.env.timeout(seconds)

    def collective_began(self, rank: int, key: tuple) -> None:
        """A collective is now in flight on ``rank`` (``engine.comm_busy[rank]`` already counts it)."""

    def collective_ended(self, rank: int, key: tuple) -> None:
        """A collective finished on ``rank`` (``engine.comm_busy[rank]`` no longer counts it)."""

    def latency(self, seconds: float, ranks: tuple[int, ...]) -> simpy.Event:
        """The per-call part of a collective among ``ranks``: a plain wait."""
        return self.env.timeout(seconds)


class Backend:
    """A collective library's streams: NCCL's, one collective at a time on each comm stream."""

    # A collective waits for the compute issued just before it only when its op says so
    # (``Op.after_compute``): torch's NCCL process group makes its stream wait on the current one.
    always_after_compute = False

    def attach(self, engine) -> None:
        self.engine, self.env = engine, engine.env

    def stream_slots(self) -> simpy.Resource | None:
        """What a comm stream holds to run several collectives at once (None: one at a time)."""
        return None

    def admit(self, rank: int, step: int, op: Op, slots: simpy.Resource | None):
        """Run collective ``op`` from the head of its stream (a simpy generator): the stream waits
        until it ends."""
        return self.engine.collective(rank, step, op)

    def stage_latency(self, stage: Stage, caller: tuple, ranks: tuple[int, ...]):
        """Pay one plan stage's latency (a simpy generator); ``caller`` is (stream, group, index)."""
        yield self.engine.device.latency(stage.latency_s, ranks)

