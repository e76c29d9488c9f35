"""Where the bytes go: GPUs in nodes, joined by links of finite bandwidth.

A topology is ``nodes x gpus_per_node`` ranks and a set of directed links.  A transfer
from one rank to another crosses a *path* of links.  Two properties matter:

* **capacity** (bytes/s) and **latency** (s) of each link;
* whether a link is a **shared bus**: a PCIe switch or a host's root complex carries
  every transfer that touches it, in either direction, out of one capacity.  That is
  why 4 GPUs on one PCIe bus train slower than 2 (seed 002): each GPU's share halves
  while the bytes to move grow.

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
    kind: str  # nvlink | pcie | pcie-bus | host-bridge | nic | loopback | host-memory
    capacity: float  # bytes/s
    latency: float  # s
    shared: bool = False  # a bus: both directions draw from one capacity


@dataclass(frozen=True)
class Fabric:
    """How GPUs inside one node reach each other and the node's network interfaces.

    ``nvls_efficiency`` > 0 marks an NVSwitch that reduces in the switch (NVLink SHARP,
    H100/H200/B200): the fraction of the ports' rate an in-switch all_reduce reaches
    (NCCL's ``nvlsEfficiency``).  ``protocol_us`` is the fixed cost of one NCCL collective
    per protocol (LL, LL128, Simple, NVLS) on this fabric, fitted to published nccl-tests
    curves; empty means NCCL's own base latencies (``collectives.NCCL_BASE_US``)."""

    kind: str  # "nvswitch" | "pcie" | "loopback"
    port_gbps: float  # GB/s per GPU port (NVLink into the switch, or the GPU's PCIe link)
    port_latency_us: float
    subgroups: int = 1  # PCIe only: subgroups behind separate host bridges
    bus_gbps: float = 0.0  # PCIe only: shared capacity of each subgroup's bus
    bus_latency_us: float = 0.0
    bridge_gbps: float = 0.0  # PCIe only: host bridge between subgroups, per direction
    bridge_latency_us: float = 0.0
    nvls_efficiency: float = 0.0
    protocol_us: tuple[float, ...] = ()
    pipeline_mb: float = 0.0  # Simple protocol: edge MB a collective moves twice while its pipeline fills

    def __post_init__(self) -> None:  # a calibration file gives lists
        object.__setattr__(self, "protocol_us", tuple(float(x) for x in self.protocol_us))


@dataclass(frozen=True)
class Network:
    """Between nodes: ``nics`` NICs per node (rails), ``nic_gbps`` achievable GB/s per node per
    direction over all of them, a non-blocking core."""

    kind: str  # "infiniband" | "efa" | "ethernet" | "roce" | "tcpx"
    nic_gbps: float  # GB/s per node per direction, all NICs together
    latency_us: float  # each NIC link's part of one inter-node step (NCCL Simple protocol)
    nics: int = 1
    ll_protocols: bool = True  # False: only NCCL's Simple protocol crosses it (EFA v1, aws-ofi-nccl #76)


@dataclass(frozen=True)
class TopologySpec:
    name: str
    description: str
    gpus_per_node: int
    fabric: Fabric
    network: Network | None
    gpu: str  # default GPU model
    source: str  # where the figures come from


# --------------------------------------------------------------------------- preset figures
# NVSwitch ports: the busbw a ring reaches at the largest sizes of a single-node nccl-tests
# all_reduce (the ring's edges each have a port to themselves, so busbw = the port's rate).
#   A100 (NVLink 3): 230 GB/s (the old figure, kept: Azure/AI-benchmarking-guide, Azure_Results/
#     ND_A100_v4_results.md, 8 GPUs, 231.6 GB/s at 8 GB; seed 002's better box 205 GB/s near 1 GB).
#   H100/H200 (NVLink 4): 370 GB/s, NVIDIA/nccl-tests issue #212 (S. Jeaugey: "an effective NVLink
#     bandwidth of 370GB/s ... as BusBw ... with NCCL_ALGO=RING").
#   B200/GB200 (NVLink 5): 690 GB/s, Azure/AI-benchmarking-guide ND_GB200_v6_results.md, 4 GPUs,
#     ring all_reduce 680 GB/s at 8 GB and still rising.
# NVLS efficiency (in-switch all_reduce), NCCL src/graph/tuning.cc nvlsEfficiency: Hopper 0.85,
#   Blackwell 0.74; with these the model gives DGX H100 8-GPU all_reduce a busbw of 489 GB/s
#   (published: ~480, nccl-tests #212; 478.9 at 8 GB on ND H100 v5, 480.0 on ND H200 v5).
# Per-protocol fixed costs (LL, LL128, Simple, NVLS) in us and the Simple pipeline (MB of edge
#   bytes moved twice while it fills): least-squares fits (log busbw, 64 KB-8 GB) of the model in
#   collectives.py to those curves, docs "Fitted points": A100 to ND A100 v4; H100/H200 to ND H100 v5
#   and ND H200 v5 together; NVLink 5 to ND GB200 v6 (ring; no Blackwell NVLS curve, so the NVLS
#   cost is H100's).
# Port latency 1.7 us: a step through the switch crosses two ports = 3.4 us, NCCL's NVLink hop.
A100_NVSWITCH = Fabric("nvswitch", 230.0, 1.7, protocol_us=(31.6, 140.8, 45.1), pipeline_mb=37.8)
H100_NVSWITCH = Fabric("nvswitch", 370.0, 1.7, nvls_efficiency=0.85,  # LL128's cost: NCCL's 14 us, not fitted
                       protocol_us=(37.0, 14.0, 55.4, 33.3), pipeline_mb=13.7)
B200_NVSWITCH = Fabric("nvswitch", 690.0, 1.7, nvls_efficiency=0.74,
                       protocol_us=(13.2, 24.7, 60.4, 33.3), pipeline_mb=56.7)

# Networks: achievable = line rate x an achieved fraction; per-NIC latency = its part of one
# inter-node Simple step (a step crosses two NIC links and two GPU ports).
#   InfiniBand 0.96: NVIDIA/nccl issue #812 (DGX A100, 8 x 200 Gb/s IB, 192 GB/s all_reduce busbw
#     with rings) -> 192 / 200.  5 us: an inter-node step 13.4 us, NCCL's NET hop (14 us, tuning.cc).
#   EFA 0.93 and 37.7 us (v1, p4d/p4de; Simple protocol only, aws/aws-ofi-nccl #76): fitted to
#     2 x p4de all_reduce_perf (aws-samples/awsome-distributed-training, micro-benchmarks/nccl-tests/
#     README.md) with NCCL's 0.92 tree efficiency on top.  EFA v2 (p5): 0.93 carried over (its 2-node
#     curve is NVLS-bound above 256 MB), 104 us fitted to the 2 x p5 curve's 64 KB-128 MB.
#   RoCE and GPUDirect-TCPX(O): 0.9 and 5 / 10 us, assumed (no published curve fitted; flagged in docs).
IB_EFF, EFA_EFF, ETH_EFF = 0.96, 0.93, 0.90


def _net(kind: str, gbit_per_nic: float, nics: int, efficiency: float, latency_us: float,
         ll_protocols: bool = True) -> Network:
    return Network(kind, round(gbit_per_nic * nics / 8 * efficiency, 3), latency_us, nics, ll_protocols)


def _nvswitch_node(name: str, description: str, fabric: Fabric, network: Network | None, gpu: str,
                   source: str, gpus_per_node: int = 8) -> TopologySpec:
    return TopologySpec(name, description, gpus_per_node, fabric, network, gpu, source)


_H100_GENERIC = "8 H100 on NVSwitch (NVLink 4, 370 GB/s ring busbw, NVLS); "
PRESETS: dict[str, TopologySpec] = {
    "dgx-a100": _nvswitch_node(
        "dgx-a100", "DGX A100: 8 GPUs on NVSwitch; InfiniBand HDR, 8 x 200 Gb/s (one NIC per GPU)",
        A100_NVSWITCH, _net("infiniband", 200, 8, IB_EFF, 5.0), "A100-80GB",
        "NVSwitch: ND A100 v4 nccl-tests all_reduce 231.6 GB/s (Azure/AI-benchmarking-guide); "
        "IB: 192 GB/s busbw on DGX A100 8 x 200 Gb/s (NVIDIA/nccl #812)"),
    "dgx-h100": _nvswitch_node(
        "dgx-h100", "DGX H100: 8 GPUs on NVSwitch (NVLink 4, NVLS); InfiniBand NDR, 8 x 400 Gb/s",
        H100_NVSWITCH, _net("infiniband", 400, 8, IB_EFF, 5.0), "H100",
        "NVLink ring 370 GB/s and NVLS ~480 GB/s busbw (NVIDIA/nccl-tests #212); NDR line rate x 0.96 "
        "(IB fraction of NVIDIA/nccl #812)"),
    "dgx-h200": _nvswitch_node(
        "dgx-h200", "DGX H200: 8 H200 on NVSwitch (NVLink 4, NVLS); InfiniBand NDR, 8 x 400 Gb/s",
        H100_NVSWITCH, _net("infiniband", 400, 8, IB_EFF, 5.0), "H200",
        "as dgx-h100; ND H200 v5 nccl-tests all_reduce 480.0 GB/s at 8 GB (Azure/AI-benchmarking-guide)"),
    "dgx-b200": _nvswitch_node(
        "dgx-b200", "DGX B200: 8 B200 on NVSwitch (NVLink 5, NVLS); 8 x 400 Gb/s ConnectX-7",
        B200_NVSWITCH, _net("infiniband", 400, 8, IB_EFF, 5.0), "B200",
        "NVLink 5 ring 690 GB/s (ND GB200 v6 nccl-tests, Azure/AI-benchmarking-guide); NVLS efficiency "
        "0.74 (NCCL tuning.cc, Blackwell); DGX B200 datasheet 8 x 400 Gb/s"),
    "gb200-nvl72": _nvswitch_node(
        "gb200-nvl72", "GB200 NVL72: 72 GPUs in one NVLink 5 domain (NVLS); one 400 Gb/s NIC per GPU",
        B200_NVSWITCH, _net("infiniband", 400, 72, IB_EFF, 5.0), "B200",
        "NVLink 5 ring 690 GB/s (ND GB200 v6 nccl-tests, Azure/AI-benchmarking-guide); NVIDIA GB200 "
        "NVL72 spec: 72 GPUs on NVLink switches, ConnectX-7 400 Gb/s per GPU",
        gpus_per_node=72),
    "ib-h100": _nvswitch_node(
        "ib-h100", "H100 NVSwitch nodes on a slower InfiniBand fabric (4 x 400 Gb/s per node)",
        H100_NVSWITCH, _net("infiniband", 400, 4, IB_EFF, 5.0), "H100",
        "half the NICs of a DGX H100"),
    "p4d-efa": _nvswitch_node(
        "p4d-efa", "AWS p4d.24xlarge: 8 A100-40GB on NVSwitch; EFA 4 x 100 Gb/s (one NIC per two GPUs)",
        A100_NVSWITCH, _net("efa", 100, 4, EFA_EFF, 37.7, ll_protocols=False), "A100-40GB",
        "EFA fitted to 2 x p4de all_reduce_perf (aws-samples/awsome-distributed-training, nccl-tests "
        "README: 78.3 GB/s busbw at 2 GB, 161 us at 8 B); AWS spec 4 x 100 Gb/s; NVSwitch as dgx-a100"),
    "p4de-efa": _nvswitch_node(
        "p4de-efa", "AWS p4de.24xlarge: 8 A100-80GB on NVSwitch; EFA 4 x 100 Gb/s",
        A100_NVSWITCH, _net("efa", 100, 4, EFA_EFF, 37.7, ll_protocols=False), "A100-80GB",
        "EFA fitted to 2 x p4de all_reduce_perf (aws-samples/awsome-distributed-training, nccl-tests "
        "README); AWS spec 4 x 100 Gb/s EFA"),
    "p5-efa": _nvswitch_node(
        "p5-efa", "AWS p5.48xlarge: 8 H100 on NVSwitch (NVLS); EFA v2 32 x 100 Gb/s (4 per GPU)",
        H100_NVSWITCH, _net("efa", 400, 8, EFA_EFF, 104.0), "H100",
        "3200 Gb/s EFA (AWS instance spec); 2 x p5 all_reduce_perf 487 GB/s at 16 GB, 69 us at 8 B "
        "(aws-samples/awsome-distributed-training); EFA fraction 0.93 from p4de"),
    "p5e-efa": _nvswitch_node(
        "p5e-efa", "AWS p5e.48xlarge: 8 H200 on NVSwitch (NVLS); EFA v2 32 x 100 Gb/s",
        H100_NVSWITCH, _net("efa", 400, 8, EFA_EFF, 104.0), "H200",
        "as p5-efa with H200 GPUs (AWS instance spec: same 3200 Gb/s EFA)"),
    "gcp-a3": _nvswitch_node(
        "gcp-a3", "GCP a3-highgpu-8g: 8 H100 on NVSwitch; GPUDirect-TCPX 4 x 200 Gb/s",
        H100_NVSWITCH, _net("tcpx", 200, 4, ETH_EFF, 10.0), "H100",
        "Google Cloud A3 machine spec: 4 x 200 Gb/s GPU NICs (800 Gb/s); 0.9 achieved assumed"),
    "gcp-a3-mega": _nvswitch_node(
        "gcp-a3-mega", "GCP a3-megagpu-8g: 8 H100 on NVSwitch; GPUDirect-TCPXO 8 x 200 Gb/s",
        H100_NVSWITCH, _net("tcpx", 200, 8, ETH_EFF, 10.0), "H100",
        "Google Cloud A3 Mega machine spec: 8 x 200 Gb/s GPU NICs (1600 Gb/s); 0.9 achieved assumed"),
    "azure-nd-a100-v4": _nvswitch_node(
        "azure-nd-a100-v4", "Azure ND A100 v4: 8 A100-80GB on NVSwitch; InfiniBand HDR 8 x 200 Gb/s",
        A100_NVSWITCH, _net("infiniband", 200, 8, IB_EFF, 5.0), "A100-80GB",
        "Azure/AI-benchmarking-guide ND_A100_v4_results.md (all_reduce 1 KB-8 GB, the fitted curve); "
        "ND A100 v4 spec: 8 x 200 Gb/s HDR"),
    "azure-nd-h100-v5": _nvswitch_node(
        "azure-nd-h100-v5", "Azure ND H100 v5: 8 H100 on NVSwitch (NVLS); InfiniBand NDR 8 x 400 Gb/s",
        H100_NVSWITCH, _net("infiniband", 400, 8, IB_EFF, 5.0), "H100",
        "Azure/AI-benchmarking-guide ND_H100_v5_results.md (NVLS all_reduce 1 KB-8 GB, the fitted curve); "
        "ND H100 v5 spec: one 400 Gb/s NDR per GPU"),
    # Generic clusters: 8 H100 per node on NVSwitch, N Gbit/s per node in total.
    "roce-100": _nvswitch_node("roce-100", _H100_GENERIC + "one 100 Gb/s RoCE NIC per node", H100_NVSWITCH,
                               _net("roce", 100, 1, ETH_EFF, 5.0), "H100",
                               "generic: line rate x 0.9 (assumed RoCE fraction)"),
    "roce-200": _nvswitch_node("roce-200", _H100_GENERIC + "one 200 Gb/s RoCE NIC per node", H100_NVSWITCH,
                               _net("roce", 200, 1, ETH_EFF, 5.0), "H100",
                               "generic: line rate x 0.9 (assumed RoCE fraction)"),
    "roce-400": _nvswitch_node("roce-400", _H100_GENERIC + "one 400 Gb/s RoCE NIC per node", H100_NVSWITCH,
                               _net("roce", 400, 1, ETH_EFF, 5.0), "H100",
                               "generic: line rate x 0.9 (assumed RoCE fraction)"),
    "ib-400": _nvswitch_node("ib-400", _H100_GENERIC + "one 400 Gb/s InfiniBand NIC per node", H100_NVSWITCH,
                             _net("infiniband", 400, 1, IB_EFF, 5.0), "H100",
                             "generic: line rate x 0.96 (IB fraction, NVIDIA/nccl #812)"),
    "ib-800": _nvswitch_node("ib-800", _H100_GENERIC + "8 x 100 Gb/s InfiniBand (800 Gb/s per node)",
                             H100_NVSWITCH, _net("infiniband", 100, 8, IB_EFF, 5.0), "H100",
                             "generic: line rate x 0.96 (IB fraction, NVIDIA/nccl #812)"),
    "ib-1600": _nvswitch_node("ib-1600", _H100_GENERIC + "8 x 200 Gb/s InfiniBand (1600 Gb/s per node)",
                              H100_NVSWITCH, _net("infiniband", 200, 8, IB_EFF, 5.0), "H100",
                              "generic: line rate x 0.96 (IB fraction, NVIDIA/nccl #812)"),
    "ib-3200": _nvswitch_node("ib-3200", _H100_GENERIC + "8 x 400 Gb/s InfiniBand (3200 Gb/s per node)",
                              H100_NVSWITCH, _net("infiniband", 400, 8, IB_EFF, 5.0), "H100",
                              "generic: line rate x 0.96 (IB fraction, NVIDIA/nccl #812)"),
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
        return Topology(self.spec, self.world_size, self.gpus_per_node, links)

    def describe(self) -> str:
        kinds: dict[str, Link] = {}
        counts: dict[str, int] = {}
        for link in self.links.values():
            kinds.setdefault(link.kind, link)
            counts[link.kind] = counts.get(link.kind, 0) + 1
        parts = []
        for k, link in kinds.items():
            per_node = (f" x {self.nics} per node" if k == "nic" and self.nics > 1 else "")
            parts.append(f"{k} {link.capacity / GBps:.1f} GB/s{' shared' if link.shared else ''}{per_node}, "
                         f"{link.latency / US:.0f} us")
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
