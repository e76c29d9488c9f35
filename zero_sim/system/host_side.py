"""The host side of a node, for offloading: its memory, its cores, each GPU's link to it, and how
fast an optimizer runs on its CPU.

Offloading (ZeRO-Offload, ZeRO-3 ``offload_param``, FSDP2's ``CPUOffloadPolicy``) keeps model
states in the node's RAM and runs the update on its cores; what it costs is decided here:

* **host memory** per node (``Host.memory_gb``): what the offloaded states of every rank on the
  node must fit in.  The training processes' own memory (Python, the dataset, CUDA's pinned
  staging) is not counted: the check is a lower bound on what the node needs.
* **host links**: each GPU reaches host memory over a PCIe x16 link (NVLink-C2C on Grace), one
  capacity per direction (PCIe is full duplex).  ``gpus_per_link`` GPUs sit behind one PCIe
  switch whose uplink to the CPU they share (DGX A100: two GPUs per switch), so two GPUs copying at
  once each get half of it.  Copies are flows on the fluid network
  (:mod:`zero_sim.engine.network`), links named ``d2h.n<node>.l<k>`` / ``h2d.n<node>.l<k>``.
* **the CPU optimizer**: Adam on the CPU updates ``rate x cores`` parameters per second, the
  cores split evenly among the node's ranks (DeepSpeed's ``--bind_cores_to_rank``; unbound,
  its ranks' OpenMP threads contend: 1.3x slower in DeepSpeed PR #7474).  Rates from one
  published measurement, DeepSpeed PR #735 (an 11.6B-parameter GPT-2 on a DGX-2, 2 x Xeon
  Platinum 8168 = 48 cores): DeepSpeed's vectorised CPU Adam 8.2 s, ``torch.optim.Adam`` 56 s,
  i.e. 29.5 and 4.3 million parameters per second per core.  A newer CPU is faster per core;
  ``--cpu-adam-rate`` replaces the figure.  The update is also bounded by memory bandwidth
  (about 28 bytes per parameter: fp16 gradient in, fp32 weight, m and v read and written, fp16
  weight out), which the published rate stays far below on these machines, so it is not modelled.

Each preset's figures and their sources are in :data:`HOSTS`; ``--host-memory-gb``,
``--host-cores`` and ``--host-link-gbps`` replace them (a topology without figures needs them).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from zero_sim.system.specs import GBps, Link
from zero_sim.vocabulary import D2H, H2D  # the two directions of a host link, and their copy streams

# DeepSpeed PR #735: 11.6e9 parameters in 8.2 s (DeepSpeedCPUAdam) and 56 s (torch.optim.Adam) on 48 cores.
CPU_ADAM_RATE = 11.6e9 / 8.2 / 48 / 1e6  # million parameters per second per core: 29.5
TORCH_CPU_ADAM_RATE = 11.6e9 / 56.0 / 48 / 1e6  # 4.3


@dataclass(frozen=True)
class Host:
    """One node's CPU side: RAM, physical cores, and its GPUs' links to host memory (GB/s per direction)."""

    memory_gb: float  # RAM per node
    cores: int  # physical cores per node (vCPUs / 2 on cloud instances with SMT)
    d2h_gbps: float  # achievable GB/s of one host link, GPU to host
    h2d_gbps: float  # host to GPU
    gpus_per_link: int = 1  # GPUs behind one PCIe switch, sharing its uplink
    source: str = ""


# Achievable copy rates over one GPU's host link.
#   PCIe Gen4 x16 (A100): 25 GB/s measured peak of 32 line rate (BaM, ZaidQureshi/bam #54).
#   PCIe Gen5 x16 (H100/H200/B200): 52.8 GB/s GPU to host, 35.2 host to GPU, nvbandwidth's SM copies
#     on an 8 x H100 node (NVIDIA/nvbandwidth #24); the copy engines torch uses may differ.
#   NVLink-C2C (GB200): 900 GB/s both directions per Grace (NVIDIA GB200 NVL72 spec), two GPUs per
#     Grace; line rate per direction, no published achieved figure.
_GEN4 = dict(d2h_gbps=25.0, h2d_gbps=25.0)
_GEN5 = dict(d2h_gbps=52.8, h2d_gbps=35.2)
_LINKS = "links: A100 PCIe Gen4 25 GB/s (BaM, bam #54); H100 Gen5 52.8 / 35.2 GB/s (nvbandwidth #24)"

_DGX_A100 = Host(1024, 128, gpus_per_link=2, **_GEN4,
                 source="DGX A100 datasheet: 2 x AMD EPYC 7742 (128 cores), 1 TB; two GPUs per PCIe switch "
                        "(DGX A100 system architecture); " + _LINKS)
_DGX_H100 = Host(2048, 112, gpus_per_link=1, **_GEN5,
                 source="DGX H100/H200 datasheet: 2 x Xeon Platinum 8480C (112 cores), 2 TB; one GPU per "
                        "uplink assumed; " + _LINKS)
_P4D = Host(1152 * 1.073741824, 48, gpus_per_link=2, **_GEN4,
            source="AWS p4d/p4de.24xlarge: 96 vCPUs (48 cores), 1152 GiB; two GPUs per PCIe switch as "
                   "DGX A100; " + _LINKS)
_P5 = Host(2048 * 1.073741824, 96, gpus_per_link=1, **_GEN5,
           source="AWS p5/p5e.48xlarge: 192 vCPUs (96 cores), 2048 GiB; one GPU per uplink assumed; "
                  + _LINKS)
_A3 = Host(1872, 104, gpus_per_link=1, **_GEN5,
           source="GCP a3-highgpu-8g / a3-megagpu-8g: 208 vCPUs (104 cores), 1872 GB; one GPU per uplink "
                  "assumed; " + _LINKS)
_ND_A100 = Host(1900 * 1.073741824, 96, gpus_per_link=2, **_GEN4,
                source="Azure ND A100 v4: 96 cores, 1900 GiB; two GPUs per PCIe switch as DGX A100; "
                       + _LINKS)
_ND_H100 = Host(1900 * 1.073741824, 96, gpus_per_link=1, **_GEN5,
                source="Azure ND H100 v5: 96 cores, 1900 GiB; one GPU per uplink assumed; " + _LINKS)
_NVL72 = Host(36 * 480, 36 * 72, d2h_gbps=450.0, h2d_gbps=450.0, gpus_per_link=2,
              source="GB200 NVL72 spec: 36 Grace CPUs (72 cores, 480 GB LPDDR5X each), NVLink-C2C 900 GB/s "
                     "per Grace shared by its two GPUs (line rate per direction)")
_PCIE_SERVER = Host(512, 64, gpus_per_link=8, **_GEN4,
                    source="assumed: a 2-socket PCIe server, 64 cores, 512 GB; the GPUs of one PCIe switch "
                           "share its x16 uplink; " + _LINKS)

HOSTS: dict[str, Host] = {
    "dgx-a100": _DGX_A100, "dgx-h100": _DGX_H100, "dgx-h200": _DGX_H100,
    "dgx-b200": replace(_DGX_H100, source="DGX B200 datasheet: 2 x Xeon Platinum 8570 (112 cores), 2 TB; "
                                          "PCIe Gen5 figures as H100; one GPU per uplink assumed"),
    "gb200-nvl72": _NVL72, "p4d-efa": _P4D, "p4de-efa": _P4D, "p5-efa": _P5, "p5e-efa": _P5,
    "gcp-a3": _A3, "gcp-a3-mega": _A3, "azure-nd-a100-v4": _ND_A100, "azure-nd-h100-v5": _ND_H100,
    # Generic H100 clusters: a DGX H100's host, assumed.
    **{name: replace(_DGX_H100, source="assumed as DGX H100: " + _DGX_H100.source)
       for name in ("ib-h100", "roce-100", "roce-200", "roce-400", "ib-400", "ib-800", "ib-1600", "ib-3200")},
    "pcie": _PCIE_SERVER,
    "pcie-host-bridge": replace(_PCIE_SERVER, gpus_per_link=4),
}


def host_for(topology_name: str, gpus_per_node: int, memory_gb: float | None = None,
             cores: int | None = None, link_gbps: float | None = None) -> Host | None:
    """The preset's host with any figure the user gave in its place; None when neither says."""
    host = HOSTS.get(topology_name)
    if host is None:
        if memory_gb is None or cores is None or link_gbps is None:
            return None
        host = Host(memory_gb, cores, link_gbps, link_gbps, 1, "given")
    if memory_gb is not None:
        host = replace(host, memory_gb=memory_gb, source=host.source + "; RAM given")
    if cores is not None:
        host = replace(host, cores=cores, source=host.source + "; cores given")
    if link_gbps is not None:
        host = replace(host, d2h_gbps=link_gbps, h2d_gbps=link_gbps, source=host.source + "; link given")
    return replace(host, gpus_per_link=min(host.gpus_per_link, gpus_per_node))


def link_name(direction: str, node: int, local_rank: int, host: Host) -> str:
    return f"{direction}.n{node}.l{local_rank // host.gpus_per_link}"


def host_links(host: Host, nodes: int, gpus_per_node: int) -> dict[str, Link]:
    """Every host link of the cluster, each direction its own capacity."""
    links = {}
    for node in range(nodes):
        for local in range(0, gpus_per_node, host.gpus_per_link):
            for direction, gbps in ((D2H, host.d2h_gbps), (H2D, host.h2d_gbps)):
                name = link_name(direction, node, local, host)
                links[name] = Link(name, "host-link", gbps * GBps, 0.0)
    return links


def with_host_links(topo, host: Host):
    """``topo`` with its nodes' host links added, and ``host`` attached for the copies to find them."""
    from zero_sim.system.topology import Topology

    links = topo.links | host_links(host, topo.nodes, topo.ranks_per_node)
    return Topology(topo.spec, topo.world_size, topo.gpus_per_node, links, host)


def copy_loads(topo, rank: int, direction: str, collapsed: bool) -> tuple[tuple[str, int], ...]:
    """The host link a copy from or to ``rank`` crosses, and its load: a collapsed rank stands for
    every GPU behind the same uplink, which copy at the same moment."""
    host = topo.host
    local = topo.local_rank(rank)
    name = link_name(direction, topo.node_of(rank), local, host)
    first = local - local % host.gpus_per_link
    sharers = max(1, min(host.gpus_per_link, topo.ranks_per_node - first)) if collapsed else 1
    return ((name, sharers),)


def cpu_adam_seconds(params: int, cores_per_rank: float, rate_mparams_per_core: float) -> float:
    """Seconds for one rank's CPU to update ``params`` parameters with Adam."""
    return params / (rate_mparams_per_core * 1e6 * cores_per_rank)
