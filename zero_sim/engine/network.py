"""The fluid network: collectives' bytes as flows that share link capacity.

Each link's capacity is split among the transfers crossing it in proportion to their loads
(bytes on that link per byte of the transfer's edge: a ring edge counts 1, a channel of a
ring striped over several NICs its share, an in-switch reduction what it moves through a
port), and the split is recomputed whenever a transfer starts or ends.  Two process groups'
collectives in flight together therefore slow each other exactly where their paths
overlap, and nowhere else.  Flows are "fluid": bytes move continuously at the current
rate, with no packets and no congestion control.

Only the transfers whose rates can change are re-rated when one starts or ends: those sharing a
link with it, and those of its caller (their cap is split with it).  Every other transfer's share
is computed from the same link loads and caller counts as before, so it is unchanged; each
transfer's remaining bytes are brought up to date through every change, in the same steps, only
when they are needed (when its rate changes), so the arithmetic, and every figure, is the same
as re-rating all of them at every change.
"""

from __future__ import annotations

import math

import simpy

from zero_sim.system.topology import Topology


class _Flow:
    __slots__ = ("loads", "remaining", "rate", "last", "version", "done", "alone_rate", "cap", "caller",
                 "ranks", "seen")

    def __init__(self, loads, remaining, done, alone_rate, cap, caller, ranks, seen):
        self.loads, self.remaining, self.done, self.alone_rate, self.cap = (
            loads, remaining, done, alone_rate, cap)
        self.caller, self.ranks, self.seen = caller, ranks, seen
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
        self._on_link: dict[str, list[tuple[_Flow, int]]] = {}  # link -> (flow, load), in `active` order
        self._share: dict[str, float] = {}  # link -> its capacity per unit of load in flight on it
        self._by_caller: dict[object, list[_Flow]] = {}  # caller -> its flows over links
        self._times: list[float] = []  # when the rates were re-shared; a flow has applied `seen` of them

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
        flow = _Flow(loads, edge_bytes, done, min(self._alone_rate(loads), cap), cap, caller, ranks,
                     len(self._times))
        self.active.append(flow)
        # The per-link bookkeeping is kept only while transfers share the network: a lone
        # transfer (a collapsed rank's ring over every sibling group's links) pays none of it.
        if len(self.active) == 2:  # shared from now on: both are booked
            for entering in self.active:
                self._enter(entering)
        elif len(self.active) > 2:
            self._enter(flow)
        self._reshare(self._touched(flow))
        return done

    def _enter(self, flow: _Flow) -> None:
        for name, load in flow.loads:
            self._on_link.setdefault(name, []).append((flow, load))
        if flow.caller is not None and flow.loads:
            self._by_caller.setdefault(flow.caller, []).append(flow)
        self._relink(flow)

    def _leave(self, flow: _Flow) -> None:
        for name, _ in flow.loads:
            self._on_link[name] = [entry for entry in self._on_link[name] if entry[0] is not flow]
        if flow.caller is not None and flow.loads:
            self._by_caller[flow.caller].remove(flow)
        self._relink(flow)

    def _relink(self, flow: _Flow) -> None:
        """The shares of ``flow``'s links, their loads summed in `active` order as :meth:`_rates` does."""
        for name, _ in flow.loads:
            total = 0
            for _, load in self._on_link[name]:
                total = total + load
            if total:
                self._share[name] = self._capacity[name] / total

    def _touched(self, flow: _Flow) -> dict[_Flow, float] | None:
        """The new rates of the transfers ``flow`` starting or ending can change, or None when all
        must be re-rated (a throttle, or a transfer alone or about to be: it runs at its isolated rate)."""
        if self.throttle is not None or len(self.active) <= 2:
            return None
        touched = {flow: 0.0} if flow in self.active else {}
        for name, _ in flow.loads:
            for other, _ in self._on_link[name]:
                touched[other] = 0.0
        if flow.caller is not None and flow.loads:
            for other in self._by_caller[flow.caller]:
                touched[other] = 0.0
        share, by_caller = self._share, self._by_caller
        for f in touched:
            # The least of the caller's cap share and every link's share, as in _rates.
            rate = f.cap / (len(by_caller[f.caller]) if f.caller is not None and f.loads else 1)
            for name, _ in f.loads:
                if share[name] < rate:
                    rate = share[name]
            touched[f] = rate
        return touched

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
            self._reshare(None)

    def _reshare(self, touched: dict[_Flow, float] | None) -> None:
        """New rates (and finish timers) for the transfers in ``touched`` (all when None) whose
        rate changed, each first brought up to now."""
        now = self.env.now
        self._times.append(now)
        active = self.active
        rates = self._rates() if touched is None else [touched.get(flow) for flow in active]
        for flow, rate in zip(active, rates, strict=True):
            if rate is not None and rate != flow.rate:
                self._catch_up(flow)
                flow.rate = rate
                flow.version += 1
                timer = self.env.timeout(flow.remaining / rate)
                timer.callbacks.append(lambda _ev, f=flow, v=flow.version: self._finish(f, v))

    def _catch_up(self, flow: _Flow) -> None:
        """``flow``'s remaining bytes at each re-share since it last caught up, one step per re-share
        at the rate it had, as if brought up to date at every one (the same floats)."""
        times, rate, left, last = self._times, flow.rate, flow.remaining, flow.last
        for i in range(flow.seen, len(times)):
            now = times[i]
            if rate:
                left = left - rate * (now - last)
                left = left if left > 0.0 else 0.0  # max(0.0, left), without the call
            last = now
        flow.remaining, flow.last, flow.seen = left, last, len(times)

    def _finish(self, flow: _Flow, version: int) -> None:
        if version != flow.version or flow not in self.active:
            return  # a stale timer: the flow's rate changed since it was set
        self.active.remove(flow)
        if len(self.active) >= 2:
            self._leave(flow)
        else:
            self._on_link.clear()
            self._by_caller.clear()
        flow.done.succeed()
        flow.rate = 0.0
        if self.active:
            self._reshare(self._touched(flow))
