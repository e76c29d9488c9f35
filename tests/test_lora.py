"""Fine-tuning with LoRA: every weight frozen, small adapters train, and only they are reduced and updated."""

import json

import pytest

from zero_sim import simulate
from zero_sim.cli import main
from zero_sim.scenario import ScenarioError
from zero_sim.system.lora import with_lora
from zero_sim.system.model_presets import preset
from zero_sim.system.workload import WorkloadError

LLAMA = dict(model="llama2-7b", gpus=8, topology="dgx-a100", micro_batch=1)


def run(strategy: str, **extra) -> dict:
    return simulate(strategy=strategy, **LLAMA, **extra).metrics


def test_rank_16_adapters_on_q_and_v_train_what_peft_counts():
    # peft on Llama-2-7B, r=16 on q_proj and v_proj: 32 blocks x 2 projections x 16 x (4096 + 4096).
    adapted = with_lora(preset("llama2-7b", 1), 16)
    assert adapted.trainable_params == 32 * 2 * 16 * (4096 + 4096) == 8_388_608
    assert adapted.params == preset("llama2-7b", 1).params + adapted.trainable_params
    assert all(not t.trainable for layer in adapted.layers for t in layer.tensors if "lora" not in t.name)


def test_only_the_adapters_keep_gradients_and_optimizer_state():
    full, tuned = run("ddp"), run("ddp", lora_rank=16)
    weights = 2 * preset("llama2-7b", 1).params  # bf16, still held whole by DDP
    assert full["memory"]["fits"] is False and tuned["memory"]["fits"] is True
    # Frozen weights: 2 bytes each; adapters: weights, gradients and Adam's 12 bytes each.
    expected = weights + (2 + 2 + 12) * tuned["trainable_params"]
    assert tuned["memory"]["model_states_bytes"] == pytest.approx(expected, rel=1e-6)


def test_ddp_all_reduces_the_adapters_gradients_alone():
    tuned = run("ddp", lora_rank=16)
    ring = 2 * (8 - 1) / 8  # bytes a rank sends per byte all-reduced
    assert tuned["comm_volume_bytes"] == pytest.approx(ring * 2 * tuned["trainable_params"], rel=0.02)


def test_sharded_strategies_still_gather_every_frozen_weight():
    full, tuned = run("zero3"), run("zero3", lora_rank=16)
    gathered = [m["comm_volume_bytes"] for m in (full, tuned)]
    # ZeRO-3 gathers all weights forward and backward either way; only the reduce-scatter shrinks.
    assert 0.55 * gathered[0] < gathered[1] < 0.75 * gathered[0]
    shard = 2 * preset("llama2-7b", 1).params / 8
    assert tuned["memory"]["model_states_bytes"] == pytest.approx(shard, rel=0.02)


def test_fsdp1_units_mixing_frozen_and_trainable_weights_keep_whole_gradients_fsdp2_does_not():
    fsdp1, fsdp2 = run("fsdp", lora_rank=16, copies="fsdp1"), run("fsdp", lora_rank=16, copies="fsdp2")
    states1, states2 = (m["memory"]["model_states_bytes"] for m in (fsdp1, fsdp2))
    # FSDP1: each block's flat gradient is as large as its weights (zeros where frozen).
    assert states1 == pytest.approx(2 * states2, rel=0.05)
    assert fsdp1["comm_volume_bytes"] > fsdp2["comm_volume_bytes"]


def test_frozen_weights_take_no_weight_gradient_so_their_backward_gemms_cost_their_forward():
    from zero_sim.system.gpus import GPUS
    from zero_sim.system.hardware import ComputeModel

    block = next(layer for layer in preset("llama2-7b", 1).layers if layer.kind == "block")
    frozen = next(layer for layer in with_lora(preset("llama2-7b", 1), 16).layers if layer.kind == "block")
    model = ComputeModel(GPUS["A100-80GB"])
    # Trainable: input and weight gradients, twice the forward; frozen: the input's alone.
    assert model.gemm_seconds("block", "bwd", block.work) == pytest.approx(
        2 * model.gemm_seconds("block", "fwd", block.work))
    base = frozen.work.frozen_matmul_flops
    adapters = frozen.work.matmul_flops - base
    tokens = 4096  # one sequence of Llama-2's 4,096
    assert adapters == pytest.approx(2 * (2 * tokens * 16 * (4096 + 4096)))  # q and v: x.A, then .B
    assert frozen.bwd_flops == pytest.approx(2 * frozen.fwd_flops - base)
    # The whole step: backward falls from over twice the forward to about one and a half (attention's
    # backward and the element-wise kernels are unchanged).
    ratio = [m["phases"]["backward_s"] / m["phases"]["forward_s"]
             for m in (run("ddp"), run("ddp", lora_rank=16))]
    assert ratio[0] > 2.0 > 1.7 > ratio[1] > 1.2


def test_the_summary_says_what_trains():
    tuned = run("fsdp", lora_rank=8, lora_targets="all-linear")
    assert tuned["lora"] == "r=8 on all-linear"
    assert tuned["trainable_params"] == 32 * 8 * (4 * (4096 + 4096) + 3 * (4096 + 11008))


@pytest.mark.parametrize("extra, sentence", [
    (dict(lora_rank=16, lora_targets="c_proj"), "LoRA target 'c_proj' is not a projection"),
    (dict(lora_targets="q,v"), "no --lora-rank says their size"),
    (dict(lora_rank=16, lora_targets=" , "), "--lora-targets names no projection"),
])
def test_targets_the_model_does_not_have_are_one_sentence(extra, sentence):
    with pytest.raises(ScenarioError, match=sentence):
        run("ddp", **extra)


def test_the_command_line_takes_peft_names_and_reports_them(capsys):
    assert main(["simulate", "--model", "llama2-7b", "--gpus", "8", "--strategy", "ddp", "--micro-batch", "1",
                 "--lora-rank", "16", "--lora-targets", "q_proj,v_proj", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["trainable_params"] == 8_388_608
    assert main(["simulate", "--model", "llama2-7b", "--lora-rank", "16", "--lora-targets", "mlp"]) == 2
    assert "it has q, k, v, o, gate, up, down" in capsys.readouterr().err


def test_a_model_read_off_a_module_has_no_projections_to_target():
    workload = preset("gpt2-124m", 1)
    from dataclasses import replace

    with pytest.raises(WorkloadError, match="read off a module"):
        with_lora(replace(workload, shape=None), 8)


ADAPTER = {"peft_type": "LORA", "r": 16, "lora_alpha": 32, "lora_dropout": 0.05, "bias": "none",
           "target_modules": ["q_proj", "v_proj"], "task_type": "CAUSAL_LM"}


def test_a_peft_adapter_config_sets_the_rank_and_targets_beside_a_run_configuration(tmp_path):
    adapter, deepspeed = tmp_path / "adapter_config.json", tmp_path / "ds.json"
    adapter.write_text(json.dumps(ADAPTER))
    deepspeed.write_text(json.dumps({"zero_optimization": {"stage": 3}, "bf16": {"enabled": True},
                                     "train_micro_batch_size_per_gpu": 1}))
    sim = simulate(model="llama2-7b", gpus=8, peft_config=str(adapter), deepspeed_config=str(deepspeed))
    assert sim.metrics["trainable_params"] == 8_388_608 and sim.metrics["strategy"] == "zero3"
    notes = sim.metrics["config_notes"]
    assert "read: r as --lora-rank 16" in notes and any(n.startswith("ignored: lora_alpha") for n in notes)
    # A flag given beside the file wins, and the notes say so.
    wider = simulate(model="llama2-7b", gpus=8, micro_batch=1, peft_config=str(adapter), lora_rank=64)
    assert wider.metrics["trainable_params"] == 4 * 8_388_608


@pytest.mark.parametrize("change, sentence", [
    ({"bias": "all"}, "trainable biases are not modelled"),
    ({"modules_to_save": ["lm_head"]}, "trains whole modules"),
    ({"target_modules": ".*(q|v)_proj"}, "is a regular expression"),
    ({"peft_type": "IA3"}, "only LORA adapters are modelled"),
    ({"r": 0}, "r in"),
])
def test_what_a_peft_config_would_train_that_is_not_modelled_is_refused(tmp_path, change, sentence):
    adapter = tmp_path / "adapter_config.json"
    adapter.write_text(json.dumps(ADAPTER | change))
    with pytest.raises(ScenarioError, match=sentence):
        simulate(model="llama2-7b", gpus=8, micro_batch=1, peft_config=str(adapter))


def test_the_planner_searches_a_fine_tune(capsys):
    # Full fine-tuning of Llama-2-7B under DDP cannot fit on 8 x A100-80GB; its LoRA fine-tune can.
    args = ["plan", "--model", "llama2-7b", "--gpus", "8", "--topology", "dgx-a100", "--strategies", "ddp",
            "--micro-batch", "1", "--recompute", "none", "--top", "1"]
    assert main(args) == 0
    assert "fastest that fits" not in capsys.readouterr().out
    assert main([*args, "--lora-rank", "16"]) == 0
    out = capsys.readouterr().out
    assert "LoRA r=16" in out.splitlines()[0] and "fastest that fits: ddp" in out


def test_frozen_projections_without_adapters_save_no_input_for_a_weight_gradient():
    # Llama-2-7B, one sequence of 4,096 tokens: with adapters on q and v only, the MLP's input and the
    # down projection's input (the SwiGLU product) are saved for nobody; every projection adapted
    # saves what full training saves.
    settings = ({}, {"lora_rank": 16}, {"lora_rank": 16, "lora_targets": "all-linear"})
    full, default, every = (run("ddp", **extra)["memory"]["activations_bytes"] for extra in settings)
    tokens, h, f = 4096, 4096, 11008
    assert full - default == 32 * (2 * tokens * h + 2 * tokens * f)
    assert every == full


def test_a_qlora_base_in_4_bit_nf4_lets_llama_2_70b_fine_tune_on_one_gpu():
    # QLoRA: NF4 with double quantization, 4 + 8/64 + 32/(64*256) bits a weight, for the blocks'
    # projections; embeddings, norms and the head stay bf16.
    settings = dict(model="llama2-70b", gpus=1, topology="dgx-a100", micro_batch=1, strategy="ddp",
                    recompute="full", lora_rank=16)
    bf16, nf4 = (simulate(**settings, **extra).metrics for extra in ({}, {"lora_base": "nf4"}))
    shape = preset("llama2-70b", 1).shape
    projections = shape.n_layer * (shape.d_model * (shape.d_model + 2 * 1024) + shape.d_model * shape.d_model
                                   + 3 * shape.d_model * shape.d_ffn)
    saved = projections * (2 - 4.127 / 8)
    assert bf16["memory"]["params_bytes"] - nf4["memory"]["params_bytes"] == pytest.approx(saved, rel=1e-3)
    assert bf16["memory"]["fits"] is False and nf4["memory"]["fits"] is True
    # Dequantizing before every GEMM, forward and backward, costs time: a few percent here.
    assert 1.0 < nf4["step_time_s"] / bf16["step_time_s"] < 1.15
    assert "NF4" in nf4["lora"]


def test_a_qlora_base_is_refused_where_it_would_be_sharded_and_without_adapters():
    with pytest.raises(ScenarioError, match="FSDP-QLoRA"):
        run("fsdp", lora_rank=16, lora_base="nf4")
    with pytest.raises(ScenarioError, match="no --lora-rank"):
        run("ddp", lora_base="nf4")
