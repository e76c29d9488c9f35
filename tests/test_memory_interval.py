"""Reserved memory carries an 80% interval, and "will it fit?" a three-way answer.

The interval comes from the published memory points (how far reserved and allocated memory came
from the prediction), never below what the tensors and the context hold, never above less than
the caching allocator's worst measured fragmentation.  ``fits`` when the whole interval is within
the GPU, ``does_not_fit`` when all of it is above, ``tight`` in between; ``memory.fits`` stays
the answer for the estimate.
"""

import math

import pandas as pd
import pytest

from zero_sim import simulate
from zero_sim.cli import main
from zero_sim.intervals.memory import (
    DOES_NOT_FIT,
    FITS,
    RATIO_HIGH,
    RATIO_LOW,
    TIGHT,
    fit_verdict,
    published_ratios,
    reserved_interval,
)
from zero_sim.plan.planner import ranked
from zero_sim.published.judge import load_points, predict

LLAMA_70B = dict(model="llama3-70b", topology="dgx-h100", micro_batch=1, seq_len=8192, recompute="full")


def test_the_interval_brackets_the_estimate_and_the_verdict_follows_it():
    m = simulate(strategy="zero3", gpus=32, steps=1, **LLAMA_70B).metrics["memory"]
    low, high = m["reserved_interval_bytes"]
    assert m["peak_bytes"] + m["context_bytes"] <= low <= m["reserved_peak_bytes"] <= high
    assert m["fit_verdict"] == fit_verdict((low, high), m["capacity_bytes"])
    assert m["fits"]  # the estimate fits ...
    assert m["fit_verdict"] == TIGHT  # ... but a run reserving a third more than estimated would not


@pytest.mark.parametrize("gpus,verdict", [(8, DOES_NOT_FIT), (64, FITS)])
def test_far_from_the_capacity_the_verdict_is_certain(gpus, verdict):
    m = simulate(strategy="zero3", gpus=gpus, steps=1, **LLAMA_70B).metrics["memory"]
    assert m["fit_verdict"] == verdict
    assert m["fits"] == (verdict == FITS)


def test_the_allocator_floor_and_the_worst_fragmentation_bound_the_interval():
    """With no reserve at all (set by hand) the low end is still what the tensors hold; the high end
    at least what GMLake's 30% fragmentation would reserve."""
    peak, context = 50e9, 1.5e9
    low, high = reserved_interval(peak + context, peak, context)
    assert low == pytest.approx(peak + context)
    assert high >= peak / 0.7 + context


def test_the_ratios_are_the_published_points_10th_and_90th_percentiles(figures):
    """The constants are what the published memory points give today (recomputed here)."""
    memory_points = [p for p in load_points() if p.get("metric") == "peak_memory_gb"]
    ratios = sorted(published_ratios([predict(p) for p in memory_points]))
    assert len(ratios) == len(memory_points) >= 10

    def percentile(q: float) -> float:
        k = (len(ratios) - 1) * q
        lo, hi = math.floor(k), math.ceil(k)
        return ratios[lo] + (ratios[hi] - ratios[lo]) * (k - lo)

    figures(f"published / predicted memory over {len(ratios)} points: 10th {percentile(0.1):.3f}, "
            f"90th {percentile(0.9):.3f} (shipped {RATIO_LOW}, {RATIO_HIGH})")
    assert percentile(0.1) == pytest.approx(RATIO_LOW, abs=0.01)
    assert percentile(0.9) == pytest.approx(RATIO_HIGH, abs=0.01)


def test_the_cli_says_the_verdict_first(capsys):
    assert main(["simulate", "--model", "llama3-70b", "--strategy", "zero3", "--gpus", "32", "--topology",
                 "dgx-h100", "--micro-batch", "1", "--seq-len", "8192", "--recompute", "full"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("  TIGHT ") and "80%:" in lines[1]
    assert any(line.startswith("  memory          tight; ") for line in lines)


def test_plan_breaks_near_ties_toward_room_to_spare():
    """Among candidates within 5% of the fastest, the one with its whole interval inside the GPU, or
    else the most memory to spare, ranks first."""
    rows = pd.DataFrame([
        {"fits": True, "tokens_per_s": 100.0, "spare_GB": 0.4, "fit_verdict": TIGHT},
        {"fits": True, "tokens_per_s": 98.0, "spare_GB": 9.3, "fit_verdict": TIGHT},
        {"fits": True, "tokens_per_s": 97.0, "spare_GB": 30.0, "fit_verdict": FITS},
        {"fits": True, "tokens_per_s": 60.0, "spare_GB": 50.0, "fit_verdict": FITS},
    ])
    assert list(ranked(rows)["spare_GB"]) == [30.0, 9.3, 0.4, 50.0]
