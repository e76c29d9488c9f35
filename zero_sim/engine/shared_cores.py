"""Cores shared by compute and communication: what a CPU calibration measures beside the slowdown.

:class:`SharedCores` wraps a :class:`~zero_sim.engine.rank_kinds.Device` and adds two costs,
both from the calibration's ``cpu`` section (:mod:`zero_sim.calibration`), whatever kind of
device the scenario names:

* every collective takes ``collective_cpu_s`` from the first compute op that runs while it is
  in flight (the per-call work of gloo's threads); a collective that runs while its rank
  computes nothing costs nothing.  An op loses at most its own time to them: a fair scheduler
  leaves the compute thread half its core, and the rest of that work runs once the rank stops
  computing;
* the other way round, while a member rank computes, a collective's per-call work (its
  latency) moves at ``comm_rate_while_computing`` of its pace and its bytes at
  ``comm_bytes_rate_while_computing``: with more ranks than cores, gloo's threads wait for a
  core at every hand-off until the compute pauses, while streaming needs only the share of a
  core a fair scheduler grants (calibrated from a queue timed idle and under compute, and
  from the CPU the sweep's large calls used).

How long an op takes and how that time is spent stay the wrapped device's
(:meth:`~zero_sim.engine.rank_kinds.Device.duration`, :meth:`~zero_sim.engine.rank_kinds.Device.run`).
"""

from __future__ import annotations

import simpy

from zero_sim.engine.rank_kinds import Device


class SharedCores(Device):
    def __init__(self, device: Device, collective_cpu_s: float = 0.0,
                 comm_rate_while_computing: float = 1.0,
                 comm_bytes_rate_while_computing: float | None = None):
        rho = comm_rate_while_computing
        rho_bytes = rho if comm_bytes_rate_while_computing is None else comm_bytes_rate_while_computing
        for name, value in (("comm_rate_while_computing", rho),
                            ("comm_bytes_rate_while_computing", rho_bytes)):
            if not 0 < value <= 1:
                raise ValueError(f"{name} must be in (0, 1], got {value}")
        self.device, self.collective_cpu_s = device, collective_cpu_s
        self.rho, self.rho_bytes = rho, rho_bytes
        self.host_runs_compute, self.overlap_slowdown = device.host_runs_compute, device.overlap_slowdown

    def attach(self, engine) -> None:
        super().attach(engine)
        self.device.attach(engine)
        self.net = engine.net
        self.computing: dict[int, bool] = {r: False for r in engine.ranks}
        # Collectives in flight not yet charged to any compute, and what the compute op running
        # now owes on top of its own time.
        self.uncharged: dict[int, set] = {r: set() for r in engine.ranks}
        self.owed: dict[int, float] = {r: 0.0 for r in engine.ranks}
        self.throttled = self.rho < 1 or self.rho_bytes < 1
        if self.throttled:
            rho, rho_bytes, computing = self.rho, self.rho_bytes, self.computing
            self.net.throttle = lambda ranks, streams: (
                (rho_bytes if streams else rho) if any(computing[r] for r in ranks) else 1.0)

    def duration(self, rank: int, op) -> float:
        return self.device.duration(rank, op)

    def run(self, rank: int, seconds: float):
        return self.device.run(rank, seconds)

    def compute(self, rank: int, op):
        env = self.env
        seconds = self.device.duration(rank, op)
        self.computing[rank] = True
        if self.throttled:
            self.net.reshare()
        self.owed[rank] = len(self.uncharged[rank]) * self.collective_cpu_s
        self.uncharged[rank].clear()
        if seconds > 0:
            yield from self.device.run(rank, seconds)
        # Collectives that ran alongside took their share of the core, but at most the op's own time.
        lost = 0.0
        while self.owed[rank] > 0 and lost < seconds:
            owed, self.owed[rank] = min(self.owed[rank], seconds - lost), 0.0
            lost += owed
            yield env.timeout(owed)
        self.owed[rank] = 0.0
        self.computing[rank] = False
        if self.throttled:
            self.net.reshare()

    def collective_began(self, rank: int, key: tuple) -> None:
        self.device.collective_began(rank, key)
        if self.collective_cpu_s:
            if self.computing[rank]:
                self.owed[rank] += self.collective_cpu_s
            else:
                self.uncharged[rank].add(key)

    def collective_ended(self, rank: int, key: tuple) -> None:
        self.uncharged[rank].discard(key)
        self.device.collective_ended(rank, key)

    def latency(self, seconds: float, ranks: tuple[int, ...]) -> simpy.Event:
        # Throttled, a latency is work that slows while its ranks compute; otherwise the device's.
        if not self.throttled:
            return self.device.latency(seconds, ranks)
        return self.net.transfer((), seconds, 1.0, None, ranks)
