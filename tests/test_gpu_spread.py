"""GPUs of one model differ in speed, and a synchronous step waits for the slowest of them.

The per-op compute model is one benchmarked GPU's; a job of N GPUs runs at the expected
slowest of N draws (zero_sim/system/gpu_spread.py)."""

from __future__ import annotations

import pytest

from zero_sim.calibration import Calibration, ComputeCalibration
from zero_sim.scenario import ScenarioError, simulate
from zero_sim.system.gpu_spread import GPU_SPEED_SIGMA, expected_max_normal, slowest_gpu_factor

# Without compute slowed beside collectives, every compute op's length is the model's alone.
RUN = dict(model="gpt2-1.5b", topology="dgx-h100", strategy="ddp", micro_batch=4, steps=2,
           overlap_slowdown=0.0)


def test_the_expected_slowest_of_n_follows_the_normal_order_statistics():
    # Tabulated expectations of the largest of n standard normals.
    for n, tabulated in [(2, 0.5642), (3, 0.8463), (8, 1.4236), (100, 2.5076)]:
        assert expected_max_normal(n) == pytest.approx(tabulated, abs=1e-4)


def test_the_stated_spread_reproduces_its_source():
    # Five per cent between the GPUs of an 8-GPU node, read as the expected range of 8 draws.
    assert 2 * GPU_SPEED_SIGMA * expected_max_normal(8) == pytest.approx(0.05, abs=0.001)


def test_one_gpu_is_the_typical_one_and_more_gpus_wait_longer():
    assert slowest_gpu_factor(1) == 1.0
    factors = [slowest_gpu_factor(n) for n in (2, 8, 64, 1024)]
    assert factors == sorted(factors) and len(set(factors)) == 4
    assert slowest_gpu_factor(8) == pytest.approx(1 / (1 - 0.0175 * 1.4236))


def test_a_spread_that_leaves_no_speed_is_refused():
    with pytest.raises(ValueError, match="spread"):
        slowest_gpu_factor(10_000, sigma=0.3)


def test_every_modelled_compute_op_of_a_gpu_job_is_stretched_by_the_factor():
    typical = simulate(**RUN, gpus=8, gpu_spread=0.0)
    spread = simulate(**RUN, gpus=8)
    assert spread.scenario.hardware.gpu_spread == GPU_SPEED_SIGMA
    assert spread.scenario.hardware.slowest_rank_factor == pytest.approx(slowest_gpu_factor(8))
    assert spread.metrics["compute_time_s"] == pytest.approx(
        typical.metrics["compute_time_s"] * slowest_gpu_factor(8), rel=1e-9)


def test_a_stated_efficiency_and_cpu_ranks_are_taken_as_they_are():
    flat = simulate(**RUN, gpus=8, efficiency=0.5).scenario.to_dict()
    assert flat["gpu_spread"] == 0.0 and flat["slowest_rank_factor"] == 1.0
    cpu = simulate(model="gpt2-124m", topology="cpu-gloo", strategy="ddp", gpus=2).scenario.to_dict()
    assert cpu["gpu_spread"] == 0.0 and cpu["slowest_rank_factor"] == 1.0


def test_a_measured_layer_table_keeps_its_own_slowest_rank_and_refuses_a_spread_beside_it():
    passes = {"fwd": 1e-3, "bwd": 2e-3}
    compute = ComputeCalibration({kind: passes for kind in ("embedding", "block", "head")}, 4096, 1e-8,
                                 2, 2, 1.0, "tiny", slowest_rank_factor=1.1)
    table = Calibration({}, compute, "nccl", {"host": "test"})
    measured = simulate(**RUN, gpus=2, calibration=table).scenario.to_dict()
    assert measured["slowest_rank_factor"] == 1.1 and measured["gpu_spread"] == 0.0
    with pytest.raises(ScenarioError, match="drop --gpu-spread or the calibration"):
        simulate(**RUN, gpus=2, calibration=table, gpu_spread=0.02)


def test_pure_data_parallelism_over_efa_keeps_less_per_gpu_the_more_nodes_join():
    # What a DDP run loses at scale, each from its own model: EFA's rate past two nodes (about 0.6 of
    # line rate, NVIDIA/nccl #527), the last bucket's all_reduce that nothing hides, and the slowest
    # of n GPUs setting every rank's pace.
    run = dict(model="gpt3-350m", strategy="ddp", topology="p4d-efa", micro_batch=4, seq_len=1024)
    per_gpu = {n: simulate(**run, gpus=n) for n in (8, 16, 256)}
    one, two, many = (per_gpu[n].metrics["tokens_per_s_per_gpu"] for n in (8, 16, 256))
    assert many < two < one
    # Communication-bound past two nodes: with EFA at its two-node rate 32 nodes would keep about
    # 0.68 of one node's speed per GPU; at 0.6 of line rate they keep well under 0.6.
    assert many / one < 0.6
    assert (two - many) > 2 * (one - two)
    exposed = {n: r.metrics["exposed_comm_s"] for n, r in per_gpu.items()}
    assert exposed[256] > 6 * exposed[16] > 0  # the last bucket and the slower network show
    factors = [per_gpu[n].scenario.hardware.slowest_rank_factor for n in (8, 16, 256)]
    assert factors == sorted(factors) and factors[-1] < 1.06  # grows as the max of n draws: slowly
