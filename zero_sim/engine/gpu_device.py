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
        # Fired when a rank's communication starts or stops, so that the compute op it slows can
        # change its rate.
        self.comm_flip: dict[int, simpy.Event | None] = {r: None for r in engine.ranks}

    def run(self, rank: int, seconds: float):
        """Spend ``seconds`` of compute, at ``1 / (1 + slowdown)`` of its pace while comm is in flight."""
        env, remaining, slowdown = self.env, seconds, self.overlap_slowdown
        if not slowdown:
            yield env.timeout(seconds)
            return
        busy = self.engine.comm_busy
        while True:
            rate = 1.0 / (1.0 + slowdown) if busy[rank] else 1.0
            flip = self.comm_flip[rank] = env.event()
            began = env.now
            yield env.timeout(remaining / rate) | flip
            if not flip.triggered:
                break
            remaining -= (env.now - began) * rate
            if remaining <= 0:
                break
        self.comm_flip[rank] = None

    def collective_began(self, rank: int, key: tuple) -> None:
        if self.engine.comm_busy[rank] == 1:  # communication starts on this rank
            self._flip(rank)

    def collective_ended(self, rank: int, key: tuple) -> None:
        if self.engine.comm_busy[rank] == 0:  # communication stops on this rank
            self._flip(rank)

    def _flip(self, rank: int) -> None:
        flip = self.comm_flip[rank]
        if flip is not None:
            self.comm_flip[rank] = None
            flip.succeed()
