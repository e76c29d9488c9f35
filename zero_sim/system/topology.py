"""Where the bytes go: GPUs in nodes, joined by links of finite bandwidth.

A topology is ``nodes x gpus_per_node`` ranks and a set of directed links.  A transfer
from one rank to another crosses a *path* of links.  Two properties matter:

* **capacity** (bytes/s) and **latency** (s) of each link;
* whether a link is a **shared bus**: a PCIe switch or a host's root complex carries
  every transfer that touches it, in either direction, out of one capacity.  That is
  why 4 GPUs on one PCIe bus train slower than 2 (the 'GPT Adventures, Part 4: Distribute
  It' blog post): each GPU's share halves while the bytes to move grow.

Collectives (``collectives.py``) run as rings, trees or in-switch reductions over these
paths; a link's *load* is how many bytes cross it per byte of the collective's edge, and
each transfer gets a share of the capacity in proportion to its load.

Link figures are *achievable* bus bandwidths (what nccl-tests reports at large sizes),
not line rates; each preset says where its numbers come from.  A link's latency is its
part of one ring step of NCCL's Simple protocol (a step crossing an NVSwitch pays the
two ports' latencies, 3.4 us, NCCL's own figure for an NVLink hop in
``src/graph/tuning.cc``); the other protocols scale it (``collectives.py``).

Between nodes, each node has ``Network.nics`` NICs (rails).  GPU ``i`` of a node sends
and receives through NIC ``i * nics // gpus_per_node`` (rail-optimised, one NIC per GPU
on DGX-class machines, one per two GPUs on p4d).  A collective whose rings cross the
node boundary from every GPU uses every rail; one that crosses from one GPU per node (a
group of one local index) uses that GPU's rail only.

Rank placement: rank ``r`` is GPU ``r % gpus_per_node`` of node ``r // gpus_per_node``;
a job smaller than one node uses that node's first GPUs (so 4 ranks on the PCIe
host-bridge box share one subgroup's bus, as in the 'GPT Adventures, Part 4: Distribute It' blog post).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any

from zero_sim.system.specs import US, Fabric, GBps, Link, Network, TopologyError, TopologySpec
from zero_sim.system.topology_presets import PRESETS, preset_names


@dataclass(eq=False)  # identity hash: plans and ring loads are cached per topology
class Topology:
    """A concrete topology for ``world_size`` ranks: links, and the path between any two ranks."""

    spec: TopologySpec
    world_size: int
    gpus_per_node: int
    links: dict[str, Link] = field(default_factory=dict)
    host: Any = None  # the nodes' host side when states are offloaded (zero_sim.system.host_side.Host)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def ranks_per_node(self) -> int:
        """Ranks placed on each node: a job smaller than a node fills its first GPUs."""
        return min(self.gpus_per_node, self.world_size)

    @property
    def nodes(self) -> int:
        return self.world_size // self.ranks_per_node

    @property
    def nics(self) -> int:
        """NICs (rails) per node."""
        return self.spec.network.nics if self.spec.network is not None else 1

    def node_of(self, rank: int) -> int:
        return rank // self.gpus_per_node

    def local_rank(self, rank: int) -> int:
        return rank % self.gpus_per_node

    def rail_of(self, rank: int) -> int:
        """The NIC a GPU sends and receives through: rail-optimised, GPUs spread evenly over NICs."""
        return min(self.local_rank(rank) * self.nics // self.gpus_per_node, self.nics - 1)

    def subgroup_of(self, rank: int) -> int:
        per = max(1, self.gpus_per_node // self.spec.fabric.subgroups)
        return min(self.local_rank(rank) // per, self.spec.fabric.subgroups - 1)

    def path(self, src: int, dst: int) -> tuple[str, ...]:
        return _path(self, src, dst)

    def path_latency(self, src: int, dst: int) -> float:
        return sum(self.links[name].latency for name in self.path(src, dst))

    def bottleneck_kind(self, members: list[int] | None = None) -> str:
        """The link kind that limits a ring over ``members`` (default: every rank)."""
        members = members if members is not None else list(range(self.world_size))
        loads = ring_loads(self, tuple(members))
        if not loads:
            return self.spec.fabric.kind
        worst = max(loads, key=lambda name: loads[name] / self.links[name].capacity)
        return self.links[worst].kind

    def with_bandwidth(self, gbit_per_s: float, kind: str | None = None) -> Topology:
        """A copy whose ``kind`` links (default: the bottleneck) carry ``gbit_per_s`` Gbit/s each
        (on a rail-optimised network, each NIC)."""
        kind = kind or self.bottleneck_kind()
        capacity = gbit_per_s * 1e9 / 8
        links = {n: (replace(link, capacity=capacity) if link.kind == kind else link)
                 for n, link in self.links.items()}
        return Topology(self.spec, self.world_size, self.gpus_per_node, links, self.host)

    def describe(self) -> str:
        kinds: dict[str, Link] = {}
        counts: dict[str, int] = {}
        for link in self.links.values():
            kinds.setdefault(link.kind, link)
            counts[link.kind] = counts.get(link.kind, 0) + 1
        parts = []
        for k, link in kinds.items():
            rate = self._nic_rate(link) if k == "nic" else gb_per_s(link.capacity)
            parts.append(f"{k} {rate}{' shared' if link.shared else ''}, {link.latency / US:.0f} us")
        return f"{self.name}: {self.nodes} node(s) x {self.ranks_per_node} GPU(s); " + "; ".join(parts)

    def _nic_rate(self, link: Link) -> str:
        """A NIC's rate as used, the node's in the same unit, and where it comes from: the preset's
        line rate x the fraction achieved, or a bandwidth given (``--bandwidth-gbps`` per NIC,
        ``--node-bandwidth-gbps`` per node), taken as achieved.  So ``ib-400``'s 400 Gbit/s line
        at 0.96 reads 48.0 GB/s beside 400 Gbit/s given, 50.0 GB/s: the same rule, in the same unit."""
        net = self.spec.network
        rate = gb_per_s(link.capacity)
        if self.nics > 1:
            rate += f" x {self.nics} = {gb_per_s(link.capacity * self.nics)} per node"
        given = net is None or abs(link.capacity * self.nics - net.nic_gbps * GBps) > 1e-6 * link.capacity
        if given:
            return f"{rate} (as given: {link.capacity * self.nics * 8 / 1e9:,.0f} Gbit/s per node)"
        if net.line_gbit is None:
            return rate
        line = f"{self.nics} x {net.line_gbit:,.0f}" if self.nics > 1 else f"{net.line_gbit:,.0f}"
        return f"{rate} ({line} Gbit/s line rate x {net.achieved:g} achieved)"


def gb_per_s(bytes_per_s: float) -> str:
    """A bandwidth as every label prints it: GB/s (1e9 bytes, Gbit/s / 8) to three significant figures."""
    value = bytes_per_s / GBps
    if value <= 0:
        return "0 GB/s"
    decimals = max(0, 2 - math.floor(math.log10(value)))
    return f"{value:,.{decimals}f} GB/s"


@lru_cache(maxsize=4096)
def ring_loads(topo: Topology, members: tuple[int, ...]) -> dict[str, int]:
    """How many edges of a ring over ``members`` cross each link (a link carrying k edges
    gives each a k-th of its capacity)."""
    loads: dict[str, int] = {}
    n = len(members)
    if n <= 1:
        return loads
    for i, src in enumerate(members):
        for name in topo.path(src, members[(i + 1) % n]):
            loads[name] = loads.get(name, 0) + 1
    return loads


@lru_cache(maxsize=4096)
def ring_step_latency(topo: Topology, members: tuple[int, ...]) -> float:
    """One step of a ring waits for its slowest edge: the largest path latency between neighbours."""
    n = len(members)
    if n <= 1:
        return 0.0
    return max(topo.path_latency(src, members[(i + 1) % n]) for i, src in enumerate(members))


def by_node(topo: Topology, members: tuple[int, ...]) -> list[list[int]]:
    """``members`` split by node, in the order nodes first appear, each node's ranks in order."""
    groups: dict[int, list[int]] = {}
    for r in members:
        groups.setdefault(topo.node_of(r), []).append(r)
    return list(groups.values())


def channel_rings(topo: Topology, members: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    """The rings NCCL runs a ring collective on, one per channel.

    Inside one node every rotation of a ring is the same ring, so there is one.  Across nodes,
    channel ``c`` enters each node at its ``c``-th member and leaves it from the one before:
    with ``r`` members per node there are ``r`` channels, and each member's NIC carries one
    channel's crossing each way, so the rings use every rail the members sit on (NCCL builds
    its rings so, one or more channels per NIC)."""
    nodes = by_node(topo, members)
    r = len(nodes[0]) if nodes else 0
    if len(nodes) <= 1 or r <= 1 or any(len(g) != r for g in nodes):
        return (tuple(members),)
    return tuple(tuple(rank for g in nodes for rank in g[c:] + g[:c]) for c in range(r))


@lru_cache(maxsize=4096)
def channel_loads(topo: Topology, members: tuple[int, ...]) -> dict[str, float]:
    """Bytes crossing each link per byte of a ring edge when the data is split evenly over
    :func:`channel_rings` (inside a node: exactly :func:`ring_loads`)."""
    rings = channel_rings(topo, members)
    if len(rings) == 1:
        return dict(ring_loads(topo, rings[0]))
    loads: dict[str, float] = {}
    for ring in rings:
        for name, load in ring_loads(topo, ring).items():
            loads[name] = loads.get(name, 0.0) + load / len(rings)
    return loads


def build_topology(name_or_spec: str | TopologySpec, world_size: int,
                   gpus_per_node: int | None = None) -> Topology:
    if isinstance(name_or_spec, TopologySpec):
        spec = name_or_spec
    else:
        if name_or_spec not in PRESETS:
            raise TopologyError(f"unknown topology preset {name_or_spec!r}; "
                                f"choose one of {', '.join(preset_names())}")
        spec = PRESETS[name_or_spec]
    if not isinstance(world_size, int) or world_size <= 0:
        raise TopologyError(f"--gpus must be a positive integer, got {world_size!r}")
    g = gpus_per_node if gpus_per_node is not None else spec.gpus_per_node
    if not isinstance(g, int) or g <= 0:
        raise TopologyError(f"--gpus-per-node must be a positive integer, got {g!r}")
    if world_size > g and world_size % g:
        raise TopologyError(f"--gpus {world_size} is not divisible by --gpus-per-node {g}; "
                            f"use a multiple of {g} GPUs or change --gpus-per-node")
    if world_size > g and spec.network is None:
        raise TopologyError(f"topology {spec.name!r} is a single host; "
                            f"use at most {g} ranks or another preset")
    fab = spec.fabric
    if fab.kind == "pcie" and fab.subgroups > 1 and g % fab.subgroups:
        raise TopologyError(f"topology {spec.name!r} splits a node into {fab.subgroups} PCIe subgroups; "
                            f"--gpus-per-node must be a multiple of {fab.subgroups}")
    topo = Topology(spec, world_size, g)
    topo.links = _links(topo)
    return topo


def _links(topo: Topology) -> dict[str, Link]:
    spec, fab = topo.spec, topo.spec.fabric
    port_kind = {"nvswitch": "nvlink", "pcie": "pcie", "loopback": "loopback"}[fab.kind]
    links: dict[str, Link] = {}
    for r in range(topo.world_size):
        for direction in ("up", "down"):
            name = f"{port_kind}{r}.{direction}"
            links[name] = Link(name, port_kind, fab.port_gbps * GBps, fab.port_latency_us * US)
    for node in range(topo.nodes):
        if fab.kind in ("pcie", "loopback"):
            bus_kind = "pcie-bus" if fab.kind == "pcie" else "host-memory"
            for sg in range(fab.subgroups):
                name = f"bus{node}.{sg}"
                links[name] = Link(name, bus_kind, fab.bus_gbps * GBps, fab.bus_latency_us * US, shared=True)
            for a in range(fab.subgroups):
                for b in range(fab.subgroups):
                    if a != b:
                        name = f"bridge{node}.{a}-{b}"
                        links[name] = Link(name, "host-bridge", fab.bridge_gbps * GBps,
                                           fab.bridge_latency_us * US)
        if spec.network is not None and topo.nodes > 1:
            per_nic = spec.network.nic_gbps / topo.nics
            for rail in range(topo.nics):
                for direction in ("out", "in"):
                    name = f"nic{node}.{rail}.{direction}"
                    links[name] = Link(name, "nic", per_nic * GBps, spec.network.latency_us * US)
    return links


def _to_fabric_exit(topo: Topology, rank: int, direction: str) -> list[str]:
    """Links from a GPU to the point where its node's traffic leaves (or the reverse)."""
    fab = topo.spec.fabric
    port = {"nvswitch": "nvlink", "pcie": "pcie", "loopback": "loopback"}[fab.kind]
    hops = [f"{port}{rank}.{direction}"]
    if fab.kind != "nvswitch":
        bus = f"bus{topo.node_of(rank)}.{topo.subgroup_of(rank)}"
        hops = hops + [bus] if direction == "up" else [bus] + hops
    return hops


def _path(topo: Topology, src: int, dst: int) -> tuple[str, ...]:
    if src == dst:
        return ()
    up = _to_fabric_exit(topo, src, "up")
    down = _to_fabric_exit(topo, dst, "down")
    if topo.node_of(src) != topo.node_of(dst):
        out = f"nic{topo.node_of(src)}.{topo.rail_of(src)}.out"
        into = f"nic{topo.node_of(dst)}.{topo.rail_of(dst)}.in"
        return tuple(up + [out, into] + down)
    sa, sb = topo.subgroup_of(src), topo.subgroup_of(dst)
    if topo.spec.fabric.kind != "nvswitch" and sa != sb:
        return tuple(up + [f"bridge{topo.node_of(src)}.{sa}-{sb}"] + down)
    if topo.spec.fabric.kind != "nvswitch":
        # Same subgroup: the shared bus is crossed once on the way through the switch.
        return tuple(up + down[1:])
    return tuple(up + down)


def parse_nvidia_smi_topo(text: str, name: str = "imported") -> TopologySpec:
    """Build a single-node topology spec from ``nvidia-smi topo -m`` output.

    GPUs joined by ``NV#`` are treated as an NVSwitch/NVLink fabric; otherwise GPUs that
    see each other as ``PIX``/``PXB``/``NODE``/``PHB`` form a PCIe subgroup, and ``SYS``
    between groups means a host bridge.  Bandwidths are the PCIe / NVLink defaults; fit
    them from nccl-tests output (``zero-sim calibrate``) for real numbers.
    """
    rows = []
    for line in text.splitlines():
        parts = line.split()
        header = len(parts) > 1 and parts[1].startswith("GPU")
        if parts and parts[0].startswith("GPU") and parts[0][3:].isdigit() and not header:
            rows.append(parts)
    if not rows:
        raise TopologyError("no 'GPU<i>' rows found; paste the matrix printed by `nvidia-smi topo -m`")
    n = len(rows)
    matrix = [r[1:1 + n] for r in rows]
    if any(len(r) < n for r in matrix):
        raise TopologyError("the nvidia-smi topo matrix is not square; paste the whole table")
    links = {matrix[i][j] for i in range(n) for j in range(n) if i != j}
    if any(x.startswith("NV") for x in links):
        fabric = Fabric("nvswitch", 230.0, 2.0)
        desc = f"{n} GPUs on NVLink (imported from nvidia-smi topo)"
    else:
        groups: list[set[int]] = []
        for i in range(n):
            for g in groups:
                if all(matrix[i][j] != "SYS" for j in g):
                    g.add(i)
                    break
            else:
                groups.append({i})
        sg = len(groups)
        fabric = Fabric("pcie", 24.0, 15.0, subgroups=sg, bus_gbps=40.0, bus_latency_us=10.0,
                        bridge_gbps=13.8 if sg > 1 else 0.0, bridge_latency_us=10.0)
        desc = f"{n} GPUs on PCIe in {sg} subgroup(s) (imported from nvidia-smi topo)"
    return TopologySpec(name, desc, n, fabric, Network("ethernet", 12.5, 20.0), "A100-80GB",
                        "nvidia-smi topo -m; bandwidths are defaults until calibrated")
