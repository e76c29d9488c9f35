"""Topology presets: the clusters people run on, each with where its figures come from.

Plain data over :class:`zero_sim.system.specs.TopologySpec`.  ``docs/network.md`` lists the
presets with their sources and the nccl-tests curves their figures were fitted to.
"""

from __future__ import annotations

from zero_sim.system.specs import Fabric, Network, TopologySpec

# --------------------------------------------------------------------------- preset figures
# NVSwitch ports: the busbw a ring reaches at the largest sizes of a single-node nccl-tests
# all_reduce (the ring's edges each have a port to themselves, so busbw = the port's rate).
#   A100 (NVLink 3): 230 GB/s (the old figure, kept: Azure/AI-benchmarking-guide, Azure_Results/
#     ND_A100_v4_results.md, 8 GPUs, 231.6 GB/s at 8 GB; the better box of the 'GPT Adventures, Part 4'
#     blog post: 205 GB/s near 1 GB).
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
# EFA v1 beyond two nodes: the 0.93 above is a two-node figure, where NCCL's tree pairs the two
# nodes and each NIC streams to one peer.  From three nodes on, the same NICs reach about 0.6 of
# line rate: p4dn.24xlarge all_reduce_perf at 1 GB, 57.2 GB/s busbw on 2 nodes, 31.8 on 3, 29.6 on
# 4, of 4 x 100 Gb/s = 50 GB/s (NVIDIA/nccl issue #527); p3dn 100 Gb/s, 10 GB/s on 2 nodes and 6-8
# GB/s on 8 to 32 (NVIDIA/nccl #235, aws/aws-ofi-nccl #19).  0.61 of line rate / 0.93 = 0.66.
# NCCL's own tuner makes the same break (src/graph/tuning.cc: ``bw = nNodes <= 2 ? bwIntra :
# bwInter``).  InfiniBand and EFA v2 keep their figure: no published curve beyond two nodes shows a
# drop (NVIDIA/nccl #812's 192 GB/s is a multi-node DGX A100 ring).
EFA_V1_BEYOND_TWO_NODES = 0.66


def _net(kind: str, gbit_per_nic: float, nics: int, efficiency: float, latency_us: float,
         ll_protocols: bool = True, beyond_two_nodes: float = 1.0) -> Network:
    return Network(kind, round(gbit_per_nic * nics / 8 * efficiency, 3), latency_us, nics, ll_protocols,
                   line_gbit=gbit_per_nic, achieved=efficiency, beyond_two_nodes=beyond_two_nodes)


# p4d/p4de: 4 x 100 Gb/s EFA v1, Simple protocol only, the drop beyond two nodes above.
_EFA_V1 = _net("efa", 100, 4, EFA_EFF, 37.7, ll_protocols=False, beyond_two_nodes=EFA_V1_BEYOND_TWO_NODES)


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
        A100_NVSWITCH, _EFA_V1, "A100-40GB",
        "EFA fitted to 2 x p4de all_reduce_perf (aws-samples/awsome-distributed-training, nccl-tests "
        "README: 78.3 GB/s busbw at 2 GB, 161 us at 8 B); AWS spec 4 x 100 Gb/s; NVSwitch as dgx-a100"),
    "p4de-efa": _nvswitch_node(
        "p4de-efa", "AWS p4de.24xlarge: 8 A100-80GB on NVSwitch; EFA 4 x 100 Gb/s",
        A100_NVSWITCH, _EFA_V1, "A100-80GB",
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
        "nccl-tests in the blog post 'GPT Adventures, Part 4: Distribute It': pair on one bus 19.9 GB/s "
        "(= bus 40 / 2 edges), across the bridge 13.8 GB/s",
    ),
    "pcie": TopologySpec(
        "pcie", "8 GPUs on one PCIe switch (no NVLink), all sharing one bus",
        8, Fabric("pcie", 24.0, 15.0, subgroups=1, bus_gbps=40.0, bus_latency_us=10.0),
        Network("ethernet", 12.5, 20.0), "A100-40GB",
        "PCIe Gen4 x16 ~24 GB/s per GPU; bus as in the pair measurement of the blog post "
        "'GPT Adventures, Part 4: Distribute It'",
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
