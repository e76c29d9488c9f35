"""Precision as trainers run it: AMP (fp32 weights under autocast), the dtype gradients travel in
for every strategy, and gradients accumulated in fp32.

A dtype is a property of a model state (zero_sim.strategies.precision), so each setting shows up
where that state's bytes go: on the wire, in ``memory.grads_bytes``, in the ops of the step.
"""

from __future__ import annotations

import json

import pytest

from zero_sim import ScenarioError, simulate
from zero_sim.cli import main
from zero_sim.configs.deepspeed import read_deepspeed
from zero_sim.strategies import STRATEGIES

SMALL = dict(model="gpt2-124m", seq_len=256, gpus=8, topology="dgx-h100", steps=2)
SHARDED = ("zero1", "zero2", "zero3")


def sent(**kw) -> float:
    return simulate(**SMALL, **kw).metrics["comm_volume_bytes"]


def memory(**kw) -> dict:
    return simulate(**SMALL, **kw).metrics["memory"]


# --- AMP: fp32 weights, autocast's casts, fp32 gradients on the wire ----------------------------

def test_ddp_under_amp_sends_twice_the_bytes_of_mixed_precision():
    # The gradients of fp32 weights are fp32, and DDP reduces them as they are.
    assert sent(strategy="ddp", precision="amp") == 2 * sent(strategy="ddp")


def test_amp_holds_fp32_weights_and_gradients_and_adams_moments_without_a_master_copy():
    r = simulate(**SMALL, strategy="ddp", precision="amp")
    m, psi = r.metrics["memory"], r.metrics["params"]
    assert (m["params_bytes"], m["grads_bytes"], m["optimizer_bytes"]) == (4 * psi, 4 * psi, 8 * psi)
    assert "no master copy" in r.metrics["precision"]


def test_amp_casts_each_blocks_weights_before_its_forward_on_the_compute_stream():
    r = simulate(**SMALL, strategy="ddp", precision="amp")
    ops = [op for op in r.step_ops() if op["rank"] == 0]
    casts = [op for op in ops if op["name"].startswith("amp_cast")]
    blocks = [op for op in ops if op["name"].startswith("fwd") and op["layer"] not in (0,)]
    assert casts and all(op["stream"] == "compute" for op in casts)
    # One cast kernel before every forward that runs a GEMM: the blocks and the head, not the embedding.
    assert {op["layer"] for op in casts} == {op["layer"] for op in blocks}
    for cast in casts:
        fwd = next(op for op in blocks if op["layer"] == cast["layer"])
        assert cast["end_s"] <= fwd["start_s"]
    # Mixed precision computes with the weights as held: no cast at all.
    mixed = simulate(**SMALL, strategy="ddp").step_ops()
    assert not any(op["name"].startswith("amp_cast") for op in mixed)


def test_autocast_has_nothing_to_cast_when_fsdp_gathers_bf16_weights():
    # Accelerate's FSDP policy gathers in bf16: autocast finds the weights already in its dtype.
    ops = simulate(**SMALL, strategy="fsdp", precision="amp", param_dtype="bf16").step_ops()
    assert not any(op["name"].startswith("amp_cast") for op in ops)
    ops = simulate(**SMALL, strategy="fsdp", precision="amp").step_ops()
    assert any(op["name"].startswith("amp_cast") for op in ops)


# --- --reduce-dtype: every strategy ------------------------------------------------------------

@pytest.mark.parametrize("strategy", ["ddp", *SHARDED, "fsdp"])
def test_reduce_dtype_fp32_is_accepted_by_every_strategy_and_sends_more(strategy):
    assert sent(strategy=strategy, reduce_dtype="fp32") > sent(strategy=strategy)
    # bf16 is what mixed precision's gradients travel in already: the same bytes.
    assert sent(strategy=strategy, reduce_dtype="bf16") == sent(strategy=strategy)


def test_reduce_dtype_doubles_exactly_the_bytes_of_ddps_all_reduces():
    assert sent(strategy="ddp", reduce_dtype="fp32") == 2 * sent(strategy="ddp")


def test_amp_reduced_in_bf16_sends_what_mixed_precision_sends():
    assert sent(strategy="ddp", precision="amp", reduce_dtype="bf16") == sent(strategy="ddp")


# --- --grad-accum-dtype: gradients held in fp32 -----------------------------------------------

def test_fp32_accumulation_adds_at_least_two_bytes_a_parameter_to_zero1s_gradients():
    psi = simulate(**SMALL, strategy="zero1").metrics["params"]
    bf16, fp32 = memory(strategy="zero1"), memory(strategy="zero1", grad_accum_dtype="fp32")
    assert fp32["grads_bytes"] - bf16["grads_bytes"] >= 2 * psi
    # DeepSpeed's BF16_Optimizer keeps the bf16 .grad beside the fp32 buffer: 4 + 2 bytes, said so.
    assert fp32["grads_bytes"] == pytest.approx(6 * psi, rel=1e-3)
    assert "keeps both" in simulate(**SMALL, strategy="zero1", grad_accum_dtype="fp32").metrics["precision"]


def test_where_gradients_are_sharded_fp32_accumulation_grows_them_by_the_share():
    n = SMALL["gpus"]
    psi = simulate(**SMALL, strategy="zero2").metrics["params"]
    bf16, fp32 = memory(strategy="zero2"), memory(strategy="zero2", grad_accum_dtype="fp32")
    assert fp32["grads_bytes"] - bf16["grads_bytes"] == pytest.approx(2 * psi / n, rel=1e-3)


def test_accumulated_in_fp32_gradients_travel_in_fp32_unless_told_otherwise():
    assert sent(strategy="zero1", grad_accum_dtype="fp32") > sent(strategy="zero1")
    assert sent(strategy="zero1", grad_accum_dtype="fp32", reduce_dtype="bf16") == sent(strategy="zero1")


def test_the_default_precision_says_nothing_and_changes_nothing():
    r = simulate(**SMALL, strategy="zero1")
    assert r.metrics["precision"] is None
    assert r.metrics == simulate(**SMALL, strategy="zero1", precision="mixed").metrics


def test_gradients_narrower_than_amps_fp32_weights_are_refused_in_one_sentence(capsys):
    with pytest.raises(ScenarioError, match="narrower than the fp32 weights"):
        simulate(**SMALL, precision="amp", grad_accum_dtype="bf16")
    assert main(["simulate", "--model", "gpt2-124m", "--precision", "amp", "--grad-accum-dtype", "bf16"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err


# --- Who sets them: stacks and configuration files ---------------------------------------------

def test_hf_trainer_runs_ddp_under_amp_but_leaves_deepspeeds_precision_to_deepspeed():
    assert simulate(**SMALL, strategy="ddp", stack="hf-trainer").scenario.to_dict()["precision"] == "amp"
    assert simulate(**SMALL, strategy="zero1", stack="hf-trainer").scenario.to_dict()["precision"] == "mixed"


def test_lightning_fsdp_gathers_fp32_and_reduces_bf16_as_its_bf16_mixed_policy():
    s = simulate(**SMALL, strategy="fsdp", stack="lightning").scenario.to_dict()
    assert (s["precision"], s["param_dtype"], s["reduce_dtype"]) == ("amp", "fp32", "bf16")


def test_lightnings_fsdp_policy_goes_with_its_precision_not_with_another_given():
    # A run given bf16 weights (Lightning's bf16-true) has no fp32 gathers of bf16-mixed's policy.
    s = simulate(**SMALL, strategy="fsdp", stack="lightning", precision="mixed").scenario.to_dict()
    assert (s["precision"], s["param_dtype"], s["reduce_dtype"]) == ("mixed", None, None)


def test_megatron_accumulates_in_fp32_for_every_strategy_without_a_bf16_copy():
    for strategy in ("ddp", "zero1"):
        r = simulate(**SMALL, strategy=strategy, stack="megatron")
        assert r.scenario.to_dict()["grad_accum_dtype"] == "fp32"
        # Megatron's hook adds each bf16 .grad into main_grad and drops it: 4 bytes, not 4 + 2.
        assert r.metrics["memory"]["grads_bytes"] == pytest.approx(4 * r.metrics["params"], rel=1e-3)
    # Its DDP reduces from main_grad itself: no second copy of the gradients as buckets.
    assert simulate(**SMALL, strategy="ddp", stack="megatron").scenario.to_dict()["gradient_as_bucket_view"]


def test_a_deepspeed_config_sets_the_reduce_and_accumulation_dtypes():
    config = {"zero_optimization": {"stage": 1}, "bf16": {"enabled": True},
              "communication_data_type": "fp32", "data_types": {"grad_accum_dtype": "fp32"}}
    s = simulate(**SMALL, deepspeed_config=config).scenario.to_dict()
    assert (s["precision"], s["reduce_dtype"], s["grad_accum_dtype"]) == ("mixed", "fp32", "fp32")


def test_a_deepspeed_config_with_torch_autocast_and_no_half_weights_is_amp():
    reading = read_deepspeed({"zero_optimization": {"stage": 2}, "torch_autocast": {"enabled": True}})
    assert reading.settings["precision"] == "amp"
    reading = read_deepspeed({"zero_optimization": {"stage": 2}})
    assert reading.settings["precision"] == "fp32"


def test_reduce_dtype_is_a_setting_of_every_strategy_not_a_knob_of_one():
    assert not any(k.name == "reduce_dtype" for s in STRATEGIES.values() for k in s.knobs)


def test_plan_searches_under_the_dtypes_given_as_simulate_takes_them(capsys):
    # plan's flags are simulate's: the two dtypes travel to every candidate it simulates.
    assert main(["plan", "--model", "gpt2-124m", "--gpus", "8", "--topology", "dgx-h100", "--strategies",
                 "ddp", "--precision", "amp", "--reduce-dtype", "bf16", "--json"]) == 0
    fastest = json.loads(capsys.readouterr().out)["summary"]["fastest"]
    assert (fastest["precision"], fastest["reduce_dtype"]) == ("amp", "bf16")
