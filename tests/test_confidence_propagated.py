"""The 80% interval is propagated through the simulated step from its inputs' spreads: a step whose
collectives are exposed is less sure than one hidden behind compute, a feature no fit has seen is
less sure still and says why, a run that does not fit has no interval, and the simulated step is
the median of what the inputs allow."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from zero_sim import simulate
from zero_sim.cli import main
from zero_sim.engine.retime import retime, timeline_of
from zero_sim.intervals.speed import interval_line, makes_progress
from zero_sim.plan.search import search
from zero_sim.plan.sweep import run_rows
from zero_sim.scenario import pipeline
from zero_sim.system import input_spreads

LLAMA_ZERO1 = dict(model="llama3-8b", strategy="zero1", topology="p5-efa", micro_batch=1, seq_len=4096)
COMM_BOUND = dict(LLAMA_ZERO1, gpus=256, grad_accum=1)
COMPUTE_BOUND = dict(LLAMA_ZERO1, gpus=8, grad_accum=32)
ZERO3_IB = dict(model="llama3-8b", strategy="zero3", topology="ib-400", gpus=64, micro_batch=1, seq_len=4096)
ZEROPP = dict(zero_quantized_weights=True, zero_hpz_partition_size=8, zero_quantized_gradients=True)


def relative_width(metrics: dict) -> float:
    low, high = metrics["tokens_per_s_per_gpu_interval"]
    return (high - low) / metrics["tokens_per_s_per_gpu"]


def position(metrics: dict) -> float:
    """Where the estimate sits in its interval: 0 at the low end, 1 at the high end."""
    low, high = metrics["tokens_per_s_per_gpu_interval"]
    return (metrics["tokens_per_s_per_gpu"] - low) / (high - low)


@pytest.fixture(scope="module")
def comm_bound():
    return simulate(**COMM_BOUND).metrics


@pytest.fixture(scope="module")
def compute_bound():
    return simulate(**COMPUTE_BOUND).metrics


@pytest.mark.parametrize("settings", [
    dict(COMM_BOUND, gpus=32),
    dict(ZERO3_IB, **ZEROPP, gpus=16),
    dict(model="gpt2-124m", strategy="ddp", topology="dgx-a100", gpus=8, micro_batch=1, steps=1),
    dict(model="llama3-8b", strategy="zero2", topology="dgx-h100", gpus=8, micro_batch=1, seq_len=1024,
         offload_optimizer="cpu"),
])
def test_the_replay_with_every_factor_one_gives_the_simulated_step_back(settings):
    p = pipeline.prepare(**settings)
    program = pipeline._program(p)
    engine = pipeline._engine(p, program, pipeline.rank_figures(p))
    run = engine.run()
    ends = run.step_ends[run.simulated_ranks[0]]
    simulated = ends[-1] - (ends[-2] if len(ends) > 1 else 0.0)
    timeline = timeline_of(program, run.op_seconds, p.settings.steps, p.settings.host_overhead_us * 1e-6)
    every_op = np.zeros(len(program.ops), dtype=int)  # every op on the table's one row
    replayed = retime(timeline, np.ones((1, 3)), every_op, np.ones(3))
    assert replayed == pytest.approx([simulated] * 3, rel=1e-9)
    # Doubling every op's time (issue costs too) doubles the step: the replay is the step's own graph.
    assert retime(timeline, np.full((1, 1), 2.0), every_op, np.full(1, 2.0))[0] == \
        pytest.approx(2 * simulated, rel=1e-9)


def test_a_communication_bound_step_is_less_sure_than_a_compute_bound_one(comm_bound, compute_bound):
    assert relative_width(comm_bound) >= 1.5 * relative_width(compute_bound)
    assert 0.2 <= position(compute_bound) <= 0.8  # the estimate inside the middle 60% of its interval
    assert 0.2 <= position(comm_bound) <= 0.8
    # What widens each: the exposed collectives across 32 nodes, and compute where they hide.
    shares = comm_bound["prediction_interval"]["shares"]
    assert max(shares, key=shares.get) == "collectives across nodes"
    assert "collectives across nodes" in interval_line(comm_bound)
    inside = compute_bound["prediction_interval"]
    assert max(inside["shares"], key=inside["shares"].get) == "compute"


def test_a_hidden_collectives_spread_barely_moves_the_step(compute_bound):
    # Inside the node the collectives are taken as within 10-25%, but with 32 micro-batches of
    # compute to hide behind they move the step by well under 2%: propagated, not pasted.
    how = compute_bound["prediction_interval"]
    assert how["inputs"]["collectives inside a node"] >= input_spreads.INTRA_NODE
    assert how["shares"]["collectives inside a node"] < 0.02


def test_a_feature_never_fitted_is_less_sure_and_says_why():
    plain = simulate(**ZERO3_IB).metrics
    zeropp = simulate(**ZERO3_IB, **ZEROPP).metrics
    assert relative_width(zeropp) >= 1.2 * relative_width(plain)
    assert [u["feature"] for u in zeropp["prediction_interval"]["unfitted"]] == ["ZeRO++"]
    assert plain["prediction_interval"]["unfitted"] == []
    assert "ZeRO++ is judged, never fitted" in interval_line(zeropp)
    assert 0.2 <= position(zeropp) <= 0.8


@pytest.mark.parametrize("plain, feature_on, feature", [
    (dict(strategy="fsdp"), dict(precision="fp8"), "FP8"),
    (dict(strategy="zero2"), dict(offload_optimizer="cpu"), "offloading"),
    (dict(strategy="ddp", lora_rank=16), dict(lora_base="nf4"), "QLoRA"),
])
def test_each_unfitted_feature_widens_its_interval_by_a_fifth_or_more(plain, feature_on, feature):
    base = dict(model="llama3-8b", topology="dgx-h100", gpus=8, micro_batch=1, seq_len=2048, steps=1)
    used = simulate(**base, **plain, **feature_on).metrics
    plain = simulate(**base, **plain).metrics
    assert [u["feature"] for u in used["prediction_interval"]["unfitted"]] == [feature]
    assert relative_width(used) >= 1.2 * relative_width(plain)


def test_the_simulated_step_is_the_median_and_the_interval_is_the_same_every_time(compute_bound):
    how = compute_bound["prediction_interval"]
    step_low, step_high = compute_bound["step_time_s_interval"]
    assert step_low < compute_bound["step_time_s"] < step_high
    assert (how["low_error"], how["high_error"]) == pytest.approx(
        (step_low / compute_bound["step_time_s"] - 1, step_high / compute_bound["step_time_s"] - 1))
    assert abs(how["median_shift"]) < 0.1  # the sampled median is reported, a few percent at most
    again = simulate(**COMPUTE_BOUND).metrics
    assert again["tokens_per_s_interval"] == compute_bound["tokens_per_s_interval"]


def test_no_interval_for_a_run_that_does_not_fit(capsys):
    too_big = ["simulate", "--model", "llama3-70b", "--strategy", "ddp", "--topology", "dgx-h100",
               "--gpus", "8", "--micro-batch", "1", "--seq-len", "4096"]
    assert main(too_big) == 0
    text = capsys.readouterr().out
    assert "DOES NOT FIT" in text and "likely range" not in text
    assert main([*too_big, "--json"]) == 0
    metrics = json.loads(capsys.readouterr().out)
    assert metrics["prediction_interval"] is None
    assert all(metrics[key] is None for key in metrics if key.endswith("_interval"))


def test_a_run_that_makes_no_progress_has_no_speed_to_be_unsure_of():
    assert makes_progress({"memory": {"fits": True}, "tokens_per_s": 1e4, "step_time_s": 0.5})
    assert not makes_progress({"memory": {"fits": True}, "tokens_per_s": 0.0, "step_time_s": 0.5})
    assert not makes_progress({"memory": {"fits": False}, "tokens_per_s": 1e4, "step_time_s": 0.5})


def test_a_plan_computes_intervals_only_for_the_rows_it_shows():
    space = [dict(model="gpt2-124m", strategy=strategy, topology="dgx-a100", gpus=8, micro_batch=mb, steps=1)
             for strategy in ("ddp", "zero1", "zero2") for mb in (1, 2)]
    table = search(space, top=2)
    shown = table[table["fits"]].head(2)
    rest = table[table["fits"]].iloc[2:]
    assert shown["tokens_per_s_low"].notna().all()
    assert (shown["tokens_per_s_low"] < shown["tokens_per_s"]).all()
    assert len(rest) and rest["tokens_per_s_low"].isna().all()
    # Re-timed from the steps the search kept, they are what simulating with intervals gives.
    columns = ["step_ms_low", "step_ms_high", "tokens_per_s_low", "tokens_per_s_high"]
    again = pd.DataFrame(run_rows([{k: row[k] for k in space[0]} for row in shown.to_dict("records")]))
    assert shown[columns].reset_index(drop=True).equals(again[columns])
    assert "later_interval" not in table
