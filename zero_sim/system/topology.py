"""Where the bytes go: GPUs in nodes, joined by links of finite bandwidth.

A topology is ``nodes x gpus_per_node`` ranks and a set of directed links.  A transfer
from one rank to another crosses a *path* of links.  Two properties matter:

* **capacity** (bytes/s) and **latency** (s) of each link;
* whether a link is a **shared bus**: a PCIe switch or a host's root complex carries
  every transfer that touches it, in either direction, out of one capacity.  That is
  why 4 GPUs on one PCIe bus train slower than 2 (seed 002): each GPU's share halves
  while the bytes to move grow.

Collectives (``collectives.py``) run as rings over these paths; a link's *load* is the
number of ring edges that cross it, and each edge gets ``capacity / load``.

Link figures are *achievable* bus bandwidths (what nccl-tests reports at large sizes),
not line rates; each preset says where its numbers come from.  Latencies are per ring
step (one hop of NCCL's Simple protocol), order-of-magnitude until calibrated.

Rank placement: rank ``r`` is GPU ``r % gpus_per_node`` of node ``r // gpus_per_node``;
a job smaller than one node uses that node's first GPUs (so 4 ranks on the PCIe
host-bridge box share one subgroup's bus, as in seed 002).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache

GBps = 1e9
US = 1e-6


class TopologyError(ValueError):
    """A topology that cannot be built; the message says how to fix it."""


@dataclass(frozen=True)
class Link:
    name: str
    kind: str  # nvlink | pcie | pcie-bus | host-bridge | nic | loopback
    capacity: float  # bytes/s
    latency: float  # s
    shared: bool = False  # a bus: both directions draw from one capacity


@dataclass(frozen=True)
class Fabric:
    """How GPUs inside one node reach each other and the node's network interface."""

    kind: str  # "nvswitch" | "pcie" | "loopback"
    port_gbps: float  # GB/s per GPU port (NVLink into the switch, or the GPU's PCIe link)
    port_latency_us: float
    subgroups: int = 1  # PCIe only: subgroups behind separate host bridges
    bus_gbps: float = 0.0  # PCIe only: shared capacity of each subgroup's bus
    bus_latency_us: float = 0.0
    bridge_gbps: float = 0.0  # PCIe only: host bridge between subgroups, per direction
    bridge_latency_us: float = 0.0


@dataclass(frozen=True)
class Network:
    """Between nodes: each node's NICs, aggregated, per direction; a non-blocking core."""

    kind: str  # "infiniband" | "efa" | "ethernet"
    nic_gbps: float  # GB/s per node per direction
    latency_us: float


@dataclass(frozen=True)
class TopologySpec:
    name: str
    description: str
    gpus_per_node: int
    fabric: Fabric
    network: Network | None
    gpu: str  # default GPU model
    source: str  # where the figures come from


# Figures: NVSwitch busbw from nccl-tests all_reduce on DGX A100 (~230 GB/s) and H100
# (~370 GB/s); seed 002 saw 100-180 GB/s on two "identical" A100 boxes, so treat these as
# the good case.  IB HDR/NDR: 8 NICs x 200/400 Gb/s per node.  EFA on p4d: 4 x 100 Gb/s =
# 50 GB/s line rate, about 40 GB/s achieved.  PCIe box: seed 002's nccl-tests tables (a
# GPU pair on one bus reaches 19.9 GB/s busbw, across the host bridge 13.8 GB/s).
PRESETS: dict[str, TopologySpec] = {
    "dgx-a100": TopologySpec(
        "dgx-a100", "DGX A100: 8 GPUs on NVSwitch; InfiniBand HDR (8 x 200 Gb/s) between nodes",
        8, Fabric("nvswitch", 230.0, 2.0), Network("infiniband", 190.0, 5.0), "A100-80GB",
        "nccl-tests busbw on DGX A100; IB HDR line rate less ~5%",
    ),
    "dgx-h100": TopologySpec(
        "dgx-h100", "DGX H100: 8 GPUs on NVSwitch (NVLink 4); InfiniBand NDR (8 x 400 Gb/s) between nodes",
        8, Fabric("nvswitch", 370.0, 2.0), Network("infiniband", 380.0, 4.0), "H100",
        "nccl-tests busbw on DGX H100; IB NDR line rate less ~5%",
    ),
    "ib-h100": TopologySpec(
        "ib-h100", "H100 NVSwitch nodes on a slower InfiniBand fabric (4 x 400 Gb/s per node)",
        8, Fabric("nvswitch", 370.0, 2.0), Network("infiniband", 190.0, 5.0), "H100",
        "half the NICs of a DGX H100",
    ),
    "p4d-efa": TopologySpec(
        "p4d-efa", "AWS p4d.24xlarge: 8 A100 on NVSwitch; EFA (4 x 100 Gb/s) between nodes",
        8, Fabric("nvswitch", 230.0, 2.0), Network("efa", 40.0, 15.0), "A100-40GB",
        "EFA 400 Gb/s per node = 50 GB/s line rate, ~80% achieved (seed 004 context)",
    ),
    "pcie-host-bridge": TopologySpec(
        "pcie-host-bridge",
        "8 A100 on PCIe in two subgroups of 4; each subgroup shares one bus; a host bridge (DCI) joins them",
        8,
        Fabric("pcie", 24.0, 15.0, subgroups=2, bus_gbps=40.0, bus_latency_us=10.0,
               bridge_gbps=13.8, bridge_latency_us=10.0),
        Network("ethernet", 12.5, 20.0), "A100-40GB",
        "seed 002 nccl-tests: pair on one bus 19.9 GB/s (= bus 40 / 2 edges), across the bridge 13.8 GB/s",
    ),
    "pcie": TopologySpec(
        "pcie", "8 GPUs on one PCIe switch (no NVLink), all sharing one bus",
        8, Fabric("pcie", 24.0, 15.0, subgroups=1, bus_gbps=40.0, bus_latency_us=10.0),
        Network("ethernet", 12.5, 20.0), "A100-40GB",
        "PCIe Gen4 x16 ~24 GB/s per GPU; bus as in seed 002's pair measurement",
    ),
    "cpu-gloo": TopologySpec(
        "cpu-gloo", "processes on one CPU host talking gloo over loopback TCP",
        64, Fabric("loopback", 2.0, 60.0, subgroups=1, bus_gbps=4.0, bus_latency_us=20.0),
        None, "CPU",
        "order of magnitude for loopback TCP; calibrate with `zero-sim calibrate` for real figures",
    ),
    # The emulated clusters of real_runs.cluster: processes on one CPU host whose traffic is
    # shaped with tc.  Loopback inside a namespace is fast (port and bus figures set well above
    # any shaped rate); the shaped link is the bottleneck, and --bandwidth-gbps sets it to the
    # rate given to tc.
    "emu-uniform": TopologySpec(
        "emu-uniform",
        "one rank per network namespace, each on its own shaped veth link (full duplex) to a bridge",
        1, Fabric("loopback", 20.0, 20.0, subgroups=1, bus_gbps=40.0, bus_latency_us=5.0),
        Network("ethernet", 0.125, 50.0), "CPU",
        "tc tbf rate on each veth, both directions (real_runs.cluster 'uniform'); latency order of magnitude",
    ),
    "emu-two-nodes": TopologySpec(
        "emu-two-nodes",
        "two network namespaces ('nodes') of N/2 ranks on loopback, joined by one shaped link",
        2, Fabric("loopback", 20.0, 20.0, subgroups=1, bus_gbps=40.0, bus_latency_us=5.0),
        Network("ethernet", 0.125, 50.0), "CPU",
        "tc tbf rate on each node's veth (real_runs.cluster 'two-nodes')",
    ),
    "emu-shared-bus": TopologySpec(
        "emu-shared-bus",
        "every rank in one namespace whose loopback is shaped: all traffic shares one queue",
        64, Fabric("loopback", 20.0, 20.0, subgroups=1, bus_gbps=0.125, bus_latency_us=20.0),
        None, "CPU",
        "tc tbf rate on the namespace's lo (real_runs.cluster 'shared-bus')",
    ),
}


def preset_names() -> list[str]:
    return sorted(PRESETS)


@dataclass(eq=False)  # identity hash: plans and ring loads are cached per topology
class Topology:
    """A concrete topology for ``world_size`` ranks: links, and the path between any two ranks."""

    spec: TopologySpec
    world_size: int
    gpus_per_node: int
    links: dict[str, Link] = field(default_factory=dict)

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

    def node_of(self, rank: int) -> int:
        return rank // self.gpus_per_node

    def local_rank(self, rank: int) -> int:
        return rank % self.gpus_per_node

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
        """A copy whose ``kind`` links (default: the bottleneck) carry ``gbit_per_s`` Gbit/s."""
        kind = kind or self.bottleneck_kind()
        capacity = gbit_per_s * 1e9 / 8
        links = {n: (replace(link, capacity=capacity) if link.kind == kind else link)
                 for n, link in self.links.items()}
        return Topology(self.spec, self.world_size, self.gpus_per_node, links)

    def describe(self) -> str:
        kinds: dict[str, Link] = {}
        for link in self.links.values():
            kinds.setdefault(link.kind, link)
        parts = [f"{k} {link.capacity / GBps:.1f} GB/s{' shared' if link.shared else ''}, "
                 f"{link.latency / US:.0f} us" for k, link in kinds.items()]
        return f"{self.name}: {self.nodes} node(s) x {self.ranks_per_node} GPU(s); " + "; ".join(parts)


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
            for direction in ("out", "in"):
                name = f"nic{node}.{direction}"
                links[name] = Link(name, "nic", spec.network.nic_gbps * GBps, spec.network.latency_us * US)
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
        return tuple(up + [f"nic{topo.node_of(src)}.out", f"nic{topo.node_of(dst)}.in"] + down)
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
