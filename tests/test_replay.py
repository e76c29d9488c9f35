"""A real run's configuration becomes a simulator scenario: same model, ranks, batch, strategy and links."""

import pytest
import torch

from real_runs.model import PRESETS, build_model, count_params
from real_runs.record import Recorder
from real_runs.strategies import STRATEGIES
from real_runs.strategies.base import AdamW, bucketize
from sim2real.replay import REAL_TO_SIM, ReplayError, predict_run, real_workload, scenario_for_run
from zero_sim.vocabulary.model_states import formula


def planned(strategy, world=2, model="tiny", cluster=None, **extra):
    cfg = PRESETS[model]
    run = {"strategy": strategy, "world_size": world, "global_batch": 8, "seq_len": cfg.max_seq,
           "model": model, "model_config": cfg.to_dict(), "device": "cpu", "bucket_mb": 25.0, **extra}
    if cluster:
        run["cluster"] = cluster
    return run


@pytest.mark.parametrize("model", ["nano", "tiny", "small"])
def test_the_replayed_workload_has_exactly_the_real_models_parameters(model):
    cfg = PRESETS[model]
    w = real_workload(cfg.to_dict(), micro_batch=2, seq_len=cfg.max_seq)
    assert w.params == count_params(build_model(cfg, seed=0))
    assert [layer.kind for layer in w.layers] == ["embedding", *["block"] * cfg.n_layer, "head"]
    assert all(layer.fwd_flops > 0 for layer in w.layers[1:])


def test_every_real_strategy_has_a_simulated_counterpart():
    assert set(REAL_TO_SIM) == set(STRATEGIES)


@pytest.mark.parametrize("real", sorted(STRATEGIES))
def test_a_name_means_the_same_algorithm_on_both_sides(real):
    """A real strategy replays as the simulated strategy of its own name; a suffix names only
    an implementation variant (torch's own, or a ZeRO-2 launch mode) that the knobs select."""
    simulated, knobs, _ = REAL_TO_SIM[real]
    base = real.removesuffix("-torch").removesuffix("-step").removesuffix("-hook").removesuffix("-qwz")
    assert simulated == base
    assert real == base or knobs, f"the variant {real} must say through its knobs how it differs"


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
@pytest.mark.parametrize("world", [2, 4])
def test_predicted_model_states_are_exactly_the_real_runs_bytes(strategy, world):
    """The real runs check their bytes against the ZeRO formulas; the simulator must land on the
    same bytes."""
    sim = predict_run(planned(strategy, world))
    psi = sim.scenario.workload.params
    expected = formula(STRATEGIES[strategy].stage, psi, world, elem_bytes=4, k=8)["bytes"]
    # shard padding only
    assert sim.metrics["memory"]["model_states_bytes"] == pytest.approx(expected, rel=0.002)


def rank0_state_bytes(strategy, world, model="tiny", bucket_mb=25.0):
    """What real_runs' own ``setup`` allocates for rank 0 of ``world``: its flat buffers, padded
    per buffer to a multiple of ``world``, with no process group needed to build them."""
    real = STRATEGIES[strategy]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("torch.distributed.get_rank", lambda *a, **k: 0)
        mp.setattr("torch.distributed.get_world_size", lambda *a, **k: world)
        built = real(build_model(PRESETS[model], seed=0), Recorder(0, torch.device("cpu")),
                     AdamW(lr=1e-3), bucket_mb)
    return sum(built.model_state_bytes().values())


@pytest.mark.parametrize("strategy", ["zero1", "zero2", "zero2-step", "zero2-hook", "fsdp"])
@pytest.mark.parametrize("bucket_mb, model", [(0.5, "tiny"), (25.0, "tiny"), (25.0, "small")])
def test_at_a_world_that_does_not_divide_the_buffers_the_padding_is_predicted_too(strategy, bucket_mb, model):
    """At N=3 every flat buffer is padded on its own (a bucket, a tensor, an FSDP layer: the real
    FSDP's embedding and head are two, where torch's root would be one), so a rank holds a
    little more than Psi/N; the prediction counts the same pads."""
    sim = predict_run(planned(strategy, 3, model=model, global_batch=6, bucket_mb=bucket_mb))
    padded = rank0_state_bytes(strategy, 3, model=model, bucket_mb=bucket_mb)
    params = sim.scenario.workload.params
    unpadded = formula(STRATEGIES[strategy].stage, params, 3, elem_bytes=4, k=8)["bytes"]
    assert padded > unpadded  # the case is one where padding shows
    assert sim.metrics["memory"]["model_states_bytes"] == padded


@pytest.mark.parametrize("strategy, collective", [("ddp", "all_reduce"), ("zero1", "all_reduce"),
                                                  ("zero2", "reduce_scatter")])
@pytest.mark.parametrize("bucket_mb", [25.0, 4.0, 0.1])
def test_the_simulated_gradient_buckets_are_the_real_ones(strategy, collective, bucket_mb):
    """Same bytes, same order: at the default cap the first bucket holds only 1 MiB on both sides."""
    run = planned(strategy, 2, model="small", bucket_mb=bucket_mb)
    first = 2**20 if bucket_mb == 25.0 else None
    real = [sum(p.numel() * 4 for p in group) for group in
            bucketize(list(build_model(PRESETS["small"], seed=0).parameters()), bucket_mb * 2**20, first)]
    ops = [op for op in predict_run(run).step_ops() if op["rank"] == 0 and op["name"].startswith(collective)]
    sim = [int(op["bytes"]) for op in sorted(ops, key=lambda op: int(op["name"].rsplit(" B", 1)[1]))]
    assert sim == real


@pytest.mark.parametrize("strategy", ["zero1", "zero2"])
def test_the_simulated_sharded_step_updates_and_gathers_bucket_by_bucket_as_the_real_one(strategy):
    """real_runs' ZeRO-1 and ZeRO-2 walk the buckets in the order they were reduced: update this
    rank's slice once its reduction lands, launch ``all_gather B<k>``, go on to the next."""
    run = planned(strategy, 2, model="small", bucket_mb=25.0)
    real = [sum(p.numel() * 4 for p in group) for group in
            bucketize(list(build_model(PRESETS["small"], seed=0).parameters()), 25 * 2**20, 2**20)]
    ops = sorted((op for op in predict_run(run).step_ops() if op["rank"] == 0), key=lambda op: op["start_s"])
    gathers = [op for op in ops if op["name"].startswith("all_gather")]
    assert [op["name"] for op in gathers] == [f"all_gather B{k}" for k in range(len(real))]
    assert [int(op["bytes"]) for op in gathers] == real
    # The first bucket's gather is under way before the last bucket's update has run.
    last_update = next(op for op in ops if op["name"] == f"opt B{len(real) - 1}")
    assert gathers[0]["start_s"] < last_update["start_s"]


def test_an_emulated_cluster_selects_its_topology_and_bandwidth():
    kw, _ = scenario_for_run(planned("ddp", 4,
                                     cluster={"kind": "two-nodes", "bandwidth_gbps": 0.5, "nproc": 4}))
    assert (kw["topology"], kw["bandwidth_gbps"], kw["gpus_per_node"]) == ("emu-two-nodes", 0.5, 2)
    kw, _ = scenario_for_run(planned("ddp", 2,
                                     cluster={"kind": "uniform", "bandwidth_gbps": 1.0, "nproc": 2}))
    assert (kw["topology"], kw["gpus_per_node"]) == ("emu-uniform", 1)


def test_a_slower_emulated_link_predicts_a_slower_step():
    slow = predict_run(planned("ddp", 2, model="small", cluster={"kind": "uniform", "bandwidth_gbps": 0.25}))
    fast = predict_run(planned("ddp", 2, model="small", cluster={"kind": "uniform", "bandwidth_gbps": 4.0}))
    assert slow.metrics["exposed_comm_s"] > 4 * fast.metrics["exposed_comm_s"]


@pytest.mark.parametrize("run,fragment", [
    ({"strategy": "ddp"}, "lacks the field"),
    (planned("ddp-fancy"), "unknown real strategy"),
    (planned("ddp", cluster={"kind": "torus", "bandwidth_gbps": 1}), "cluster shape 'torus' is unknown"),
])
def test_a_run_that_cannot_be_replayed_says_why_in_one_sentence(run, fragment):
    with pytest.raises(ReplayError) as err:
        scenario_for_run(run)
    assert fragment in str(err.value) and "\n" not in str(err.value)


# --- runs in bf16 and runs on GPUs -----------------------------------------------------------------
# The configurations below are written by hand to test the mapping alone: no measured figure is
# read from them, and no GPU recording is stood for by one.

def test_a_bf16_run_replays_in_the_simulators_mixed_precision():
    fp32_kw, _ = scenario_for_run(planned("zero2", 2))
    bf16_kw, _ = scenario_for_run(planned("zero2", 2) | {"precision": "bf16", "dtype": "bfloat16"})
    assert (fp32_kw["precision"], bf16_kw["precision"]) == ("fp32", "mixed")
    fp32, bf16 = predict_run(planned("zero2", 2)), predict_run(planned("zero2", 2) | {"precision": "bf16"})
    # Mixed-precision ZeRO-2 on 2 ranks: 2 + (2 + 12) / 2 = 9 bytes a parameter against 4 + 12 / 2 = 10.
    ratio = bf16.metrics["memory"]["model_states_bytes"] / fp32.metrics["memory"]["model_states_bytes"]
    assert ratio == pytest.approx(9 / 10, rel=1e-3)


def cuda_run(name: str, world: int = 8, topology: str | None = None) -> dict:
    return planned("fsdp", world, global_batch=world) | {
        "device": "cuda", "backend": "nccl", "precision": "bf16",
        "gpu": {"name": name, "count": world, "topology": topology}}


NVLINK_MATRIX = "\tGPU0\tGPU1\nGPU0\t X \tNV18\nGPU1\tNV18\t X \n"
PCIE_MATRIX = "\tGPU0\tGPU1\nGPU0\t X \tPHB\nGPU1\tPHB\t X \n"


@pytest.mark.parametrize("name,preset,matrix,topology", [
    ("NVIDIA H100 80GB HBM3", "H100", NVLINK_MATRIX, "dgx-h100"),
    ("NVIDIA A100-SXM4-80GB", "A100-80GB", None, "dgx-a100"),
    ("NVIDIA A100-SXM4-40GB", "A100-40GB", NVLINK_MATRIX, "p4d-efa"),
    ("NVIDIA H200", "H200", NVLINK_MATRIX, "dgx-h200"),
    ("NVIDIA H100 PCIe", "H100-PCIe", PCIE_MATRIX, "pcie"),
    ("NVIDIA H100 80GB HBM3", "H100", PCIE_MATRIX, "pcie"),
])
def test_a_cuda_run_replays_on_the_gpu_its_stamp_names_over_its_recorded_links(name, preset, matrix,
                                                                               topology):
    kw, _ = scenario_for_run(cuda_run(name, topology=matrix))
    assert (kw["gpu"], kw["backend"], kw["topology"], kw["precision"]) == (preset, "nccl", topology, "mixed")
    assert kw["gpus_per_node"] == 8


@pytest.mark.parametrize("run,fragment", [
    (cuda_run("NVIDIA H100 80GB HBM3") | {"gpu": None}, "does not say which GPU"),
    (cuda_run("NVIDIA H100 NVL"), "no GPU preset models a 'NVIDIA H100 NVL'"),
    (cuda_run("Tesla V100-SXM2-32GB"), "does not say how its 8 x V100 are linked"),
    (cuda_run("Tesla V100-SXM2-32GB", topology=NVLINK_MATRIX),
     "no topology preset has V100s linked by NVLink"),
])
def test_a_cuda_run_that_cannot_be_placed_on_a_preset_says_why(run, fragment):
    with pytest.raises(ReplayError) as err:
        scenario_for_run(run)
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_a_cuda_run_is_predicted_with_nccl_on_its_gpu():
    sim = predict_run(cuda_run("NVIDIA H100 80GB HBM3", topology=NVLINK_MATRIX))
    assert sim.scenario.cluster.gpu == "H100" and sim.scenario.cluster.backend == "nccl"
    assert sim.metrics["memory"]["fits"] and sim.metrics["comm_time_s"] > 0
    # Mixed-precision FSDP over 8 ranks: (2 + 2 + 12) bytes a parameter / 8, padding aside.
    held = sim.metrics["memory"]["model_states_bytes"]
    assert held == pytest.approx(16 * sim.scenario.workload.params / 8, rel=1e-3)
