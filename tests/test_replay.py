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
    base = real.removesuffix("-torch").removesuffix("-step").removesuffix("-hook")
    assert simulated == base
    assert real == base or knobs, f"the variant {real} must say through its knobs how it differs"


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
@pytest.mark.parametrize("world", [2, 4])
def test_predicted_model_states_are_exactly_the_real_runs_bytes(strategy, world):
    """The real runs check their bytes against the ZeRO formulas; the simulator must land on the
    same bytes."""
    sim = predict_run(planned(strategy, world))
    psi = sim.scenario["params"]
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
@pytest.mark.parametrize("bucket_mb", [0.5, 25.0])
def test_at_a_world_that_does_not_divide_the_buffers_the_padding_is_predicted_too(strategy, bucket_mb):
    """At N=3 every flat buffer is padded on its own (a bucket, a tensor, an FSDP unit), so a
    rank holds a little more than Psi/N; the prediction counts the same pads."""
    sim = predict_run(planned(strategy, 3, global_batch=6, bucket_mb=bucket_mb))
    padded = rank0_state_bytes(strategy, 3, bucket_mb=bucket_mb)
    unpadded = formula(STRATEGIES[strategy].stage, sim.scenario["params"], 3, elem_bytes=4, k=8)["bytes"]
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
