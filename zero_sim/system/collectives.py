"""What a collective costs: a fixed cost, per-step latencies, and bytes over the slowest share of a link.

NCCL (the form of NCCL's own tuning model, ``src/graph/tuning.cc``, with constants fitted
to published nccl-tests curves; docs/engine.md "The collective model" lists the points):
for an algorithm ``a`` and a protocol ``p``, one collective over a buffer of ``S`` bytes takes

``t = base_p + steps x hop_p + wire_p(E) x max_link(load / capacity)``

and NCCL runs the (algorithm, protocol) pair with the smallest ``t``, as its tuner does.

* ``E`` is the bytes per edge: ``factor x S`` for a ring (nccl-tests' bus factor, ``2(n-1)/n``
  for all_reduce, ``(n-1)/n`` for reduce_scatter and all_gather), ``S`` for trees and NVLS.
* **Protocols** (``PROTOCOLS``): LL sends 4 bytes of flag with every 4 bytes of data
  (``wire = E / 0.5``), LL128 8 of every 128 (``E / 0.92``, NCCL's figure), Simple the data
  alone but in chunks that fill a pipeline first: ``wire = E + min(E, Q)``, ``Q`` the fabric's
  ``pipeline_mb``, so a message smaller than the pipeline moves at half speed and a larger one
  pays a fixed fill.  LL128 runs on NVLink fabrics only; EFA v1 carries Simple only.  Over more
  than two nodes the wire bytes are divided by the network's ``beyond_two_nodes`` (EFA v1 reaches
  about 0.6 of line rate from three nodes on, against 0.93 on two: NVIDIA/nccl #527;
  topology_presets.py).
* ``base_p`` is the fabric's fitted fixed cost (``Fabric.protocol_us``), ``hop_p`` a step's
  latency: the links' latencies along the step (the Simple figure) times NCCL's ratio for the
  protocol and link class (NVLink 0.6/1.9/3.4 us, PCIe 1.0/2.5/5.7, network 2.7/4.0/14).
* **Algorithms** (``ALGORITHMS``):
  - *ring*: one ring per channel (``topology.channel_rings``): inside a node every channel is
    the same ring; across nodes channel ``c`` crosses the node boundary from the ``c``-th
    member, so a group with a member on every rail uses every NIC.  ``2(n-1)`` steps for
    all_reduce (``2(g-1)`` of them across nodes), ``n-1`` for the others.
  - *tree* (all_reduce): in each node a chain from a head GPU, across nodes NCCL's double
    binary tree, one head per rail, each tree carrying half the data (``tree_loads``);
    ``2 x ((r-1) hops in a node + floor(log2 g) across)``.  Two nodes exchange ``S`` each way
    instead of a ring's ``2(n-1)/n x S``, which is why NCCL picks tree there (NVIDIA/nccl #812).
    NCCL's 0.92 tree efficiency applies.
  - *nvls* (all_reduce inside one NVSwitch node with NVLink SHARP): each GPU sends its buffer
    to the switch, which reduces it, and receives the result: ``S (n+1)/n`` per port each way at
    ``nvls_efficiency`` of the ports' rate; one fixed cost, no steps.
  - *nvls_tree* (all_reduce over NVLS nodes): NVLS inside each node, a double binary tree
    across nodes on every rail.
  - *hierarchical* (named only, not NCCL's): reduce_scatter in each node, all_reduce across
    nodes per local index, all_gather in each node, three stages one after the other.
* **all_to_all** (ZeRO++'s quantized gradient reduction) is not a ring: NCCL runs it as grouped
  point-to-point sends (nccl-tests ``src/alltoall.cu``: one ``ncclSend``/``ncclRecv`` per peer
  inside a group), so every member sends its ``1/n`` slice of ``S`` to each other member at
  once (``pairwise_loads``).  One stage: the fabric's Simple fixed cost plus one step's latency
  (the slowest path's), then ``S/n`` bytes per pair over the busiest link's share.  No
  pipeline fill: point-to-point chunks are a few hundred KB (``NCCL_P2P_NET_CHUNKSIZE`` 128 KB,
  ``NCCL_P2P_NVL_CHUNKSIZE`` 512 KB), not a ring's tens of MB.  No published all-to-all curve
  was fitted: the fixed cost and step latency are the all_reduce fit's.
* A link's *load* is the bytes that cross it per edge byte; a shared PCIe bus counts every
  edge that touches it (the 'GPT Adventures, Part 4: Distribute It' blog post), a NIC only
  the channels whose rings cross it.

gloo (``BACKENDS["gloo"]``) keeps the plain model: ``launch + steps x slowest hop +
factor x S / share``, one ring in rank order; gloo implements reduce_scatter as a full
all_reduce followed by a local chunk, so it moves all-reduce bytes.

``busbw`` as nccl-tests defines it is ``factor * S / t``; reading its tables back and fitting
``launch+latency`` and bus bandwidth to them is :mod:`zero_sim.system.nccl_tests`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from zero_sim.system.collective_paths import (
    gloo_ring_loads,
    merge_loads,
    nvls_loads,
    pairwise_loads,
    ring_hops,
    tree_loads,
)
from zero_sim.system.topology import Topology, by_node, channel_loads, ring_step_latency
from zero_sim.vocabulary import ALL_GATHER, ALL_REDUCE, ALL_TO_ALL, REDUCE_SCATTER
from zero_sim.vocabulary.collectives import bus_factor

ALGORITHMS = ("auto", "ring", "tree", "nvls", "nvls_tree", "hierarchical")


class CollectiveError(ValueError):
    """Bad collective input (unknown kind, malformed nccl-tests table); the message says how to fix it."""


@dataclass(frozen=True)
class Backend:
    name: str
    launch_latency_s: float  # fixed cost of starting one collective (kernel launch, protocol setup)
    reduce_scatter_as_all_reduce: bool
    algorithms: tuple[str, ...]  # what ``--algorithm auto`` chooses among
    # Collectives of one stream in flight at once.  NCCL kernels on one CUDA stream run one
    # after another; gloo's process group hands async collectives to a pool of worker
    # threads (two per device by default), so two run at once and their latencies overlap.
    in_flight: int = 1


BACKENDS: dict[str, Backend] = {
    "nccl": Backend("nccl", 12e-6, False, ("ring", "tree", "nvls", "nvls_tree")),
    "gloo": Backend("gloo", 40e-6, True, ("ring",), in_flight=2),
}


@dataclass(frozen=True)
class Protocol:
    """One of NCCL's wire protocols: payload per wire byte, and a step's latency relative to Simple's."""

    name: str
    efficiency: float
    hop_ratio: dict  # link class ("nvlink", "pci", "net") -> this protocol's step latency / Simple's


# NCCL src/graph/tuning.cc: hwLatencies (ring, per step, us) NVLink LL/LL128/Simple 0.6/1.9/3.4,
# PCI 1.0/2.5/5.7, NET 2.7/4.0/14.0; LL128 bandwidth x 0.92; LL carries half payload (4 B data +
# 4 B flag per 8 B store, S. Jeaugey in NVIDIA/nccl #281).  baseLatencies ring 6.6/14.0/8.4 us,
# NVLS 25 us (NVLink hw latency of NVLS, base 0): the fixed costs of a fabric without fitted ones.
PROTOCOLS: tuple[Protocol, ...] = (
    Protocol("LL", 0.5, {"nvlink": 0.6 / 3.4, "pci": 1.0 / 5.7, "net": 2.7 / 14.0}),
    Protocol("LL128", 0.92, {"nvlink": 1.9 / 3.4, "pci": 2.5 / 5.7, "net": 4.0 / 14.0}),
    Protocol("Simple", 1.0, {"nvlink": 1.0, "pci": 1.0, "net": 1.0}),
)
SIMPLE = PROTOCOLS[2]
NCCL_BASE_US = (6.6, 14.0, 8.4, 25.0)  # LL, LL128, Simple, NVLS
TREE_EFFICIENCY = 0.92  # tuning.cc: tree all_reduce busBw * .92


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
    loads: tuple[tuple[str, float], ...]  # (link name, bytes crossing it per edge byte)
    rate_cap: float = math.inf  # bytes/s per edge at most: a calibrated collective's measured busbw
    # The latency when the call queues behind another of its process group (a calibrated gloo
    # collective: ``CollectiveFit.queued_latency_s``); None: the same as ``latency_s``.
    queued_latency_s: float | None = None

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
    protocol: str = ""  # NCCL's LL, LL128 or Simple ("" for gloo, calibrated and local plans)

    def isolated_time(self, topo: Topology) -> float:
        return sum(stage.isolated_time(topo) for stage in self.stages)

    def busbw(self, topo: Topology) -> float:
        """Bus bandwidth as nccl-tests would report it for this plan, bytes/s."""
        t = self.isolated_time(topo)
        return bus_factor(self.kind, self.n) * self.nbytes / t if t > 0 else math.inf


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
            loads = (gloo_ring_loads(self.topology, instances) if self.backend == "gloo"
                     else merge_loads(channel_loads(self.topology, m) for m in instances))
            stage = Stage(fit.latency_s, edge_bytes, loads, cap, fit.queued_latency_s)
            return CollectivePlan(kind, nbytes, n, "calibrated", self.backend, (stage,), sent)
        if kind == ALL_TO_ALL:  # point-to-point, whatever --algorithm names for the collectives
            return self._all_to_all(nbytes, instances, sent)
        wanted = backend.algorithms if self.algorithm == "auto" else (self.algorithm,)
        candidates = [plan for algo in wanted for plan in self._candidates(algo, wire_kind, kind, nbytes,
                                                                            instances, sent)]
        if not candidates:  # e.g. tree asked for a reduce_scatter: NCCL would fall back to ring
            candidates = self._candidates("ring", wire_kind, kind, nbytes, instances, sent)
        return min(candidates, key=lambda p: p.isolated_time(self.topology))

    # ------------------------------------------------------------------ candidates
    def _candidates(self, algo: str, wire_kind: str, kind: str, nbytes: float, instances,
                    sent: float) -> list[CollectivePlan]:
        n = len(instances[0])
        if self.backend == "gloo" or algo == "hierarchical":
            stages = self._plain_stages(algo, wire_kind, nbytes, instances)
            if stages is None:
                return []
            return [CollectivePlan(kind, nbytes, n, algo, self.backend, stages, sent)]
        shape = self._shape(algo, wire_kind, nbytes, instances)
        if shape is None:
            return []
        edge_bytes, loads, steps_fn = shape
        topo, fab = self.topology, self.topology.spec.fabric
        members = instances[0]
        intra_hop, inter_hop, nodes = ring_hops(topo, members)
        intra_class = "nvlink" if fab.kind == "nvswitch" else "pci"
        network = topo.spec.network
        ll_ok = nodes <= 1 or network is None or network.ll_protocols
        plans = []
        for index, proto in enumerate(PROTOCOLS):
            if algo in ("nvls", "nvls_tree") and proto is not SIMPLE:
                continue  # NVLS runs the Simple protocol only (tuning.cc)
            if proto is not SIMPLE and not ll_ok:
                continue  # EFA v1 carries Simple only (aws/aws-ofi-nccl #76)
            if proto.name == "LL128" and fab.kind != "nvswitch":
                continue  # LL128 needs NVLink paths (tuning.cc enables it up to NVB)
            intra_steps, inter_steps = steps_fn(n, nodes)
            base = self._base_us(3 if algo in ("nvls", "nvls_tree") else index) * 1e-6
            hops = (intra_steps * intra_hop * proto.hop_ratio[intra_class]
                    + inter_steps * inter_hop * proto.hop_ratio["net"])
            wire = edge_bytes / proto.efficiency
            if proto is SIMPLE:
                wire += min(edge_bytes, fab.pipeline_mb * 1e6)
            if nodes > 2 and network is not None:
                wire /= network.beyond_two_nodes  # a network's drop past two nodes (Network)
            stage = Stage(base + hops, wire, loads)
            plans.append(CollectivePlan(kind, nbytes, n, algo, self.backend, (stage,), sent, proto.name))
        return plans

    def _all_to_all(self, nbytes: float, instances, sent: float) -> CollectivePlan:
        """Every member's ``1/n`` slice straight to every other member at once (see the module
        docstring): a fixed cost and one step's latency, then a slice over the busiest link."""
        members, n = instances[0], len(instances[0])
        intra_hop, inter_hop, nodes = ring_hops(self.topology, members)
        hop = inter_hop if nodes > 1 else intra_hop
        if self.backend == "gloo":
            base = BACKENDS["gloo"].launch_latency_s
        else:
            base = self._base_us(PROTOCOLS.index(SIMPLE)) * 1e-6
        loads = merge_loads(pairwise_loads(self.topology, m) for m in instances)
        stage = Stage(base + hop, nbytes / n, loads)
        return CollectivePlan(ALL_TO_ALL, nbytes, n, "pairwise", self.backend, (stage,), sent,
                              "" if self.backend == "gloo" else SIMPLE.name)

    def _base_us(self, index: int) -> float:
        fitted = self.topology.spec.fabric.protocol_us
        return fitted[index] if index < len(fitted) else NCCL_BASE_US[index]

    def _shape(self, algo: str, kind: str, nbytes: float, instances):
        """(edge bytes, loads, steps(n, nodes) -> (intra, inter)) of an algorithm; None if it cannot run."""
        topo = self.topology
        fab = topo.spec.fabric
        if algo == "ring":
            loads = merge_loads(channel_loads(topo, m) for m in instances)
            per = 2 if kind == ALL_REDUCE else 1

            def ring(n, g):
                inter = per * (g - 1) if g > 1 else 0
                return ring_steps(kind, n) - inter, inter
            return bus_factor(kind, len(instances[0])) * nbytes, loads, ring
        if kind != ALL_REDUCE:
            return None
        if algo == "tree":
            parts = [tree_loads(topo, m) for m in instances]
            if any(p is None for p in parts):
                return None

            def tree(n, g):
                return 2 * (n // g - 1), 2 * int(math.log2(g)) if g > 1 else 0
            return nbytes / TREE_EFFICIENCY, merge_loads(parts), tree
        if algo in ("nvls", "nvls_tree"):
            if fab.nvls_efficiency <= 0:
                return None
            nodes = len(by_node(topo, instances[0]))
            if (algo == "nvls") != (nodes == 1):
                return None
            parts = [nvls_loads(topo, m) for m in instances]
            if any(p is None for p in parts):
                return None

            def nvls(n, g):
                return 0, 2 * int(math.log2(g)) if g > 1 else 0
            return nbytes, merge_loads(parts), nvls
        return None

    def _plain_stages(self, algo: str, kind: str, nbytes: float, instances) -> tuple[Stage, ...] | None:
        """gloo's model and the hierarchical algorithm: launch + steps x slowest hop, rings in rank order."""
        topo, launch = self.topology, BACKENDS[self.backend].launch_latency_s
        members = instances[0]
        n = len(members)
        if algo == "ring":
            lat = launch + ring_steps(kind, n) * ring_step_latency(topo, members)
            return (Stage(lat, bus_factor(kind, n) * nbytes, gloo_ring_loads(topo, instances)),)
        if algo == "tree":
            if kind != ALL_REDUCE:
                return None
            lat = launch + 2 * math.ceil(math.log2(n)) * ring_step_latency(topo, members)
            return (Stage(lat, bus_factor(kind, n) * nbytes, gloo_ring_loads(topo, instances)),)
        if algo == "hierarchical":
            if kind != ALL_REDUCE:
                return None
            by_node_: dict[int, list[int]] = {}
            for inst in instances:
                for r in inst:
                    by_node_.setdefault(topo.node_of(r), []).append(r)
            g = len({topo.node_of(r) for r in members})
            per_node = n // g if g else n
            if g <= 1 or per_node <= 1 or n % g:
                return None
            intra = tuple(tuple(sorted(set(v))) for v in by_node_.values())
            intra = tuple(m for m in intra if len(m) == per_node) or intra
            # Cross-node rings: the i-th rank of every node, for each i, all at once.
            cross = tuple(tuple(sorted(m)[i] for m in intra) for i in range(per_node))
            intra_lat = ring_step_latency(topo, intra[0])
            cross_lat = ring_step_latency(topo, cross[0])
            rs = Stage(launch + (per_node - 1) * intra_lat, bus_factor(REDUCE_SCATTER, per_node) * nbytes,
                       gloo_ring_loads(topo, intra))
            ar = Stage(launch + 2 * (g - 1) * cross_lat, bus_factor(ALL_REDUCE, g) * nbytes / per_node,
                       gloo_ring_loads(topo, cross))
            ag = Stage(launch + (per_node - 1) * intra_lat, bus_factor(ALL_GATHER, per_node) * nbytes,
                       gloo_ring_loads(topo, intra))
            return (rs, ar, ag)
        if algo in ("nvls", "nvls_tree"):
            return None
        raise CollectiveError(f"unknown algorithm {algo!r}")
