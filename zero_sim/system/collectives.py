"""What a collective costs: latency plus bytes over the slowest share of a link.

The model, per collective on ``n`` ranks over a buffer of ``S`` bytes:

``time = launch + steps * step_latency + edge_bytes * max_link(load / capacity)``

* **Ring** (NCCL's default for large buffers, gloo's only choice here): ranks form a
  ring in rank order.  Each rank sends ``edge_bytes = factor * S`` to its neighbour,
  where ``factor`` is nccl-tests' bus-bandwidth factor: ``2(n-1)/n`` for all_reduce,
  ``(n-1)/n`` for reduce_scatter and all_gather (``S`` = the whole gathered buffer), 1
  for broadcast.  ``steps`` is ``2(n-1)`` for all_reduce and ``n-1`` otherwise; each
  step pays the ring's slowest hop latency.  A link's *load* is the number of ring edges
  that cross it: on a shared PCIe bus every edge touching the bus counts, which is how
  adding GPUs to one bus slows everyone (seed 002).
* **Tree** (all_reduce only, NCCL): same bytes and links as the ring, but
  ``2*ceil(log2 n)`` steps of latency, so it wins for small buffers on many ranks.
* **Hierarchical** (all_reduce only, multi-node groups): reduce_scatter inside each
  node, all_reduce of ``S/G`` across nodes (the G node-local rings share each NIC),
  all_gather inside each node.  Bounded by whichever stage's slowest link.

Backends differ (``BACKENDS``): gloo implements reduce_scatter as a full all_reduce
followed by a local chunk, so it moves all-reduce bytes.

``busbw`` as nccl-tests defines it is ``factor * S / t``; :func:`fit_nccl_tests` fits
``launch+latency`` and bus bandwidth from an ``all_reduce_perf`` table.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from zero_sim.system.topology import Topology, ring_loads, ring_step_latency
from zero_sim.vocabulary import ALL_GATHER, ALL_REDUCE, REDUCE_SCATTER
from zero_sim.vocabulary.collectives import bus_factor

ALGORITHMS = ("auto", "ring", "tree", "hierarchical")


class CollectiveError(ValueError):
    """Bad collective input (unknown kind, malformed nccl-tests table); the message says how to fix it."""


@dataclass(frozen=True)
class Backend:
    name: str
    launch_latency_s: float  # fixed cost of starting one collective (kernel launch, protocol setup)
    reduce_scatter_as_all_reduce: bool
    algorithms: tuple[str, ...]
    # Collectives of one stream in flight at once.  NCCL kernels on one CUDA stream run one
    # after another; gloo's process group hands async collectives to a pool of worker
    # threads (two per device by default), so two run at once and their latencies overlap.
    in_flight: int = 1


BACKENDS: dict[str, Backend] = {
    "nccl": Backend("nccl", 12e-6, False, ("ring", "tree", "hierarchical")),
    "gloo": Backend("gloo", 40e-6, True, ("ring",), in_flight=2),
}


def ring_steps(kind: str, n: int) -> int:
    return 2 * (n - 1) if kind == ALL_REDUCE else n - 1


def bytes_sent_per_rank(kind: str, nbytes: float, n: int, backend: str = "nccl") -> float:
    """Bytes one rank sends for this collective under ring algorithms (the 'volume')."""
    if BACKENDS[backend].reduce_scatter_as_all_reduce and kind == REDUCE_SCATTER:
        kind = ALL_REDUCE
    return bus_factor(kind, n) * nbytes


@dataclass(frozen=True)
class Stage:
    """One bandwidth phase of a collective: a latency, then ``edge_bytes`` over links with these loads."""

    latency_s: float
    edge_bytes: float
    loads: tuple[tuple[str, int], ...]  # (link name, ring edges crossing it)
    rate_cap: float = math.inf  # bytes/s per edge at most: a calibrated collective's measured busbw

    def isolated_time(self, topo: Topology) -> float:
        if self.edge_bytes <= 0 or not self.loads:
            return self.latency_s
        worst = max(load / topo.links[name].capacity for name, load in self.loads)
        return self.latency_s + self.edge_bytes * max(worst, 1.0 / self.rate_cap)


@dataclass(frozen=True)
class CollectivePlan:
    kind: str
    nbytes: float
    n: int
    algorithm: str
    backend: str
    stages: tuple[Stage, ...]
    sent_bytes: float  # per rank, ring formulas (comm volume)

    def isolated_time(self, topo: Topology) -> float:
        return sum(stage.isolated_time(topo) for stage in self.stages)

    def busbw(self, topo: Topology) -> float:
        """Bus bandwidth as nccl-tests would report it for this plan, bytes/s."""
        t = self.isolated_time(topo)
        return bus_factor(self.kind, self.n) * self.nbytes / t if t > 0 else math.inf


def _merged_loads(topo: Topology, instances: tuple[tuple[int, ...], ...]) -> tuple[tuple[str, int], ...]:
    merged: dict[str, int] = {}
    for members in instances:
        for name, load in ring_loads(topo, members).items():
            merged[name] = merged.get(name, 0) + load
    return tuple(sorted(merged.items()))


@dataclass
class CollectiveModel:
    """Plans collectives on a topology for one backend and algorithm choice."""

    topology: Topology
    backend: str = "nccl"
    algorithm: str = "auto"
    calibration: object | None = None  # zero_sim.calibration.Calibration: measured fits win over the model
    _cache: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise CollectiveError(f"unknown backend {self.backend!r}; use one of {', '.join(BACKENDS)}")
        if self.algorithm not in ALGORITHMS:
            raise CollectiveError(f"unknown algorithm {self.algorithm!r}; use one of {', '.join(ALGORITHMS)}")

    @property
    def in_flight(self) -> int:
        """Collectives of one stream that run at once: the backend's worker threads.  The engine
        still makes a process group pay its calls' latencies one at a time (see
        ``zero_sim.engine.engine``)."""
        return BACKENDS[self.backend].in_flight

    def plan(self, kind: str, nbytes: float, instances: tuple[tuple[int, ...], ...]) -> CollectivePlan:
        """Plan ``kind`` over ``nbytes`` on the first of ``instances`` (process-group member lists).

        Every instance runs the same collective at the same time (sibling groups, e.g. one
        cross-node group per local GPU index), so link loads add up over all of them.
        """
        key = (kind, nbytes, instances)
        plan = self._cache.get(key)
        if plan is None:
            plan = self._plan(kind, nbytes, instances)
            self._cache[key] = plan
        return plan

    def _plan(self, kind: str, nbytes: float, instances: tuple[tuple[int, ...], ...]) -> CollectivePlan:
        backend = BACKENDS[self.backend]
        n = len(instances[0])
        sent = bytes_sent_per_rank(kind, nbytes, n, self.backend)
        if n <= 1 or nbytes <= 0:
            return CollectivePlan(kind, nbytes, n, "local", self.backend, (), 0.0)
        fit = self.calibration.fit_for(kind, n) if self.calibration is not None else None
        wire_kind = ALL_REDUCE if (backend.reduce_scatter_as_all_reduce and kind == REDUCE_SCATTER) else kind
        if fit is not None:
            # Measured on this group size.  A collective alone takes what was measured
            # (``CollectiveFit.alone_time``: the sweep's own times from 1 MB, the fit below):
            # the fit's latency, then its bytes at a capped rate chosen to land on that time.
            # The links still apply, so concurrent collectives share them, and they carry
            # what the backend really sends (gloo's reduce_scatter moves an all_reduce's bytes).
            edge_bytes = bus_factor(wire_kind, n) * nbytes
            streaming = fit.alone_time(nbytes) - fit.latency_s
            cap = (edge_bytes / streaming if streaming > 0
                   else fit.busbw * bus_factor(wire_kind, n) / bus_factor(kind, n))
            stage = Stage(fit.latency_s, edge_bytes, _merged_loads(self.topology, instances), cap)
            return CollectivePlan(kind, nbytes, n, "calibrated", self.backend, (stage,), sent)
        candidates = []
        wanted = backend.algorithms if self.algorithm == "auto" else (self.algorithm,)
        for algo in wanted:
            stages = self._stages(algo, wire_kind, nbytes, instances)
            if stages is not None:
                candidates.append(CollectivePlan(kind, nbytes, n, algo, self.backend, stages, sent))
        if not candidates:  # e.g. tree asked for a reduce_scatter: NCCL would fall back to ring
            stages = self._stages("ring", wire_kind, nbytes, instances)
            candidates.append(CollectivePlan(kind, nbytes, n, "ring", self.backend, stages, sent))
        return min(candidates, key=lambda p: p.isolated_time(self.topology))

    def _stages(self, algo: str, kind: str, nbytes: float, instances) -> tuple[Stage, ...] | None:
        topo, launch = self.topology, BACKENDS[self.backend].launch_latency_s
        members = instances[0]
        n = len(members)
        if algo == "ring":
            lat = launch + ring_steps(kind, n) * ring_step_latency(topo, members)
            return (Stage(lat, bus_factor(kind, n) * nbytes, _merged_loads(topo, instances)),)
        if algo == "tree":
            if kind != ALL_REDUCE:
                return None
            lat = launch + 2 * math.ceil(math.log2(n)) * ring_step_latency(topo, members)
            return (Stage(lat, bus_factor(kind, n) * nbytes, _merged_loads(topo, instances)),)
        if algo == "hierarchical":
            if kind != ALL_REDUCE:
                return None
            by_node: dict[int, list[int]] = {}
            for inst in instances:
                for r in inst:
                    by_node.setdefault(topo.node_of(r), []).append(r)
            g = len({topo.node_of(r) for r in members})
            per_node = n // g if g else n
            if g <= 1 or per_node <= 1 or n % g:
                return None
            intra = tuple(tuple(sorted(set(v))) for v in by_node.values())
            intra = tuple(m for m in intra if len(m) == per_node) or intra
            # Cross-node rings: the i-th rank of every node, for each i, all at once.
            cross = tuple(tuple(sorted(m)[i] for m in intra) for i in range(per_node))
            intra_lat = ring_step_latency(topo, intra[0])
            cross_lat = ring_step_latency(topo, cross[0])
            rs = Stage(launch + (per_node - 1) * intra_lat, bus_factor(REDUCE_SCATTER, per_node) * nbytes,
                       _merged_loads(topo, intra))
            ar = Stage(launch + 2 * (g - 1) * cross_lat, bus_factor(ALL_REDUCE, g) * nbytes / per_node,
                       _merged_loads(topo, cross))
            ag = Stage(launch + (per_node - 1) * intra_lat, bus_factor(ALL_GATHER, per_node) * nbytes,
                       _merged_loads(topo, intra))
            return (rs, ar, ag)
        raise CollectiveError(f"unknown algorithm {algo!r}")


# --------------------------------------------------------------------------- nccl-tests import


@dataclass(frozen=True)
class NcclTestsRow:
    size_bytes: int
    time_us: float
    algbw_gbps: float
    busbw_gbps: float


@dataclass(frozen=True)
class NcclTestsTable:
    rows: tuple[NcclTestsRow, ...]
    n_ranks: int  # inferred from busbw / algbw when the header does not say
    factor: float


@dataclass(frozen=True)
class LatencyBandwidthFit:
    latency_s: float
    busbw: float  # bytes/s
    factor: float
    max_rel_error: float
    rel_errors: tuple[float, ...]

    def time(self, nbytes: float) -> float:
        return self.latency_s + self.factor * nbytes / self.busbw


_NUM = r"[0-9][0-9,]*(?:\.[0-9]+)?"


def parse_nccl_tests(text: str, collective: str = ALL_REDUCE) -> NcclTestsTable:
    """Read an nccl-tests ``*_perf`` table: native output, or the condensed form (size, count,
    time, algbw, busbw [, in-place time, algbw, busbw]) of seed 002.  Out-of-place columns are used."""
    rows = []
    n_ranks = None
    m = re.search(r"nranks\s+(\d+)", text)
    if m:
        n_ranks = int(m.group(1))
    for line in text.splitlines():
        tokens = line.replace("\u202f", "").split()
        if not tokens or not re.fullmatch(_NUM, tokens[0]):
            continue
        numbers = []
        for tok in tokens:
            if re.fullmatch(_NUM, tok):
                numbers.append(float(tok.replace(",", "")))
            elif tok.lstrip("-").isdigit():
                numbers.append(float(tok))
        words = [t for t in tokens if not re.fullmatch(_NUM, t) and not t.lstrip("-").isdigit()]
        # Native nccl-tests: size count type redop root time algbw busbw #wrong ...
        if words and len(numbers) >= 6:
            size, time_us, algbw, busbw = numbers[0], numbers[3], numbers[4], numbers[5]
        elif not words and len(numbers) >= 5:
            size, time_us, algbw, busbw = numbers[0], numbers[2], numbers[3], numbers[4]
        else:
            continue
        if size <= 0 or time_us <= 0 or algbw <= 0 or busbw <= 0:
            continue
        rows.append(NcclTestsRow(int(size), time_us, algbw, busbw))
    if len(rows) < 2:
        raise CollectiveError("no nccl-tests rows found: expected lines like "
                              "'8388608 2097152 580.2 14.46 14.46' or native all_reduce_perf output "
                              "with at least two message sizes")
    factor = sorted(r.busbw_gbps / r.algbw_gbps for r in rows)[len(rows) // 2]
    if n_ranks is None:
        n_ranks = _ranks_from_factor(collective, factor)
    return NcclTestsTable(tuple(rows), n_ranks, bus_factor(collective, n_ranks) if n_ranks > 1 else factor)


def _ranks_from_factor(kind: str, factor: float) -> int:
    best_n, best_err = 2, math.inf
    for n in range(2, 4097):
        err = abs(bus_factor(kind, n) - factor)
        if err < best_err:
            best_n, best_err = n, err
    return best_n


def fit_nccl_tests(table: NcclTestsTable) -> LatencyBandwidthFit:
    """Fit ``t = latency + factor*S/busbw`` minimising *relative* error at every size.

    Relative (not absolute) least squares, so the 8 MB point counts as much as the 1 GB one:
    the fit has to hold where latency matters, not only where bandwidth does.
    """
    import numpy as np

    sizes = np.array([r.size_bytes for r in table.rows], dtype=float)
    times = np.array([r.time_us * 1e-6 for r in table.rows])
    # t_i = a + b * factor * S_i; divide each equation by t_i.
    design = np.stack([1.0 / times, table.factor * sizes / times], axis=1)
    (latency, inv_bw), *_ = np.linalg.lstsq(design, np.ones_like(times), rcond=None)
    if inv_bw <= 0:
        raise CollectiveError("the nccl-tests times do not grow with size; check the table's columns")
    latency = max(float(latency), 0.0)
    busbw = 1.0 / float(inv_bw)
    predicted = latency + table.factor * sizes / busbw
    rel = tuple(float(x) for x in (predicted - times) / times)
    return LatencyBandwidthFit(latency, busbw, table.factor, max(abs(x) for x in rel), rel)
