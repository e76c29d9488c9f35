"""Validation's sampled cases and how their errors are summed up; nothing here starts a run."""

import math
import statistics
from collections import Counter
from dataclasses import replace

import pytest

from sim2real import validate as v
from sim2real.sampling import (
    BANDWIDTH_GBPS,
    BUCKET_MB,
    BUCKETED_REAL,
    QUICK_GRID,
    SAMPLED_MODELS,
    SAMPLED_RANKS,
    SAMPLED_SHAPES,
    SAMPLED_STRATEGIES,
    sample_cases,
)
from sim2real.validate_report import error_summary, headline, noise_band


@pytest.fixture(scope="module")
def many():
    return sample_cases(400, seed=11, with_latency=True)


def test_a_seed_draws_the_same_cases_every_time_and_another_seed_others():
    assert sample_cases(30, seed=5) == sample_cases(30, seed=5)
    assert sample_cases(30, seed=5) != sample_cases(30, seed=6)
    assert len(set(sample_cases(30, seed=5))) == 30


def test_strategies_are_dealt_evenly_so_each_median_rests_on_several_cases():
    for k, seed in ((30, 5), (30, 6), (7, 1), (10, 2)):
        counts = Counter(c.strategy for c in sample_cases(k, seed))
        # Every strategy gets k/7 cases, rounded down or up: at k = 30, four or five.
        assert {counts[s] for s in SAMPLED_STRATEGIES} <= {k // 7, -(-k // 7)}, (k, seed, counts)
    # The order in which they come is random: two seeds deal their first round differently.
    assert [c.strategy for c in sample_cases(7, 1)] != [c.strategy for c in sample_cases(7, 2)]


def test_the_sample_reaches_every_corner_of_the_space(many):
    assert {c.strategy for c in many} == set(SAMPLED_STRATEGIES)
    assert {c.shape for c in many} == set(SAMPLED_SHAPES)
    assert {c.gpus for c in many} == set(SAMPLED_RANKS)
    assert {c.model for c in many} == set(SAMPLED_MODELS)
    assert any(c.latency_ms > 0 for c in many) and any(c.latency_ms == 0 for c in many)


def test_every_drawn_case_is_one_the_machine_can_run(many):
    v.check_grid(many, v.Options())  # raises on any case it would refuse
    for c in many:
        # Two nodes split the ranks in halves; the global batch always splits over the ranks.
        assert not (c.shape == "two-nodes" and c.gpus % 2)
        assert c.global_batch % c.gpus == 0
        assert BANDWIDTH_GBPS[0] * 0.95 <= c.bandwidth_gbps <= BANDWIDTH_GBPS[1] * 1.05
        # Only strategies with buckets get a bucket size.
        assert (c.bucket_mb is not None) == (c.strategy in BUCKETED_REAL)
        if c.bucket_mb is not None:
            assert BUCKET_MB[0] * 0.95 <= c.bucket_mb <= BUCKET_MB[1] * 1.05


def test_bandwidths_are_spread_log_uniformly(many):
    """As many draws below the geometric middle of the range as above it."""
    middle = math.sqrt(BANDWIDTH_GBPS[0] * BANDWIDTH_GBPS[1])
    below = sum(c.bandwidth_gbps < middle for c in many) / len(many)
    assert 0.4 < below < 0.6


def test_without_netem_no_case_asks_for_latency():
    assert all(c.latency_ms == 0 for c in sample_cases(60, seed=3, with_latency=False))


def test_the_quick_grid_is_broad_keeps_to_the_smaller_models_and_could_have_been_drawn():
    assert {c.model for c in QUICK_GRID} <= {"tiny", "small"}
    assert len({c.strategy for c in QUICK_GRID}) == len({c.shape for c in QUICK_GRID}) == 3
    v.check_grid(QUICK_GRID, v.Options())
    for c in QUICK_GRID:  # every setting lies inside the sampled space
        assert c.strategy in SAMPLED_STRATEGIES and c.gpus in SAMPLED_RANKS and c.shape in SAMPLED_SHAPES
        assert BANDWIDTH_GBPS[0] <= c.bandwidth_gbps <= BANDWIDTH_GBPS[1]
        assert (c.bucket_mb is not None) == (c.strategy in BUCKETED_REAL)


def test_a_case_that_leaves_a_setting_open_takes_the_grids_default():
    opts = v.Options(model="tiny", shape="two-nodes", global_batch=8)
    case = v.resolved(v.Case("ddp", 2, 1.0), opts)
    assert (case.model, case.shape, case.global_batch) == ("tiny", "two-nodes", 8)
    planned = v.planned_run(replace(case, model="small"), opts, None)
    assert planned["model"] == "small" and planned["global_batch"] == 8


@pytest.mark.parametrize("case,fragment", [
    (v.Case("ddp", 3, 1.0, shape="two-nodes", global_batch=6), "nproc must be even"),
    (v.Case("ddp", 3, 1.0, global_batch=8), "--global-batch 8 does not split across 3 ranks"),
    (v.Case("ddp", 2, 1.0, model="huge"), "unknown model 'huge'"),
])
def test_a_case_the_machine_cannot_run_is_refused_before_anything_starts(case, fragment):
    with pytest.raises(v.ValidationError, match=fragment):
        v.check_grid([case], v.Options())


def test_the_noise_band_is_how_far_two_halves_of_a_run_are_apart():
    assert noise_band(1.0, 1.0) == 0
    assert noise_band(0.9, 1.1) == pytest.approx(0.2)
    # Twelve steps: step 0 is warm-up, steps 1-5 and 6-11 are the halves.
    assert v.halves(12) == ((1, 5), (6, 11))
    run = {"step_times_s": [9.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.2, 1.2, 1.2, 1.2, 1.2, 1.2]}
    assert v.step_noise_band(run) == pytest.approx(0.2 / 1.1)


def test_the_summary_puts_each_error_beside_the_noise_and_splits_it_by_what_varies():
    rows = [{"strategy": s, "shape": sh, "gpus": n, "model": "small", "error": e, "noise_band": b,
             "exposed_comm_error": e / 2, "exposed_comm_noise_band": b * 2,
             "compute_error": -e / 4, "compute_noise_band": b / 2}
            for s, sh, n, e, b in [("ddp", "uniform", 2, 0.02, 0.01), ("ddp", "two-nodes", 4, -0.10, 0.03),
                                   ("fsdp", "uniform", 3, 0.04, 0.02)]]
    s = error_summary(rows)
    assert s["median_abs_error"] == pytest.approx(0.04)
    assert s["median_noise_band"] == pytest.approx(0.02)
    assert s["median_abs_exposed_comm_error"] == pytest.approx(0.02)
    assert s["by"]["strategy"]["ddp"] == {"median_abs_error": pytest.approx(statistics.median([0.02, 0.10])),
                                          "cases": 2}
    assert s["by"]["shape"]["two-nodes"]["median_abs_error"] == pytest.approx(0.10)
    assert set(s["by"]["gpus"]) == {"2", "3", "4"}
    assert s["median_abs_compute_error"] == pytest.approx(0.01)
    line = headline(s | {"cases": rows})
    assert "step time 4.0% (noise band 2.0%)" in line and "over 3 cases" in line
    assert "exposed communication 2.0% (noise band 4.0%); compute 1.0% (noise band 1.0%)" in line


def test_a_validation_written_before_compute_was_measured_has_no_compute_figure():
    rows = [{"strategy": "ddp", "shape": "uniform", "gpus": 2, "model": "small", "error": 0.03,
             "noise_band": 0.01, "exposed_comm_error": 0.05, "exposed_comm_noise_band": 0.02}]
    s = error_summary(rows)
    assert s["median_abs_compute_error"] is None
    assert "compute" not in headline(s | {"cases": rows})
