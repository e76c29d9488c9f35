"""How sure a prediction is: the whole-run overhead fitted per GPU generation, leave one source
out, and the 80% intervals its residuals give every prediction on a modelled GPU."""

from __future__ import annotations

import json

import pytest

from zero_sim import simulate
from zero_sim.intervals.speed import interval_line
from zero_sim.published.fit import coverage, interval, refit, summary
from zero_sim.published.judge import Judged
from zero_sim.published.ranking import rank_pairs
from zero_sim.system.gpus import GPUS
from zero_sim.system.run_overheads import FIT_FILE, fitted, run_overhead

LLAMA_ON_H100 = dict(model="llama3-8b", strategy="fsdp", gpus=16, topology="dgx-h100", micro_batch=1,
                     seq_len=4096, steps=1)


def test_a_gpu_prediction_carries_an_interval_around_it():
    m = simulate(**LLAMA_ON_H100).metrics
    low, high = m["tokens_per_s_per_gpu_interval"]
    assert low < m["tokens_per_s_per_gpu"] < high
    step_low, step_high = m["step_time_s_interval"]
    assert step_low < m["step_time_s"] < step_high
    assert m["prediction_interval"]["level"] == 0.8 and m["prediction_interval"]["group"] == "default stack"
    # MFU leaves out the causal mask's unneeded half of attention, which TFLOP/s counts as papers do.
    assert 0 < m["mfu"] < m["tflops_per_gpu"] / GPUS["H100"].peak_tflops
    assert interval_line(m).startswith(f"{low:,.0f}-{high:,.0f} tokens/s per GPU (80% interval)")


def test_naming_the_stack_uses_the_residuals_of_runs_whose_stack_was_known():
    known = simulate(**LLAMA_ON_H100, stack="pytorch-eager").metrics["prediction_interval"]
    default = simulate(**LLAMA_ON_H100).metrics["prediction_interval"]
    assert (known["group"], default["group"]) == ("stack known", "default stack")
    assert known["low_error"] != default["low_error"] or known["high_error"] != default["high_error"]


def test_no_interval_where_the_published_runs_say_nothing():
    assert simulate(**LLAMA_ON_H100, efficiency=0.5).metrics["tokens_per_s_interval"] is None


def test_the_whole_run_overhead_applies_per_generation_and_can_be_turned_off():
    hopper = run_overhead("H100")
    assert hopper == fitted()["overheads"]["hopper"] and run_overhead("CPU") == 1.0
    assert run_overhead("B200") == fitted()["pooled"]  # no published Blackwell run: the pooled figure
    fitted_step = simulate(**LLAMA_ON_H100).metrics["compute_time_s"]
    raw_step = simulate(**LLAMA_ON_H100, run_overhead=1.0).metrics["compute_time_s"]
    assert fitted_step == pytest.approx(raw_step * hopper, rel=0.02)


def test_the_interval_is_the_distribution_free_order_statistic():
    errors = [i / 100 for i in range(-13, 14)]  # 27 errors, -13% .. +13%
    band = interval(errors)
    assert (band["low"], band["high"]) == (-0.12, 0.12)  # k = floor(28 x 0.1) = 2: the 2nd from each end
    narrow = interval([0.01, 0.02, 0.03])
    assert (narrow["low"], narrow["high"]) == (-0.05, 0.05)  # never claimed narrower than 5% either side
    assert interval([])["low"] is None


def test_coverage_builds_each_points_interval_without_its_own_source():
    class Row:
        def __init__(self, source):
            self.source = source

    rows = [Row("a")] * 5 + [Row("b")] * 5
    errors = [-0.3] * 5 + [0.3] * 5  # each source sits far outside the band of the other
    assert coverage(rows, errors) == 0.0
    assert summary([0.1, -0.2, 0.3])["too_fast"] == 2


def test_pairs_are_ordered_as_published_when_the_difference_is_large_enough():
    def judged(pid, published, predicted):
        return Judged({"id": pid, "metric": "tokens_per_s_per_gpu", "value": published}, predicted, 0.0)

    points = [judged("slow", 100, 90), judged("fast", 130, 120), judged("same", 102, 80)]
    pairs = [{"a": "slow", "b": "fast"}, {"a": "slow", "b": "same"}]
    ranking = rank_pairs(pairs, points)
    assert ranking["counted"] == 1 and ranking["ordered_share"] == 1.0
    assert ranking["pairs"][0]["published_ratio"] == pytest.approx(1.3)


def test_the_shipped_fit_is_what_the_published_table_gives_today():
    """run_overheads.json is written by `zero-sim validate --published --refit`; a change to the
    model or the table that moves the fit must refit it."""
    shipped = json.loads(FIT_FILE.read_text())
    fresh = json.loads(json.dumps(refit(), sort_keys=True))
    assert fresh["overheads"] == pytest.approx(shipped["overheads"], rel=1e-9)
    assert fresh["intervals"] == shipped["intervals"], "run `zero-sim validate --published --refit`"
