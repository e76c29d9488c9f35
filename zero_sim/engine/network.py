"""The fluid network: collectives' bytes as flows that share link capacity.

Each link's capacity is split among the transfers crossing it in proportion to their loads
(bytes on that link per byte of the transfer's edge: a ring edge counts 1, a channel of a
ring striped over several NICs its share, an in-switch reduction what it moves through a
port), and the split is recomputed whenever a transfer starts or ends.  Two process groups'
collectives in flight together therefore slow each other exactly where their paths
overlap, and nowhere else.  Flows are "fluid": bytes move continuously at the current
rate, with no packets and no congestion control.
"""

from __future__ import annotations

import math

import simpy

from zero_sim.system.topology import Topology


class _Flow:
    __slots__ = ("loads", "remaining", "rate", "last", "version", "done", "alone_rate", "cap", "caller",
                 "ranks")

    def __init__(self, loads, remaining, done, alone_rate, cap, caller, ranks):
        self.loads, self.remaining, self.done, self.alone_rate, self.cap = (
            loads, remaining, done, alone_rate, cap)
        self.caller, self.ranks = caller, ranks
        self.rate, self.last, self.version = 0.0, 0.0, 0


class FluidNetwork:
    """Transfers share each link's capacity per unit of load; rates change as transfers come and go.

    A transfer alone on the network runs at its isolated rate (computed once per plan), so the
    per-link bookkeeping, which costs one step per link of a 1000-rank ring, is only paid while
    two or more transfers are in flight together.

    A transfer over no links is a latency: ``edge_bytes`` seconds of work at ``cap`` = 1 per
    second.  ``throttle(ranks, streams)``, when set, scales every transfer's rate (latencies
    too: ``streams`` is False for them) by what its ranks are doing now; call :meth:`reshare`
    when that changes.
    """

    def __init__(self, env: simpy.Environment, topo: Topology):
        self.env, self.topo = env, topo
        self.active: list[_Flow] = []
        self._alone: dict[tuple, float] = {}
        self._capacity = {name: link.capacity for name, link in topo.links.items()}  # links are frozen
        self.throttle = None

    def _alone_rate(self, loads) -> float:
        if not loads:
            return math.inf
        rate = self._alone.get(loads)
        if rate is None:
            links = self.topo.links
            rate = self._alone[loads] = min(links[name].capacity / load for name, load in loads)
        return rate

    def transfer(self, loads: tuple[tuple[str, int], ...], edge_bytes: float, cap: float = math.inf,
                 caller=None, ranks: tuple[int, ...] = ()) -> simpy.Event:
        """``cap``: the most this transfer can move per second whatever the links allow (a
        calibrated collective's measured rate: software, not wires, may be what limits it).
        Transfers of one ``caller`` (a process group's stream) split their caps among them:
        a second worker thread adds no software throughput, only overlap."""
        done = self.env.event()
        flow = _Flow(loads, edge_bytes, done, min(self._alone_rate(loads), cap), cap, caller, ranks)
        self.active.append(flow)
        self._reshare()
        return done

    def _rates(self) -> list[float]:
        """Each active transfer's rate, in the order of ``active``."""
        active = self.active
        if len(active) == 1:
            rates = [active[0].alone_rate]
        else:
            link_load: dict[str, int] = {}
            callers: dict[object, int] = {}
            for flow in active:
                if flow.loads:
                    callers[flow.caller] = callers.get(flow.caller, 0) + 1
                for name, load in flow.loads:
                    link_load[name] = link_load.get(name, 0) + load
            capacity = self._capacity
            rates = []
            for f in active:
                # The least of the caller's cap share and every link's share (min's order of ties).
                rate = f.cap / (callers[f.caller] if f.caller is not None and f.loads else 1)
                for name, _ in f.loads:
                    share = capacity[name] / link_load[name]
                    if share < rate:
                        rate = share
                rates.append(rate)
        if self.throttle is not None:
            throttle = self.throttle
            rates = [rate * throttle(f.ranks, bool(f.loads)) for f, rate in zip(active, rates, strict=True)]
        return rates

    def reshare(self) -> None:
        """Rates again, after what throttles them changed."""
        if self.active:
            self._reshare()

    def _reshare(self) -> None:
        now = self.env.now
        for flow, rate in zip(self.active, self._rates(), strict=True):
            if flow.rate:
                flow.remaining = max(0.0, flow.remaining - flow.rate * (now - flow.last))
            flow.last = now
            if rate != flow.rate:
                flow.rate = rate
                flow.version += 1
                timer = self.env.timeout(flow.remaining / rate)
                timer.callbacks.append(lambda _ev, f=flow, v=flow.version: self._finish(f, v))

    def _finish(self, flow: _Flow, version: int) -> None:
        if version != flow.version or flow not in self.active:
            return  # a stale timer: the flow's rate changed since it was set
        self.active.remove(flow)
        flow.done.succeed()
        flow.rate = 0.0
        if self.active:
            self._reshare()
