"""Compute time per op, and topologies built from presets or from nvidia-smi."""

import pytest

from zero_sim.system.gpus import GPUS
from zero_sim.system.hardware import ComputeModel
from zero_sim.system.topology import TopologyError, build_topology, parse_nvidia_smi_topo

SEED_002_TOPO = """
        GPU0 GPU1 GPU2 GPU3 GPU4 GPU5 GPU6 GPU7 NIC0 NIC1
GPU0 X NODE NODE NODE SYS SYS SYS SYS SYS
GPU1 NODE X NODE NODE SYS SYS SYS SYS SYS
GPU2 NODE NODE X NODE SYS SYS SYS SYS SYS
GPU3 NODE NODE NODE X SYS SYS SYS SYS SYS
GPU4 SYS SYS SYS SYS X NODE NODE NODE NODE
GPU5 SYS SYS SYS SYS NODE X NODE NODE NODE
GPU6 SYS SYS SYS SYS NODE NODE X NODE PHB
GPU7 SYS SYS SYS SYS NODE NODE NODE X NODE
"""


def test_roofline_time_is_flops_over_efficient_peak():
    model = ComputeModel(GPUS["H100"], efficiency=0.5)
    assert model.layer_time("block", "fwd", 989e12, 1024) == pytest.approx(2.0)


def test_a_calibration_table_wins_and_scales_with_tokens():
    model = ComputeModel(GPUS["H100"], efficiency=0.5, layer_seconds={"block": {"fwd": 0.010, "bwd": 0.020}},
                         calibrated_tokens=1024)
    assert model.layer_time("block", "bwd", 1e12, 2048) == pytest.approx(0.040)
    # Not calibrated: the flat roofline at the efficiency given.
    assert model.layer_time("head", "fwd", 989e12, 1024) == pytest.approx(2.0)


def test_the_optimizer_is_memory_bound():
    model = ComputeModel(GPUS["A100-80GB"], memory_efficiency=1.0)
    assert model.optimizer_time(1_000_000_000) == pytest.approx(28e9 / 2039e9)


def test_nvidia_smi_topo_of_seed_002_gives_two_pcie_subgroups():
    spec = parse_nvidia_smi_topo(SEED_002_TOPO)
    assert spec.fabric.kind == "pcie" and spec.fabric.subgroups == 2
    topo = build_topology(spec, 8)
    assert "host-bridge" in {link.kind for link in topo.links.values()}
    assert topo.bottleneck_kind() in ("pcie-bus", "host-bridge")


def test_a_bandwidth_override_changes_only_the_bottleneck():
    topo = build_topology("p4d-efa", 16)
    slow = topo.with_bandwidth(100.0)
    assert topo.bottleneck_kind() == "nic"
    assert {link.capacity for link in slow.links.values() if link.kind == "nic"} == {100e9 / 8}
    assert {link.capacity for link in slow.links.values() if link.kind == "nvlink"} == {230e9}


def test_a_single_host_cannot_hold_more_ranks_than_it_has():
    with pytest.raises(TopologyError, match="single host"):
        build_topology("cpu-gloo", 128)
    with pytest.raises(TopologyError, match="paste the matrix"):
        parse_nvidia_smi_topo("nothing here")


# --- how a cluster's links are labelled -------------------------------------------------------

def _nic_label(**settings) -> str:
    from zero_sim import simulate

    cluster = simulate(gpus=16, steps=1, seq_len=128, **settings).metrics["cluster"]
    return next(part for part in cluster.split("; ") if part.startswith("nic "))


def test_a_preset_nic_label_shows_the_rate_used_and_the_line_rate_it_comes_from():
    # ib-400: one 400 Gbit/s NIC per node at InfiniBand's achieved 0.96: 48 GB/s used.
    assert _nic_label(topology="ib-400") == "nic 48.0 GB/s (400 Gbit/s line rate x 0.96 achieved), 5 us"
    # ib-3200: 8 of them; the node's figure is the same unit as the NIC's, never a derated Gbit/s.
    assert _nic_label(topology="ib-3200") == ("nic 48.0 GB/s x 8 = 384 GB/s per node "
                                              "(8 x 400 Gbit/s line rate x 0.96 achieved), 5 us")


def test_a_bandwidth_given_on_the_command_line_is_labelled_as_given_in_the_same_units():
    per_node = _nic_label(topology="dgx-h100", node_bandwidth_gbps=400)
    assert per_node == "nic 6.25 GB/s x 8 = 50.0 GB/s per node (as given: 400 Gbit/s per node), 5 us"
    assert _nic_label(topology="ib-400", bandwidth_gbps=400) == \
        "nic 50.0 GB/s (as given: 400 Gbit/s per node), 5 us"
