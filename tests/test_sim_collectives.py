"""What a collective costs, and fitting that cost to nccl-tests measurements."""

import pytest

from zero_sim.engine.groups import process_groups
from zero_sim.system.collectives import CollectiveError, CollectiveModel, bus_factor, bytes_sent_per_rank
from zero_sim.system.nccl_tests import fit_nccl_tests, parse_nccl_tests
from zero_sim.system.topology import build_topology


def test_bus_factors_are_nccl_tests_definitions():
    assert bus_factor("all_reduce", 8) == 2 * 7 / 8
    assert bus_factor("reduce_scatter", 8) == 7 / 8
    assert bus_factor("all_gather", 8) == 7 / 8
    assert bus_factor("broadcast", 8) == 1
    assert bus_factor("all_reduce", 1) == 0


def test_gloo_reduce_scatter_moves_all_reduce_bytes():
    assert bytes_sent_per_rank("reduce_scatter", 1e6, 4, "gloo") == bytes_sent_per_rank("all_reduce", 1e6, 4)
    assert (bytes_sent_per_rank("reduce_scatter", 1e6, 4, "nccl")
            == bytes_sent_per_rank("all_reduce", 1e6, 4) / 2)


def plan_time(topology, n, kind, nbytes, backend="nccl", algorithm="ring"):
    topo = build_topology(topology, n)
    model = CollectiveModel(topo, backend, algorithm)
    return model.plan(kind, nbytes, process_groups(topo, "world")).isolated_time(topo)


def test_small_messages_are_latency_bound():
    per_byte_1mb = plan_time("pcie", 8, "all_reduce", 1 << 20) / (1 << 20)
    per_byte_100mb = plan_time("pcie", 8, "all_reduce", 100 << 20) / (100 << 20)
    assert per_byte_1mb > 1.2 * per_byte_100mb


def test_a_shared_pcie_bus_makes_each_gpu_slower_as_gpus_are_added():
    # 'GPT Adventures, Part 4': 2 GPUs on one bus reach ~20 GB/s busbw; 4 on the same bus halve each share.
    two = build_topology("pcie-host-bridge", 2)
    four = build_topology("pcie-host-bridge", 4)
    b2 = (CollectiveModel(two, algorithm="ring").plan("all_reduce", 1 << 30, process_groups(two, "world"))
          .busbw(two))
    b4 = (CollectiveModel(four, algorithm="ring").plan("all_reduce", 1 << 30, process_groups(four, "world"))
          .busbw(four))
    assert 19e9 < b2 < 21e9
    assert b4 == pytest.approx(b2 / 2, rel=0.05)


def test_crossing_the_host_bridge_is_bounded_by_the_bridge():
    topo = build_topology("pcie-host-bridge", 8)
    pair = ((3, 7),)  # one GPU in each subgroup, as the blog post's second nccl-tests table
    plan = CollectiveModel(topo, algorithm="ring").plan("all_reduce", 1 << 30, pair)
    assert plan.busbw(topo) == pytest.approx(13.8e9, rel=0.02)


def test_tree_all_reduce_beats_ring_for_small_buffers_on_many_ranks():
    ring = plan_time("dgx-a100", 256, "all_reduce", 64 << 10, algorithm="ring")
    tree = plan_time("dgx-a100", 256, "all_reduce", 64 << 10, algorithm="tree")
    assert tree < ring / 5


@pytest.mark.parametrize("table,expected_busbw", [("seed002_pcie_pair.txt", 19.9e9),
                                                  ("seed002_host_bridge.txt", 13.8e9)])
def test_fitting_seed_002_tables_recovers_their_bandwidth_and_times(data_dir, figures, table, expected_busbw):
    parsed = parse_nccl_tests((data_dir / table).read_text())
    assert parsed.n_ranks == 2
    fit = fit_nccl_tests(parsed)
    figures(f"{table}: latency {fit.latency_s * 1e6:.0f} us, busbw {fit.busbw / 1e9:.2f} GB/s "
            f"(table's largest size: {expected_busbw / 1e9:.2f}), worst time error {fit.max_rel_error:.1%}")
    assert fit.busbw == pytest.approx(expected_busbw, rel=0.05)
    assert fit.max_rel_error <= 0.05


def test_native_nccl_tests_output_parses():
    text = (
        "#  nThread 1 nGpus 1 minBytes 8 maxBytes 128 step: 2(factor) warmup iters: 5 iters: 20\n"
        "# Using devices\n"
        "#  Rank  0 Group  0 Pid  1 on host device  0 [0x07] NVIDIA A100\n"
        "#   nranks 8\n"
        "#       size         count      type   redop    root     time   algbw   busbw #wrong"
        "     time   algbw   busbw #wrong\n"
        "     1048576        262144     float     sum      -1    60.12   17.44   30.52      0"
        "    59.80   17.53   30.68      0\n"
        "     4194304       1048576     float     sum      -1    98.40   42.63   74.60      0"
        "    97.90   42.84   74.97      0\n"
        "    16777216       4194304     float     sum      -1   205.10   81.80  143.15      0"
        "   204.30   82.12  143.71      0\n"
    )
    parsed = parse_nccl_tests(text)
    assert parsed.n_ranks == 8
    assert [r.size_bytes for r in parsed.rows] == [1048576, 4194304, 16777216]
    assert parsed.rows[0].time_us == 60.12


def test_a_malformed_table_is_one_clear_sentence():
    with pytest.raises(CollectiveError, match="no nccl-tests rows found"):
        parse_nccl_tests("this is not\na table at all\n")
