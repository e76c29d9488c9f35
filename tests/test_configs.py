"""From your DeepSpeed config: a file users already have, read as the simulator's settings.

Each key is either turned into a setting (with DeepSpeed's units and defaults), noted as
ignored with the reason, or refused with one sentence when the simulator would otherwise
simulate something else than the file describes.
"""

from __future__ import annotations

import json
import os
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zero_sim import ScenarioError, simulate
from zero_sim.cli import main

FUZZ_EXAMPLES = int(os.environ.get("ZERO_SIM_FUZZ_EXAMPLES", "300"))

STAGE3 = {
    "train_batch_size": 64,
    "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": 2,
    "bf16": {"enabled": True},
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-4}},
    "zero_optimization": {"stage": 3, "contiguous_gradients": True, "stage3_prefetch_bucket_size": 2e7,
                          "stage3_max_live_parameters": 3e8, "reduce_bucket_size": 1e8},
    "gradient_clipping": 1.0,
    "steps_per_print": 10,
}
SMALL = {"model": "gpt2-124m", "seq_len": 256}


def test_a_stage_3_config_sets_the_strategy_batch_and_sizes_in_deepspeeds_units():
    r = simulate(deepspeed_config=STAGE3, **SMALL)
    s = r.scenario.to_dict()
    assert (s["strategy"], s["micro_batch"], s["grad_accum"], s["precision"]) == ("zero3", 4, 2, "mixed")
    assert (s["prefetch_bucket_size"], s["max_live_params"], s["reduce_bucket_size"]) == (
        20_000_000, 300_000_000, 100_000_000)
    assert s["overlap_comm"] is True  # DeepSpeed's default for stage 3


def test_every_key_is_read_or_noted_as_ignored_with_its_reason():
    notes = simulate(deepspeed_config=STAGE3, **SMALL).notes
    assert "read: zero_optimization.stage = 3 as --strategy zero3" in notes
    assert any(n.startswith("ignored: gradient_clipping: ") for n in notes)
    assert any(n.startswith("ignored: zero_optimization.contiguous_gradients: ") for n in notes)
    assert any(n.startswith("ignored: optimizer.params: ") for n in notes)


def test_stage_2_buckets_are_elements_turned_into_mib_at_the_gradients_width():
    config = {"bf16": {"enabled": True}, "zero_optimization": {"stage": 2, "reduce_bucket_size": 5e8}}
    s = simulate(deepspeed_config=config, **SMALL).scenario.to_dict()
    assert s["strategy"] == "zero2" and s["bucket_mb"] == pytest.approx(5e8 * 2 / 2**20)
    assert s["overlap_comm"] is False  # DeepSpeed's default for stages 1 and 2
    fp32 = simulate(deepspeed_config={"zero_optimization": {"stage": 2, "reduce_bucket_size": 5e8}}, **SMALL)
    assert fp32.scenario.training.precision == "fp32"
    assert fp32.scenario.knobs.bucket_mb == pytest.approx(5e8 * 4 / 2**20)


def test_reductions_on_the_compute_stream_stop_overlapping_backward():
    # overlap_comm off: DeepSpeed reduces on the compute stream, so backward waits for each bucket.
    base = {"bf16": {"enabled": True}, "zero_optimization": {"stage": 2, "reduce_bucket_size": 2e7}}
    overlapped = base | {"zero_optimization": base["zero_optimization"] | {"overlap_comm": True}}
    on = simulate(deepspeed_config=overlapped, topology="pcie", **SMALL).metrics
    off = simulate(deepspeed_config=base, topology="pcie", **SMALL).metrics
    assert off["comm_overlap_fraction"] < 0.05 < on["comm_overlap_fraction"]
    assert off["step_time_s"] > on["step_time_s"]


def test_a_flag_given_beside_the_file_wins_and_the_note_says_so():
    r = simulate(deepspeed_config=STAGE3, micro_batch=2, gpus=16, **SMALL)
    assert r.scenario.training.micro_batch == 2
    assert "overridden: --micro-batch 2 replaces 4 from the DeepSpeed configuration" in r.notes


@pytest.mark.parametrize("config, sentence", [
    ({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme"}}}, "only in stage 3"),
    ({"zero_optimization": {"stage": 3, "zero_quantized_nontrainable_weights": True}},
     "ZeRO++ frozen weights stored in int8"),
    ({"zero_optimization": {"stage": 0}}, "stage 0 in the DeepSpeed configuration is not simulated"),
    ({"zero_optimization": {"stage": 2, "reduce_bucket_size": "auto"}}, "is 'auto'"),
    ({"zero_optimization": {"stage": 2, "reduce_bukcet_size": 1}}, "reduce_bukcet_size"),
    ({"zero_optimization": {"stage": 2, "reduce_scatter": False}}, "all-reduces stage 2's gradients"),
    ({"zero_optimization": {"stage": 1}, "optimizer": {"type": "SGD"}}, "not an Adam-family optimizer"),
    ({"zero_optimization": {"stage": 1}, "train_micro_batch_size_per_gpu": 0},
     "--micro-batch must be a positive integer, got 0 (--micro-batch was read from "
     "train_micro_batch_size_per_gpu"),
    ({"zero_optimization": {"stage": 1}, "train_batch_size": 100},
     "is not micro-batch 8 x gradient accumulation"),
    ({"zero_optimization": {"stage": 1}, "bf16": {"enabled": True}, "communication_data_type": "int3"},
     "is not a dtype DeepSpeed accepts"),
    ([1, 2], "must be a path or a dict"),
])
def test_what_cannot_be_simulated_as_written_is_refused_with_one_sentence(config, sentence):
    with pytest.raises(ScenarioError) as refused:
        simulate(deepspeed_config=config, **SMALL)
    assert sentence in str(refused.value) and "\n" not in str(refused.value)


def test_the_command_line_reads_the_file_and_refuses_a_broken_one(tmp_path, capsys):
    good = tmp_path / "ds.json"
    good.write_text(json.dumps(STAGE3))
    assert main(["simulate", "--deepspeed-config", str(good), "--model", "gpt2-124m", "--seq-len", "256",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["strategy"] == "zero3"
    broken = tmp_path / "broken.json"
    broken.write_text('{"zero_optimization": {"stage": 3,}}')
    assert main(["simulate", "--deepspeed-config", str(broken)]) == 2
    err = capsys.readouterr().err.strip()
    assert "is not valid JSON" in err and "\n" not in err


SECTIONS = st.dictionaries(st.sampled_from(["enabled", "device", "type"]),
                           st.booleans() | st.text(max_size=4),
                           max_size=2)
JSON_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-5, 10**10), st.floats(allow_nan=True),
                        st.sampled_from(["auto", "cpu", "none", "x", "bf16", "fp32"]),
                        st.lists(st.integers(), max_size=2), SECTIONS)
KEYS = [*STAGE3, "fp16", "communication_data_type", "wandb", "unknown_key"]
ZERO_KEYS = [*STAGE3["zero_optimization"], "stage", "overlap_comm", "reduce_scatter", "offload_param",
             "offload_optimizer", "allgather_bucket_size", "stage3_max_reuse_distance", "sub_group_size",
             "zero_hpz_partition_size"]


@st.composite
def mutated_configs(draw):
    config = json.loads(json.dumps(STAGE3))
    for _ in range(draw(st.integers(1, 3))):
        if draw(st.booleans()):
            config[draw(st.sampled_from(KEYS))] = draw(JSON_VALUES)
        elif isinstance(config.get("zero_optimization"), dict):
            config["zero_optimization"][draw(st.sampled_from(ZERO_KEYS))] = draw(JSON_VALUES)
    return config


@settings(max_examples=FUZZ_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(mutated_configs(), st.sampled_from([None, 8, 16]))
def test_any_deepspeed_config_gives_a_result_or_one_sentence(config, gpus):
    try:
        result = simulate(deepspeed_config=config, gpus=gpus, **SMALL)
    except ScenarioError as refused:
        assert str(refused) and "\n" not in str(refused)
        return
    json.dumps(result.metrics, allow_nan=False)


# --- FSDP2's fully_shard arguments and torchtitan's job file -----------------------------------

HSDP = {"mesh": {"replicate": 2, "shard": 8}, "reshard_after_forward": True,
        "mp_policy": {"param_dtype": "bfloat16", "reduce_dtype": "float32", "output_dtype": "bfloat16"}}


def test_an_fsdp2_mesh_with_replicas_is_hsdp_sharded_within_each_node():
    r = simulate(fsdp_config=HSDP, topology="dgx-h100", **SMALL)
    s = r.scenario.to_dict()
    assert (s["strategy"], s["gpus"], s["gpus_per_node"], s["hybrid"]) == ("fsdp", 16, 8, True)
    assert (s["param_dtype"], s["reduce_dtype"], s["precision"]) == ("bf16", "fp32", "mixed")
    assert s["copies"] == "fsdp2"  # fully_shard copies each gather out and each gradient in
    assert any(n.startswith("ignored: mp_policy.output_dtype: ") for n in r.notes)


def test_an_fsdp2_file_may_be_yaml(tmp_path):
    path = tmp_path / "fsdp.yaml"
    path.write_text("mesh:\n  shard: 4\nreshard_after_forward: false\n"
                    "mp_policy:\n  param_dtype: torch.bfloat16\n")
    s = simulate(fsdp_config=path, **SMALL).scenario.to_dict()
    assert (s["gpus"], s["reshard_after_forward"], s["param_dtype"]) == (4, False, "bf16")


@pytest.mark.parametrize("config, sentence", [
    ({"mesh": {"shard": 8}, "reshard_after_forward": 2}, "reshards to a group of 2 ranks after forward"),
    ({"mesh": {"shard": 8}, "offload_policy": "DiskOffloadPolicy"}, "is not FSDP2's CPUOffloadPolicy"),
    ({"mesh": {"shard": 0}}, "mesh.shard in the FSDP configuration should be greater than 0"),
    ({"reshard_after_forwrd": True}, "reshard_after_forwrd in the FSDP configuration"),
    ({"mp_policy": {"param_dtype": "float8"}}, "is not a dtype the simulator knows"),
])
def test_an_fsdp2_argument_that_cannot_be_simulated_is_refused(config, sentence):
    with pytest.raises(ScenarioError, match=sentence):
        simulate(fsdp_config=config, **SMALL)


TITAN = """
[job]
dump_folder = "./outputs"
[model]
name = "llama3"
flavor = "8B"
[training]
local_batch_size = 1
seq_len = 8192
mixed_precision_param = "bfloat16"
mixed_precision_reduce = "float32"
[parallelism]
data_parallel_replicate_degree = 1
data_parallel_shard_degree = -1
fsdp_reshard_after_forward = "default"
tensor_parallel_degree = 1
[activation_checkpoint]
mode = "selective"
selective_ac_option = "op"
[compile]
enable = true
"""


def test_a_torchtitan_job_file_is_llama3_8b_with_fsdp_over_every_rank(tmp_path):
    path = tmp_path / "llama3_8b.toml"
    path.write_text(TITAN)
    r = simulate(torchtitan_config=path, gpus=8, topology="dgx-h100")
    s = r.scenario.to_dict()
    assert (s["strategy"], s["micro_batch"], s["seq_len"], s["recompute"]) == ("fsdp", 1, 8192, "op")
    assert s["params"] > 7e9 and s["gpus"] == 8 and s["reshard_after_forward"] is True
    assert s["copies"] == "fsdp2"  # torchtitan shards with fully_shard: per-parameter copies
    assert "ignored: [job]: changes no step's time or memory" in r.notes
    assert r.metrics["memory"]["fits"]


def test_torchtitan_replicas_with_the_shard_degree_left_open_take_the_rest(tmp_path):
    path = tmp_path / "hsdp.toml"
    path.write_text(TITAN.replace("data_parallel_replicate_degree = 1", "data_parallel_replicate_degree = 2"))
    s = simulate(torchtitan_config=path, gpus=16, topology="dgx-h100", seq_len=1024).scenario.to_dict()
    assert (s["hybrid"], s["gpus_per_node"]) == (True, 8)
    with pytest.raises(ScenarioError, match="15 ranks do not split into data_parallel_replicate_degree 2"):
        simulate(torchtitan_config=path, gpus=15, topology="dgx-h100", seq_len=1024)


@pytest.mark.parametrize("change, sentence", [
    (("tensor_parallel_degree = 1", "tensor_parallel_degree = 2"), "models data parallelism only"),
    (('selective_ac_option = "op"', 'selective_ac_option = "2"'), "checkpoints every n-th block"),
    (('flavor = "8B"', 'flavor = "405B"'), "has no preset here"),
    (("seq_len = 8192", "seq_len = 8192\nseq_len = 1"), "is not valid TOML"),
])
def test_a_torchtitan_setting_that_cannot_be_simulated_is_refused(tmp_path, change, sentence):
    path = tmp_path / "job.toml"
    path.write_text(TITAN.replace(*change))
    with pytest.raises(ScenarioError, match=sentence):
        simulate(torchtitan_config=path, gpus=8)


def test_one_configuration_file_at_a_time():
    with pytest.raises(ScenarioError, match="--deepspeed-config and --fsdp-config each describe the whole"):
        simulate(deepspeed_config=STAGE3, fsdp_config=HSDP)


TITAN_DICT = {"model": {"name": "llama3", "flavor": "8B"},
              "training": {"local_batch_size": 1, "seq_len": 1024},
              "parallelism": {"data_parallel_replicate_degree": 1, "data_parallel_shard_degree": -1},
              "activation_checkpoint": {"mode": "full"}}
NESTED = {"fsdp_config": (HSDP, ["mesh", "reshard_after_forward", "mp_policy", "wrap", "offload_policy",
                                 "backward_prefetch"], ["shard", "replicate", "param_dtype", "reduce_dtype"]),
          "torchtitan_config": (TITAN_DICT, ["model", "training", "parallelism", "activation_checkpoint",
                                             "float8", "compile"],
                                ["name", "flavor", "local_batch_size", "seq_len", "mode",
                                 "selective_ac_option",
                                 "data_parallel_shard_degree", "data_parallel_replicate_degree",
                                 "fsdp_reshard_after_forward", "mixed_precision_param", "enabled"])}


@settings(max_examples=FUZZ_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.sampled_from(sorted(NESTED)), st.data())
def test_any_fsdp_or_torchtitan_config_gives_a_result_or_one_sentence(reader, data):
    base, top, inner = NESTED[reader]
    config = json.loads(json.dumps(base))
    for _ in range(data.draw(st.integers(1, 3))):
        key = data.draw(st.sampled_from(top))
        if isinstance(config.get(key), dict) and data.draw(st.booleans()):
            config[key][data.draw(st.sampled_from(inner))] = data.draw(JSON_VALUES)
        else:
            config[key] = data.draw(JSON_VALUES)
    try:
        result = simulate(**{reader: config}, gpus=data.draw(st.sampled_from([None, 8, 16])), seq_len=256)
    except ScenarioError as refused:
        assert str(refused) and "\n" not in str(refused)
        return
    json.dumps(result.metrics, allow_nan=False)


@pytest.mark.parametrize("config, sentence", [
    ({"zero_optimisation": {"stage": 3}},
     "zero_optimisation in the DeepSpeed configuration is not a key this reader knows; did you mean "
     "zero_optimization?"),
    ({"zero_optimization": {"stgae": 3}}, "did you mean zero_optimization.stage?"),
])
def test_a_misspelt_deepspeed_key_is_named_not_defaulted(config, sentence):
    with pytest.raises(ScenarioError, match=re.escape(sentence)):
        simulate(deepspeed_config=config)


def test_a_misspelt_torchtitan_section_is_named(tmp_path):
    path = tmp_path / "job.toml"
    path.write_text('[modle]\nname = "llama3"\n')
    sentence = re.escape("[modle] in") + ".*did you mean " + re.escape("[model]?")
    with pytest.raises(ScenarioError, match=sentence):
        simulate(torchtitan_config=path)


# --- every key of every reader on a read or ignored line ---------------------------------------

TITAN_FULL = """
[job]
dump_folder = "./outputs"
description = "Llama 3 8B training"
[profiling]
enable_profiling = true
profile_freq = 100
[metrics]
log_freq = 10
enable_tensorboard = true
[model]
name = "llama3"
flavor = "8B"
hf_assets_path = "./assets/hf/Llama-3.1-8B"
converters = ["float8"]
[optimizer]
name = "AdamW"
lr = 3e-4
eps = 1e-8
[lr_scheduler]
warmup_steps = 200
[training]
local_batch_size = 1
seq_len = 8192
max_norm = 1.0
steps = 1000
dataset = "c4"
compile = true
[parallelism]
data_parallel_replicate_degree = 1
data_parallel_shard_degree = -1
tensor_parallel_degree = 1
pipeline_parallel_degree = 1
context_parallel_degree = 1
fsdp_reshard_after_forward = "default"
[checkpoint]
enable_checkpoint = false
interval = 500
[activation_checkpoint]
mode = "selective"
selective_ac_option = "op"
[float8]
enable_fsdp_float8_all_gather = true
precompute_float8_dynamic_scale_for_fsdp = true
filter_fqns = ["output"]
"""
DEEPSPEED_FULL = STAGE3 | {
    "wall_clock_breakdown": False,
    "zero_optimization": STAGE3["zero_optimization"] | {
        "overlap_comm": True, "reduce_scatter": True, "stage3_max_reuse_distance": 1e9,
        "stage3_param_persistence_threshold": 1e5, "stage3_gather_16bit_weights_on_model_save": True,
        "offload_optimizer": {"device": "cpu", "pin_memory": True},
        "offload_param": {"device": "none"}}}
FSDP_FULL = HSDP | {"offload_policy": {"type": "CPUOffloadPolicy", "pin_memory": True}, "wrap": "blocks",
                    "backward_prefetch": "pre"}
PEFT_FULL = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": 16, "lora_alpha": 32, "lora_dropout": 0.05,
             "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"], "bias": "none",
             "base_model_name_or_path": "meta-llama/Meta-Llama-3-8B", "inference_mode": False,
             "modules_to_save": None, "use_dora": False}
CATCH_ALL = "not read by this reader"


def leaf_keys(data: dict, toml: bool, path: tuple = ()):
    """Each leaf key of a configuration as its reader names it, with the tables that hold it."""
    for key, value in data.items():
        here = (*path, key)
        if isinstance(value, dict) and value:
            yield from leaf_keys(value, toml, here)
        elif toml:
            tables = [f"[{'.'.join(here[:i])}]" for i in range(1, len(here))]
            yield f"[{'.'.join(here[:-1])}] {here[-1]}", tables
        else:
            yield ".".join(here), [".".join(here[:i]) for i in range(1, len(here))]


@pytest.mark.parametrize("reader, sample", [
    ("torchtitan_config", TITAN_FULL), ("torchtitan_config", TITAN), ("deepspeed_config", DEEPSPEED_FULL),
    ("deepspeed_config", STAGE3), ("fsdp_config", FSDP_FULL), ("fsdp_config", HSDP),
    ("peft_config", PEFT_FULL)])
def test_every_key_of_every_reader_lands_on_a_read_or_ignored_line(reader, sample):
    import tomllib

    from zero_sim.configs.peft import read_peft
    from zero_sim.configs.read import READERS

    data = tomllib.loads(sample) if isinstance(sample, str) else sample
    reading = (READERS | {"peft_config": read_peft})[reader](data)
    for leaf, tables in leaf_keys(data, toml=reader == "torchtitan_config"):
        assert {leaf, *tables} & reading.accounted, f"{leaf} is on no read or ignored line"
    # A key these files hold is read, or ignored with its own reason; none is left to the catch-all.
    assert not [note for note in reading.notes if CATCH_ALL in note]


def test_a_key_no_reader_knows_is_still_named_on_an_ignored_line():
    from zero_sim.configs.torchtitan import read_torchtitan

    notes = read_torchtitan({"training": {"seq_len": 1024, "flux_capacitor": 3}}).notes
    assert f"ignored: [training] flux_capacitor: {CATCH_ALL}" in notes


def test_torchtitans_compile_switch_in_training_compiles_and_its_other_keys_are_accounted(tmp_path):
    path = tmp_path / "llama3_8b.toml"
    path.write_text(TITAN_FULL)
    r = simulate(torchtitan_config=path, gpus=8, topology="dgx-h100")
    assert r.scenario.workload.elementwise == "fused"  # compiled: Inductor fuses the chains
    lines = "\n".join(r.notes)
    for key in ("[training] compile", "[training] max_norm", "[training] steps", "[training] dataset",
                "[float8] filter_fqns"):
        assert re.search(rf"^(read|ignored): {re.escape(key)}\b", lines, re.M), key
    assert "overridden: elementwise=fused (stack torchtitan has eager)" in r.metrics["stack_notes"]


FLOAT8_TITAN = """
[model]
name = "llama3"
flavor = "8B"
converters = ["float8"]
[training]
local_batch_size = 1
seq_len = 1024
[float8]
enable_fsdp_float8_all_gather = true
precompute_float8_dynamic_scale_for_fsdp = true
filter_fqns = ["output"]
"""


@pytest.mark.parametrize("given, flag, key", [
    ({"offload_params": "cpu"}, "--fp8-all-gather", "[float8] enable_fsdp_float8_all_gather"),
    ({"topology": "dgx-a100"}, "--precision", "[model] converters"),
])
def test_a_refusal_of_a_setting_the_file_set_names_the_file_and_key(tmp_path, given, flag, key):
    path = tmp_path / "float8.toml"
    path.write_text(FLOAT8_TITAN)
    with pytest.raises(ScenarioError) as refused:
        simulate(torchtitan_config=path, **({"gpus": 8, "topology": "dgx-h100"} | given))
    message = str(refused.value)
    assert flag in message and f"{flag} was read from {key}" in message and str(path) in message
    assert "\n" not in message


def test_a_flag_the_user_typed_is_not_blamed_on_the_file(tmp_path):
    path = tmp_path / "float8.toml"
    path.write_text(FLOAT8_TITAN)
    with pytest.raises(ScenarioError) as refused:
        simulate(torchtitan_config=path, gpus=8, topology="dgx-h100", precision="mixed")
    assert "--precision was read from" not in str(refused.value)
    assert "--fp8-all-gather was read from [float8] enable_fsdp_float8_all_gather" in str(refused.value)
