"""Sweeps and the planner's search, without a notebook: tables of scenarios, ranked candidates.

:mod:`zero_sim.plan.sweep` and :mod:`zero_sim.plan.planner` are plain functions over ``simulate()``
that return pandas frames; the widget library is needed only by the panels that show
them, so these tests also check that importing the two modules leaves it unloaded.
"""

from __future__ import annotations

import subprocess
import sys

import pandas as pd
import pytest

from zero_sim import ScenarioError, simulate
from zero_sim.plan.planner import FITS, NO_FIT, PLANNER_SKIPS, REFUSED, candidates, knobs_label, plan, tally
from zero_sim.plan.sweep import sweep
from zero_sim.strategies import STRATEGIES

PAIR = [{"topology": "pcie", "gpus": 2}, {"topology": "pcie", "gpus": 2, "bucket_mb": -1}]


def test_a_sweep_tabulates_results_and_refusals():
    df = sweep(PAIR, progress=False)
    assert len(df) == 2
    assert pd.isna(df.loc[0, "error"]) and df.loc[0, "step_ms"] > 0
    assert "bucket" in df.loc[1, "error"]


def test_a_sweep_reports_each_finished_scenario_to_a_callback():
    seen = []
    sweep(PAIR, progress=lambda done, total: seen.append((done, total)))
    assert seen == [(1, 2), (2, 2)]


def test_a_sweep_advances_a_bar_it_is_given():
    import io

    from tqdm import tqdm

    with tqdm(total=2, file=io.StringIO()) as bar:
        sweep(PAIR, progress=bar)
        assert bar.n == 2


def test_a_sweep_shows_its_own_tqdm_bar_when_asked(capsys):
    sweep(PAIR, progress=True, description="pair")
    assert "pair: 100%" in capsys.readouterr().err


def test_scenario_errors_are_one_sentence():
    with pytest.raises(ScenarioError) as exc:
        simulate(strategy="ddp", bucket_mb=0)
    assert "\n" not in str(exc.value)


def test_candidates_cover_every_strategy_and_vary_each_knob():
    names = {c["strategy"] for c in candidates(recompute=("none",))}
    assert names == set(STRATEGIES)
    zero2 = [c for c in candidates(["zero2"], recompute=("none",))]
    assert {"zero2_launch": "step", "strategy": "zero2", "recompute": "none"} in zero2
    assert not any(skipped in c for c in candidates() for skipped in PLANNER_SKIPS)


def test_a_plan_ranks_the_candidates_that_fit_first_fastest_first():
    df = plan(model="gpt2-124m", gpus=2, topology="pcie", micro_batch=1, strategies=["ddp", "zero2"],
              recompute=("none",), progress=False)
    assert list(df.index) == list(range(1, len(df) + 1)) and df.index.name == "rank"
    assert set(df["strategy"]) == {"ddp", "zero2"} and df["fits"].all()
    assert list(df["tokens_per_s"]) == sorted(df["tokens_per_s"], reverse=True)
    assert knobs_label({"strategy": "ddp", "recompute": "none"}) == "defaults"
    assert "defaults" in set(df["knobs"])


def test_a_plan_tells_what_cannot_run_here_from_what_does_not_fit_in_memory():
    # Hybrid sharding needs two nodes: on one node of 8 GPUs it cannot run, whatever the memory.
    df = plan(model="gpt2-124m", gpus=8, topology="dgx-a100", micro_batch=1, strategies=["fsdp"],
              recompute=("none",), progress=False)
    hybrid = df[df["knobs"] == "hybrid=True"]
    assert list(hybrid["outcome"]) == [REFUSED] and not hybrid["fits"].any()
    assert "two nodes" in hybrid["error"].iloc[0]
    fit = int((df["outcome"] == FITS).sum())
    assert fit == len(df) - 1 and not (df["outcome"] == NO_FIT).any()
    assert tally(df) == (f"{fit} fit, 0 do not fit in memory, 1 cannot run on this topology: "
                         f"{hybrid['error'].iloc[0]}")
    assert df.iloc[-1]["outcome"] == REFUSED  # ranked last, after every candidate that runs


def test_a_memory_miss_is_counted_as_one():
    df = plan(model="gpt2-1.5b", gpus=1, topology="dgx-a100", gpu="V100", micro_batch=8, strategies=["ddp"],
              recompute=("none",), progress=False)
    assert set(df["outcome"]) == {NO_FIT}
    assert tally(df) == f"0 fit, {len(df)} do not fit in memory"


def test_sweeps_and_plans_need_no_widget_library():
    script = "import sys, zero_sim.plan.planner, zero_sim.plan.sweep; print('ipywidgets' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-1] == "False"
