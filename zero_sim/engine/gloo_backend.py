"""gloo's collectives: worker threads instead of a comm stream.

gloo's process group hands each async collective to a pool of worker threads (two per device
by default), so two collectives of one stream run at once, started in stream order.  Their
per-call work (the latency part of a collective) is still paid one call at a time per process
group: two threads do not make two small calls cost one, but a small call behind a large one
runs while the large one's bytes stream.  A call whose per-call work has to wait for another's
pays the calibrated *queued* latency instead: the sweep times small calls queued back to back
as well as alone, and the second thread's hand-offs overlap the first's, so a queue costs less
per call than calls made one at a time.

gloo has no comm stream: a call is handed to its threads when the host makes it, and on a CPU
the host makes it only after the compute before it has run; on a GPU, gloo's CUDA path also
makes its streams wait on the current stream (torch, ``c10d/ProcessGroupGlooDetail.hpp``,
``initializeStreamsEvents``).  So every collective follows the compute issued before it.
"""

from __future__ import annotations

import simpy

from zero_sim.engine.rank_kinds import Backend


class GlooBackend(Backend):
    always_after_compute = True

    def __init__(self, in_flight: int = 2):
        self.in_flight = in_flight

    def attach(self, engine) -> None:
        super().attach(engine)
        # One lock per process group and stream: the per-call part of a collective.
        self.call_locks: dict[tuple, simpy.Resource] = {}

    def stream_slots(self) -> simpy.Resource | None:
        return simpy.Resource(self.env, self.in_flight) if self.in_flight > 1 else None

    def admit(self, rank: int, step: int, op, slots: simpy.Resource | None):
        if slots is None:
            yield from self.engine.collective(rank, step, op)
            return
        # Start in stream order, but let up to ``in_flight`` run at once.
        slot = slots.request()
        yield slot
        self.env.process(self._in_slot(rank, step, op, slots, slot))

    def _in_slot(self, rank: int, step: int, op, slots: simpy.Resource, slot):
        yield from self.engine.collective(rank, step, op)
        slots.release(slot)

    def stage_latency(self, stage, caller: tuple, ranks: tuple[int, ...]):
        if self.in_flight <= 1:
            yield self.engine.device.latency(stage.latency_s, ranks)
            return
        lock = self.call_locks.get(caller)
        if lock is None:
            lock = self.call_locks[caller] = simpy.Resource(self.env, 1)
        # Behind another call's per-call work, this one pays the queued latency.
        queued = lock.count > 0 and stage.queued_latency_s is not None
        with lock.request() as turn:
            yield turn
            yield self.engine.device.latency(stage.queued_latency_s if queued else stage.latency_s, ranks)
