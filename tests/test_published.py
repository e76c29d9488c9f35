"""Published measurements judge the simulator: each point is predicted from its configuration
alone, and the published figure only measures the error."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from zero_sim.published import POINTS_FILE, PublishedError, judge, load_points
from zero_sim.published.fit import in_fit, refit
from zero_sim.published.judge import MEMORY_METRICS, unfitted_feature

ROOT = Path(__file__).resolve().parent.parent

AR_1G = """
[[point]]
id = "ar-1g"
source = "a made-up nccl-tests line"
metric = "collective_time_us"
value = 8000.0
[point.collective]
kind = "all_reduce"
bytes = 1073741824
gpus = 8
topology = "dgx-a100"
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "points.toml"
    path.write_text(text)
    return path


def test_a_points_error_is_the_prediction_against_the_published_figure(tmp_path):
    (ar,) = judge(load_points(write(tmp_path, AR_1G))).judged
    assert ar.predicted > 0
    assert ar.error == pytest.approx((ar.predicted - 8000.0) / 8000.0)


def test_busbw_is_nccl_tests_busbw_of_the_predicted_time(tmp_path):
    busbw = AR_1G.replace('id = "ar-1g"', 'id = "bw"').replace('"collective_time_us"', '"busbw_gbps"')
    time_us, bw = judge(load_points(write(tmp_path, AR_1G + busbw))).judged
    assert bw.predicted == pytest.approx(2**30 * 2 * 7 / 8 / (time_us.predicted * 1e-6) / 1e9)


def test_a_scenario_the_simulator_refuses_is_reported_not_raised(tmp_path):
    text = """
[[point]]
id = "nonsense"
source = "nowhere"
metric = "step_time_s"
value = 1.0
[point.scenario]
model = "no-such-model"
"""
    (p,) = judge(load_points(write(tmp_path, text))).judged
    assert p.error is None and "no-such-model" in p.refusal


@pytest.mark.parametrize("change, fragment", [
    (lambda t: t + t, "appears twice"),
    (lambda t: t.replace('"collective_time_us"', '"speed"'), "has metric 'speed'"),
    (lambda t: t.replace("value = 8000.0", "value = -1"), "positive numeric value"),
    (lambda t: t.replace('source = "a made-up nccl-tests line"', 'source = ""'),
     "where its figure was published"),
])
def test_a_bad_points_file_is_refused_with_one_sentence(tmp_path, change, fragment):
    with pytest.raises(PublishedError, match=fragment):
        load_points(write(tmp_path, change(AR_1G)))


def test_the_table_draws_on_many_sources_and_covers_memory_and_collectives():
    points = load_points(POINTS_FILE)
    assert len(points) >= 25
    sources = {p["source"].split(",")[0] for p in points}
    assert len(sources) >= 5, sources
    assert sum(p["metric"] in MEMORY_METRICS for p in points) >= 6
    assert sum("collective" in p for p in points) >= 5
    assert all(p.get("unstated") for p in points if "scenario" in p), "say what the source left out"


PLAIN_RUN = """
[[point]]
id = "plain"
source = "a made-up run"
metric = "tokens_per_s_per_gpu"
value = 3000.0
[point.scenario]
model = "llama2-7b"
strategy = "fsdp"
gpus = 16
topology = "dgx-a100"
micro_batch = 1
seq_len = 4096
"""


@pytest.mark.parametrize("old, new", [
    ('topology = "dgx-a100"', 'topology = "dgx-h100"\nprecision = "fp8"'),
    ('strategy = "fsdp"', 'strategy = "zero3"\nzero_quantized_weights = true'),
    ('strategy = "fsdp"', 'strategy = "zero3"\nzero_hpz_partition_size = 8'),
    ('strategy = "fsdp"', 'strategy = "zero3"\noffload_optimizer = "cpu"'),
    ("value = 3000.0", "value = 3000.0\nfit = false"),
])
def test_runs_on_features_with_no_fitted_part_are_judged_but_not_fitted(tmp_path, old, new):
    """The overhead is fitted to plain runs; FP8, ZeRO++ and offloaded runs, and a point marked
    fit = false, are predicted with the shipped fit and never move it."""
    (plain,) = load_points(write(tmp_path, PLAIN_RUN))
    (point,) = load_points(write(tmp_path, PLAIN_RUN.replace(old, new)))
    assert in_fit(plain) and not in_fit(point)
    (judged,) = judge([point]).judged
    assert judged.error is not None
    assert refit([point])["points"] == [] and [r["id"] for r in refit([plain])["points"]] == ["plain"]


def test_fit_is_true_or_false(tmp_path):
    with pytest.raises(PublishedError, match="fit = 'no'"):
        load_points(write(tmp_path, PLAIN_RUN.replace('value = 3000.0', 'value = 3000.0\nfit = "no"')))


def test_every_shipped_point_on_fp8_zeropp_or_offload_is_out_of_the_fit():
    points = load_points(POINTS_FILE)
    featured = [p for p in points if "scenario" in p and unfitted_feature(p["scenario"])]
    assert {unfitted_feature(p["scenario"]) for p in featured} >= {"precision fp8", "zero_quantized_weights",
                                                                   "offload_optimizer"}
    assert not any(in_fit(p) for p in featured)


def test_the_command_prints_the_verdict_as_json():
    done = subprocess.run([sys.executable, "-m", "sim2real.cli", "validate", "--published", "--json"],
                          capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    verdict = json.loads(done.stdout)
    assert set(verdict["summary"]) == {"time", "memory"}
    assert len(verdict["points"]) == len(load_points(POINTS_FILE))
    # the pre-registered sources, as first seen and now, each with the same four figures
    prereg = verdict["preregistered"]
    assert prereg["points"] == sum(s["first_seen"]["points"] for s in prereg["by_source"].values())
    assert prereg["sources"] == len(prereg["by_source"])
    for when in ("first_seen", "now"):
        assert {"median_abs_error", "coverage", "too_fast", "too_slow"} <= set(prereg[when])


def test_the_command_judges_a_points_file_of_ones_own(tmp_path):
    """--points takes measurements in the repository's format, so a team can hold the simulator
    against its own runs with the same judge."""
    path = write(tmp_path, AR_1G)
    done = subprocess.run([sys.executable, "-m", "sim2real.cli", "validate", "--published", "--json",
                           "--points", str(path)], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    (point,) = json.loads(done.stdout)["points"]
    assert point["id"] == "ar-1g" and point["error"] is not None


@pytest.mark.parametrize("args, fragment", [
    (["--published", "--points", "no/such/points.toml"], "cannot read published points"),
    (["--points", "points.toml"], "give --published too"),
])
def test_a_points_file_that_cannot_be_used_is_one_sentence_and_status_2(args, fragment):
    done = subprocess.run([sys.executable, "-m", "sim2real.cli", "validate", *args],
                          capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert done.returncode == 2
    assert fragment in done.stderr and "Traceback" not in done.stderr
