"""A GPU rank: compute slows while NCCL kernels run beside it.

NCCL's kernels hold SMs and draw HBM bandwidth for exactly as long as they run, so the part
of a compute op that runs while a collective is in flight on its rank progresses at
``1 / (1 + overlap_slowdown)`` of its rate; when the collective ends, the rest runs at full
rate.  The default slowdown by GPU and its sources are in
:func:`zero_sim.system.hardware.default_overlap_slowdown`.
"""

from __future__ import annotations

import simpy

from zero_sim.engine.rank_kinds import Device


class GpuDevice(Device):
    def __init__(self, overlap_slowdown: float = 0.0):
        self.overlap_slowdown = overlap_slowdown

    def attach(self, engine) -> None:
        super().attach(engine)
        # The compute op running on each rank, if any, so that communication starting or
        # stopping beside it can change its pace.
        self.running: dict[int, _Job | None] = {r: None for r in engine.ranks}

    def compute(self, rank: int, op):
        # The base rule (an op's own time, spent by run), without a generator in between.
        return self.run(rank, op.seconds) if op.seconds > 0 else ()

    def run(self, rank: int, seconds: float):
        """Spend ``seconds`` of compute, at ``1 / (1 + slowdown)`` of its pace while comm is in flight."""
        env = self.env
        if not self.overlap_slowdown:
            yield env.timeout(seconds)
            return
        # A timer per pace: when the pace changes a new timer replaces the old one, which is
        # ignored when it fires (cheaper than waiting on "timer or pace change" conditions).
        job = self.running[rank] = _Job(seconds, env.event())
        self._time(rank, job)
        yield job.done
        self.running[rank] = None

    def _time(self, rank: int, job: _Job) -> None:
        env = self.env
        job.rate = 1.0 / (1.0 + self.overlap_slowdown) if self.engine.comm_busy[rank] else 1.0
        job.began = env.now
        timer = job.timer = env.timeout(job.remaining / job.rate)
        timer.callbacks.append(job.expire)

    def collective_began(self, rank: int, key: tuple) -> None:
        if self.engine.comm_busy[rank] == 1:  # communication starts on this rank
            self._flip(rank)

    def collective_ended(self, rank: int, key: tuple) -> None:
        if self.engine.comm_busy[rank] == 0:  # communication stops on this rank
            self._flip(rank)

    def _flip(self, rank: int) -> None:
        """The pace of the op running on ``rank`` changes: bank the work done, time the rest."""
        job = self.running[rank]
        if job is None or job.done.triggered:
            return
        job.remaining -= (self.env.now - job.began) * job.rate
        if job.remaining <= 0:
            job.timer = None
            job.done.succeed()
        else:
            self._time(rank, job)


class _Job:
    """A compute op in progress on a GPU: the work left, at what pace since when."""

    __slots__ = ("remaining", "done", "rate", "began", "timer")

    def __init__(self, remaining: float, done: simpy.Event):
        self.remaining, self.done = remaining, done
        self.rate, self.began, self.timer = 1.0, 0.0, None

    def expire(self, timer: simpy.Event) -> None:
        """A timer fired: the op is done if it is still the timer of the op's current pace."""
        if timer is self.timer:
            self.done.succeed()
