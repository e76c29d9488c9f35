"""One schema for every setting: what `simulate()` and the CLI accept, refuse, and never do.

The story of a value: it is read as its setting's type ("25" is 25, "no" is False), checked
against the setting's choices and bounds, and either reaches the simulation unchanged or is
refused with one sentence naming the flag.  A fuzz over every setting then holds the whole
promise: any input gives a result or one sentence, never another exception, never NaN or
infinity in the output, and never a value silently swapped for a default.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import zero_sim.scenario.pipeline as scenario
from zero_sim import ScenarioError, simulate
from zero_sim.scenario.settings import COMMON, MAX_GPUS, MAX_OP_INSTANCES
from zero_sim.settings import Setting, check_settings
from zero_sim.strategies import STRATEGIES, all_knobs
from zero_sim.system.topology import PRESETS as TOPOLOGIES

FUZZ_EXAMPLES = int(os.environ.get("ZERO_SIM_FUZZ_EXAMPLES", "300"))


# --- reading a value --------------------------------------------------------------------------

def test_text_that_spells_a_value_is_read_as_one():
    checked = check_settings(COMMON, {"gpus": "16", "bandwidth_gbps": "12.5", "explicit_ranks": "no"})
    assert checked == {"gpus": 16, "bandwidth_gbps": 12.5, "explicit_ranks": False}


def test_parameter_counts_are_written_as_people_write_them():
    for written in (7.5e9, "7.5e9", "7.5B", "7_500_000_000", 7_500_000_000):
        assert check_settings(COMMON, {"params": written}) == {"params": 7_500_000_000}


def test_a_whole_number_may_be_written_in_e_notation():
    checked = check_settings(COMMON, {"gpus": "1.6e1", "seq_len": "2e3", "micro_batch": 4e0})
    assert checked == {"gpus": 16, "seq_len": 2000, "micro_batch": 4}
    with pytest.raises(ScenarioError, match=r"^--gpus must be a whole number, got '1.5e0'$"):
        check_settings(COMMON, {"gpus": "1.5e0"})


def test_integer_flags_take_e_notation_and_their_bounds_still_hold(capsys):
    from zero_sim.cli import main

    assert main(["simulate", "--strategy", "zero3", "--max-live-params", "1e9", "--seq-len", "1.28e2",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["strategy"] == "zero3"
    assert main(["simulate", "--lora-rank", "1e9"]) == 2
    assert capsys.readouterr().err.strip() == "zero-sim: --lora-rank must be at most 4096, got 1000000000"
    assert main(["simulate", "--gpus", "1e6"]) == 2
    assert "size budget" in capsys.readouterr().err
    assert main(["simulate", "--gpus", "1.5e0"]) == 2
    assert capsys.readouterr().err.strip() == "zero-sim: --gpus must be a whole number, got '1.5e0'"


def test_the_plan_command_reads_integers_by_the_same_rule(capsys):
    from zero_sim.cli import build_parser, main

    args = build_parser().parse_args(["plan", "--seq-len", "1e3", "--top", "5e0", "--gpus", "8,1.6e1"])
    assert (args.seq_len, args.top) == (1000, 5)
    assert main(["plan", "--seq-len", "1.5e0"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--seq-len" in err and "whole number" in err and "\n" not in err


def test_none_means_not_given_and_keeps_the_default():
    r = simulate(gpus=None, micro_batch=None, seq_len=128)
    assert r.scenario.cluster.gpus == 8 and r.scenario.training.micro_batch == 8


# --- refusing a value -------------------------------------------------------------------------

@pytest.mark.parametrize("settings_, sentence", [
    ({"bandwidth_gbps": math.nan}, "--bandwidth-gbps must be a finite number, got nan"),
    ({"host_overhead_us": math.inf}, "--host-overhead-us must be a finite number, got inf"),
    ({"bandwidth_gbps": "nan"}, "--bandwidth-gbps must be a finite number"),
    ({"gpus": True}, "--gpus must be a whole number, got True"),
    ({"gpus": 2.5}, "--gpus must be a whole number, got 2.5"),
    ({"gpus": 0}, "--gpus must be a positive integer, got 0"),
    ({"efficiency": "0.5x"}, "--efficiency must be a number, got '0.5x'"),
    ({"efficiency": 1.5}, "--efficiency must be in (0, 1], got 1.5"),
    ({"straggler_prob": -0.1}, "--straggler-prob must be between 0 and 1"),
    ({"grad_accum": 10**12}, "--grad-accum must be at most 100,000"),
    ({"strategy": "zero2", "zero2_launch": "hok"}, "--zero2-launch must be one of hook, step for zero2"),
    ({"strategy": "zero2", "compiled_backward": 2}, "--compiled-backward must be true or false for zero2"),
    ({"strategy": "fsdp", "reshard_after_forward": "maybe"}, "--reshard-after-forward must be true or false"),
    ({"strategy": "zero3", "prefetch": 1.7}, "--prefetch must be a whole number for zero3, got 1.7"),
    ({"strategy": ["ddp"]}, "--strategy must be text"),
    ({"params": "lots"}, "--params must be a positive count such as 7.5e9"),
    ({"bucket_mb": 0}, "--bucket-mb must be a positive number for ddp, got 0"),
    ({"strategy": "zero1", "zero2_launch": "hook"}, "--zero2-launch applies to zero2, not to zero1"),
    ({"bukcet_mb": 25}, "unknown setting 'bukcet_mb'"),
])
def test_a_bad_value_is_one_sentence_naming_its_flag(settings_, sentence):
    with pytest.raises(ScenarioError) as refused:
        simulate(**settings_)
    message = str(refused.value)
    assert sentence in message and "\n" not in message


def test_the_cli_refuses_what_python_refuses_with_the_same_sentence(capsys):
    from zero_sim.cli import main

    assert main(["simulate", "--bandwidth-gbps", "nan", "--json"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == "zero-sim: --bandwidth-gbps must be a finite number, got nan"
    assert main(["simulate", "--params", "7.5B", "--gpus", "64", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["params"] > 7e9


# --- the size budget --------------------------------------------------------------------------

def test_a_simulation_beyond_the_size_budget_is_refused_until_allowed(monkeypatch):
    with pytest.raises(ScenarioError, match=f"beyond the size budget of {MAX_GPUS:,} ranks"):
        simulate(gpus=MAX_GPUS + 1)
    # Ten thousand micro-steps of a 14-layer model: the op count, not the clock, refuses it.
    with pytest.raises(ScenarioError, match=f"beyond the budget of {MAX_OP_INSTANCES:,}; lower --steps"):
        simulate(grad_accum=10_000, seq_len=64)
    # --allow-huge lifts the budget (shown on a budget made small, so the test stays quick).
    monkeypatch.setattr(scenario, "MAX_OP_INSTANCES", 1_000)
    with pytest.raises(ScenarioError, match="beyond the budget of 1,000"):
        simulate(grad_accum=4, seq_len=64)
    assert simulate(grad_accum=4, seq_len=64, allow_huge=True).metrics["step_time_s"] > 0


def test_an_absurd_rank_count_is_refused_at_once_with_no_memory_growth():
    # It used to plan collectives for 10^12 ranks, growing memory by the second.
    code = ("from zero_sim import simulate, ScenarioError\n"
            "try:\n    simulate(gpus=10**12)\nexcept ScenarioError as e:\n    print(e)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "--gpus must be at most 16,777,216" in done.stdout


# --- the fuzz: every setting, any value -------------------------------------------------------

# Valid values are drawn small enough that one simulation takes well under a second; the
# bounds themselves (and beyond) are drawn among the bad values.
CHEAP_MAX = {"gpus": 256, "grad_accum": 4, "steps": 3, "micro_batch": 16, "seq_len": 4096, "layers": 48,
             "hidden": 4096, "heads": 64, "kv_heads": 64, "ffn_hidden": 16384, "vocab": 100_000,
             "gpus_per_node": 16, "prefetch": 8}
NAMED_TEXT = {"model": ["gpt2-124m", "gpt2-350m", "llama2-7b", "bert-large", "no-such-model"],
              "topology": sorted(TOPOLOGIES)[:6] + ["calibrated", "no-such-topology"],
              "wrap": ["blocks", "none", "0,1,2", "99", "x,y"],
              "calibration": ["no/such/file.json"], "deepspeed_config": ["no/such/ds.json"],
              "fsdp_config": ["no/such/fsdp.yaml"], "torchtitan_config": ["no/such/job.toml"]}
NOT_A_VALUE = [math.nan, math.inf, -math.inf, -1, 0, True, False, "", "x", [1], {"a": 1}, 10**30, 1.5, -0.5]


def _cheap(setting: Setting):
    if setting.choices:
        return st.sampled_from(setting.choices)
    if setting.kind is bool:
        return st.sampled_from([True, False, "yes", "no", "true", "0"])
    if setting.name in NAMED_TEXT:
        return st.sampled_from(NAMED_TEXT[setting.name])
    if setting.name == "params":
        return st.sampled_from(["125M", "1.3b", 7.5e9, "70B", 350_000_000])
    lo = setting.ge if setting.ge is not None else (setting.gt or 0) + (1 if setting.kind is int else 1e-6)
    hi = setting.le if setting.le is not None else 1e6
    hi = min(hi, CHEAP_MAX.get(setting.name, hi))
    if setting.kind is int:
        return st.integers(int(lo), int(hi))
    return st.floats(lo, hi, allow_nan=False, allow_infinity=False)


def _edge(setting: Setting):
    """The bounds, one step beyond them, and values of the wrong kind."""
    edges = [v for v in (setting.le, setting.ge, setting.gt) if v is not None]
    if setting.le is not None:
        edges.append(setting.le * 2 + 1)
    return st.sampled_from(edges + NOT_A_VALUE)


def _value(setting: Setting):
    return st.one_of(_cheap(setting), _cheap(setting), _edge(setting))


ALL_SETTINGS = {s.name: s for s in COMMON} | {name: owners[0][1] for name, owners in all_knobs().items()}


@st.composite
def scenarios(draw):
    strategy = draw(st.sampled_from(list(STRATEGIES) + ["zero9"]))
    own = {k.name: k for k in STRATEGIES[strategy].knobs} if strategy in STRATEGIES else {}
    pool = [s for s in COMMON if s.name != "strategy"] + list(own.values())
    chosen = draw(st.lists(st.sampled_from(pool), max_size=6, unique_by=lambda s: s.name))
    values = {s.name: draw(_value(s)) for s in chosen}
    if draw(st.integers(0, 9)) == 0:  # now and then a knob of another strategy, or a misspelt name
        values[draw(st.sampled_from(sorted(ALL_SETTINGS) + ["bukcet_mb"]))] = 1
    values.setdefault("seq_len", draw(st.sampled_from([64, 256])))  # keep most runs quick
    return {"strategy": strategy} | values


# Settings the result reports as resolved values (a preset's name, the topology's GPU) rather
# than as given; every other accepted setting must be reported exactly as it was read.
REWRITTEN = {"model", "params", "topology", "gpu", "gpus_per_node", "cuda_context_gb", "overlap_slowdown",
             "gpu_spread", "allocator_reserve", "calibration", "attention", "deepspeed_config", "fsdp_config",
             "torchtitan_config"}


@settings(max_examples=FUZZ_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(scenarios())
def test_any_settings_give_a_result_or_one_sentence(kwargs):
    try:
        result = simulate(**kwargs)
    except ScenarioError as refused:
        message = str(refused)
        assert message and "\n" not in message and "Traceback" not in message
        return
    json.dumps(result.metrics, allow_nan=False)  # no NaN or infinity reaches the output
    json.dumps(result.to_chrome_trace(), allow_nan=False)
    strategy = STRATEGIES[kwargs["strategy"]]
    own = (*COMMON, *strategy.knobs)
    read = check_settings(own, {k: v for k, v in kwargs.items() if k not in REWRITTEN})
    simulated = result.scenario.to_dict()
    for name, value in read.items():
        if value is not None:
            assert simulated[name] == value, f"{name}={kwargs[name]!r} was not simulated as given"
