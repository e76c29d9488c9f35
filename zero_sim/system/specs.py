"""What a machine's links are, as data: a link, a node's fabric, the network between nodes, and
the spec that names a whole cluster shape.  :mod:`zero_sim.system.topology` builds the links
of a concrete cluster from a spec; :mod:`zero_sim.system.topology_presets` lists the specs.
"""

from __future__ import annotations

from dataclasses import dataclass

GBps = 1e9
US = 1e-6

# The kinds the topology code knows how to build links for; a spec read from a file is held to them.
FABRIC_KINDS = ("nvswitch", "pcie", "loopback")
NETWORK_KINDS = ("infiniband", "efa", "ethernet", "roce", "tcpx")


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

    kind: str  # one of FABRIC_KINDS
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

    kind: str  # one of NETWORK_KINDS
    nic_gbps: float  # GB/s per node per direction, all NICs together
    latency_us: float  # each NIC link's part of one inter-node step (NCCL Simple protocol)
    nics: int = 1
    ll_protocols: bool = True  # False: only NCCL's Simple protocol crosses it (EFA v1, aws-ofi-nccl #76)
    # Where nic_gbps comes from, when a preset derived it: each NIC's line rate (Gbit/s) and the
    # fraction of it achieved (nic_gbps = line_gbit x nics / 8 x achieved); None: stated as is.
    line_gbit: float | None = None
    achieved: float | None = None
    # What a collective spanning more than two nodes reaches of ``nic_gbps`` (fitted at two nodes):
    # 1 where no multi-node curve says otherwise; EFA v1's is in topology_presets.py.
    beyond_two_nodes: float = 1.0


@dataclass(frozen=True)
class TopologySpec:
    name: str
    description: str
    gpus_per_node: int
    fabric: Fabric
    network: Network | None
    gpu: str  # default GPU model
    source: str  # where the figures come from
