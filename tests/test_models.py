"""Models as published: preset shapes and their sources, what grouped-query attention, SwiGLU
and flash attention change, custom shapes from the command line, and the memory a GPU holds
beyond its tensors."""

import dataclasses
import json
import subprocess
import sys

import pytest

from zero_sim import simulate
from zero_sim.cli import main
from zero_sim.scenario import ScenarioError, resolve
from zero_sim.system.gpt_layers import GPTShape, gpt_workload
from zero_sim.system.model_presets import PRESET_SOURCES, PRESETS, parse_count, preset, published_params
from zero_sim.system.workload import block_activation_bytes

NEW_PRESETS = ("llama2-7b llama2-13b llama2-70b llama3-8b llama3-70b mistral-7b mpt-7b mpt-30b "
               "gpt3-125m gpt3-350m gpt3-760m gpt3-1.3b gpt3-2.7b gpt3-6.7b gpt3-13b gpt3-175b "
               "t5-11b bert-large").split()
OLD_PRESETS = ("gpt2-124m", "gpt2-350m", "gpt2-1.5b", "gpt-7.5b", "gpt3-175b", "roberta-10b", "roberta-50b")


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "zero_sim", *args], capture_output=True, text=True,
                          timeout=120)


def block(name: str, **kw):
    return preset(name, **kw).layers[1]


# --- presets: every one has a source, and lands on its published size ------------------------------


def test_every_preset_is_there_and_names_its_source():
    assert set(NEW_PRESETS) | set(OLD_PRESETS) <= set(PRESETS)
    assert set(PRESET_SOURCES) == set(PRESETS)
    for name, source in PRESET_SOURCES.items():
        assert source.shape, name


@pytest.mark.parametrize("name", [n for n in sorted(PRESETS) if PRESET_SOURCES[n].params])
def test_parameter_counts_land_within_1_percent_of_the_published_ones(name):
    # A source prints "350M" or "6.74B": the count is known to half a unit of its last digit, so
    # the check is 1% of the printed figure plus that rounding (GPT-3's "350M" model has 355.9M).
    value, rounding = published_params(PRESET_SOURCES[name].params)
    got = preset(name).params
    assert abs(got - value) <= 0.01 * value + rounding, (name, got, PRESET_SOURCES[name].params)


def test_the_released_checkpoints_have_exactly_these_counts():
    # Counted from the published shapes, these are the parameter counts of the released weights.
    assert preset("llama2-7b").params == 6_738_415_616
    assert preset("llama2-70b").params == 68_976_648_192
    assert preset("llama3-8b").params == 8_030_261_248
    assert preset("mistral-7b").params == 7_241_732_096
    assert preset("mpt-7b").params == 6_649_286_656
    assert preset("t5-11b").params == 11_307_321_344


def test_published_counts_are_read_with_their_rounding():
    assert published_params("6.74B") == pytest.approx((6.74e9, 0.005e9))
    assert published_params("350M") == pytest.approx((350e6, 5e6))
    assert published_params("175.0B") == pytest.approx((175e9, 0.05e9))


def test_old_presets_keep_their_shapes():
    assert preset("gpt2-124m").params == 124_439_808
    assert PRESETS["gpt3-175b"] == GPTShape(96, 12288, 96, 50257, 2048)
    # GPT-2 names its activation: the tanh approximation (the same FLOPs, bytes and saved tensors
    # as GeLU; Hugging Face's code runs it as a chain, zero_sim.system.elementwise).
    assert PRESETS["gpt2-1.5b"] == GPTShape(48, 1600, 25, 50257, 1024, tied=True, mlp="gelu_tanh")


# --- shapes: GQA, SwiGLU, RMSNorm, no biases ------------------------------------------------------


def test_llama2_70b_has_grouped_query_attention_swiglu_and_no_biases():
    tensors = {t.name: t.numel for t in block("llama2-70b").tensors}
    h, kv_width, f = 8192, 8 * 128, 28672
    assert tensors == {
        "ln_1.weight": h, "ln_2.weight": h,  # RMSNorm: a weight, no bias
        "attn.qkv.weight": h * (h + 2 * kv_width),  # 64 query heads, 8 key/value heads of 128
        "attn.proj.weight": h * h,
        "mlp.gate.weight": h * f, "mlp.up.weight": h * f, "mlp.proj.weight": f * h,  # SwiGLU: 3 matrices
    }


def test_a_gpt2_block_has_biases_and_two_mlp_matrices():
    names = [t.name for t in block("gpt2-124m").tensors]
    assert names == ["ln_1.weight", "ln_1.bias", "attn.qkv.weight", "attn.qkv.bias", "attn.proj.weight",
                     "attn.proj.bias", "ln_2.weight", "ln_2.bias", "mlp.fc.weight", "mlp.fc.bias",
                     "mlp.proj.weight", "mlp.proj.bias"]


def test_llama_heads_are_untied_and_have_no_position_table():
    w = preset("llama3-8b")
    assert [t.name for t in w.layers[0].tensors] == ["wte"]  # rotary positions: no table
    assert "lm_head.weight" in [t.name for t in w.layers[-1].tensors]
    assert w.layers[-1].reads_layer is None


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_matmul_flops_are_two_per_weight_per_token(name):
    w = preset(name, micro_batch=2, seq_len=128)
    tokens = w.tokens_per_micro_batch
    for layer in w.layers[1:-1]:
        weights = sum(t.numel for t in layer.tensors if t.name.endswith(".weight") and "ln" not in t.name)
        assert layer.work.matmul_flops == 2 * tokens * weights
        assert layer.fwd_flops == layer.work.matmul_flops + layer.work.attention_flops
    assert w.layers[-1].work.matmul_flops == 2 * tokens * PRESETS[name].d_model * PRESETS[name].vocab


def test_t5_is_an_encoder_stack_then_a_decoder_stack_with_cross_attention():
    w = preset("t5-11b")
    encoder, decoder = w.layers[1], w.layers[25]
    assert not any(t.name.startswith("xattn") for t in encoder.tensors)
    assert {"xattn.q.weight", "xattn.kv.weight", "xattn.proj.weight"} <= {t.name for t in decoder.tensors}
    assert decoder.work.attention_flops == 2 * encoder.work.attention_flops
    assert [layer.kind for layer in w.layers] == ["embedding"] + ["block"] * 48 + ["head"]


def test_the_work_of_a_layer_names_its_gemm_sizes():
    work = block("llama2-7b", micro_batch=2).work
    assert (work.tokens, work.width, work.seq_len, work.heads, work.head_dim) == (8192, 4096, 4096, 32, 128)
    assert work.attention == "flash"
    # The attention core: 4 * b * s^2 * (heads * head_dim), causal masking not halved.
    assert work.attention_flops == 4 * 2 * 4096 ** 2 * 4096
    assert preset("gpt2-124m").layers[0].work.matmul_flops == 0  # the lookup is memory traffic only
    assert preset("gpt2-124m").layers[0].work.memory_bytes > 0


def test_mistral_attends_to_a_window_of_4096_keys():
    short, long = block("mistral-7b", seq_len=4096), block("mistral-7b", seq_len=8192)
    assert long.work.attention_flops == 2 * short.work.attention_flops  # twice the queries, same keys


# --- flash vs eager: the s x s tensors --------------------------------------------------------------


def test_eager_keeps_korthikantis_five_s_squared_terms_flash_keeps_none():
    s, b, h, a = 1024, 4, 768, 12
    eager = block("gpt2-124m", micro_batch=b, attention="eager").activation_bytes
    flash = block("gpt2-124m", micro_batch=b, attention="flash").activation_bytes
    assert eager == s * b * h * 34 + 5 * a * s * s * b  # Korthikanti et al. 2022, exactly
    assert flash == s * b * h * 34 + 4 * a * s * b  # the s x s terms gone; fp32 log-sum-exp per head kept


def test_flash_activations_grow_linearly_with_sequence_length_eager_quadratically():
    def per_token(attention, seq_len):
        layer = block("llama2-7b", seq_len=seq_len, attention=attention)
        return layer.activation_bytes / seq_len

    assert per_token("flash", 8192) == per_token("flash", 1024)
    assert per_token("eager", 8192) > 3 * per_token("eager", 1024)


def test_flash_saves_grouped_kv_heads_eager_repeats_them_to_every_query_head():
    s, h = 4096, 8192
    eager = block("llama2-70b", attention="eager", recompute="selective").checkpointed_activation_bytes
    flash = block("llama2-70b", attention="flash", recompute="selective").checkpointed_activation_bytes
    assert eager - flash == 4 * s * (h - 8 * 128)  # K and V at 64 heads instead of 8


def test_swiglu_and_gelu_mlps_save_what_their_backward_reads():
    kw = dict(s=256, b=1, h=64, a=4, recompute="selective", attention="flash", dropout=False)
    gelu = block_activation_bytes(**kw, ffn_hidden=256, mlp="gelu")
    swiglu = block_activation_bytes(**kw, ffn_hidden=256, mlp="swiglu")
    relu = block_activation_bytes(**kw, ffn_hidden=256, mlp="relu")
    assert swiglu - gelu == 4 * 256 * 256  # gate, up, SiLU out, product (8*T*f) vs GeLU in, out (4*T*f)
    assert gelu - relu == 2 * 256 * 256  # ReLU's backward reads its output, which the down projection keeps


def test_selective_recompute_drops_the_attention_core_and_full_keeps_the_block_input():
    none = block("gpt2-124m", attention="flash")
    sel = block("gpt2-124m", attention="flash", recompute="selective")
    full = block("gpt2-124m", attention="flash", recompute="full")
    assert none.activation_bytes - sel.checkpointed_activation_bytes == 4 * 1024 * 12  # the log-sum-exp
    assert full.checkpointed_activation_bytes == 2 * 1024 * 768


def test_eager_attention_adds_the_softmax_to_memory_traffic():
    s, a = 1024, 12
    eager, flash = block("gpt2-124m", attention="eager").work, block("gpt2-124m", attention="flash").work
    assert eager.matmul_flops == flash.matmul_flops and eager.attention_flops == flash.attention_flops
    assert eager.memory_bytes - flash.memory_bytes == (4 + 5) * a * s * s  # softmax, then its dropout


def test_attention_is_a_setting_and_flash_is_the_default():
    assert resolve().settings.attention == "flash"
    eager = simulate(model="gpt2-124m", gpus=2, attention="eager").metrics["memory"]
    flash = simulate(model="gpt2-124m", gpus=2).metrics["memory"]
    assert flash["activations_bytes"] < eager["activations_bytes"] / 2


# --- custom shapes and sizes --------------------------------------------------------------------------


CUSTOM = dict(layers=4, hidden=512, heads=8, kv_heads=2, ffn_hidden=1376, vocab=1000, seq_len=256)


def test_a_custom_shape_takes_what_it_does_not_name_from_the_preset():
    m = simulate(model="llama2-7b", gpus=2, micro_batch=2, **CUSTOM).metrics
    expected = GPTShape(4, 512, 8, 1000, 256, kv_heads=2, ffn_hidden=1376, mlp="swiglu", norm="rmsnorm",
                        bias=False, positions="rotary", dropout=False)
    assert m["params"] == expected.params()
    assert m["model"].startswith("custom-")


def test_the_command_line_builds_the_same_custom_shape():
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in CUSTOM.items()]
    out = run_cli("simulate", "--model", "llama2-7b", "--gpus", "2", "--micro-batch", "2", *flags, "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["params"] == simulate(model="llama2-7b", gpus=2, micro_batch=2,
                                                        **CUSTOM).metrics["params"]


def test_one_custom_value_changes_only_that_value():
    base = simulate(model="gpt2-124m", gpus=2, micro_batch=1).metrics["params"]
    deeper = simulate(model="gpt2-124m", gpus=2, micro_batch=1, layers=13).metrics["params"]
    assert deeper - base == 12 * 768 ** 2 + 13 * 768  # one more GPT-2 block


@pytest.mark.parametrize("text", ["7.5e9", "7.5B", "7.5b", "7500M", 7.5e9, 7_500_000_000])
def test_params_accepts_counts_with_exponents_and_suffixes(text):
    assert parse_count(text) == 7_500_000_000


def test_params_7_5e9_from_python_and_the_command_line():
    by_keyword = simulate(params="7.5B", gpus=8, micro_batch=1).metrics["params"]
    assert simulate(params=7.5e9, gpus=8, micro_batch=1).metrics["params"] == by_keyword
    for flag in ("7.5e9", "7.5B"):
        out = run_cli("simulate", "--params", flag, "--gpus", "8", "--micro-batch", "1", "--json")
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout)["params"] == by_keyword
    assert abs(by_keyword - 7.5e9) / 7.5e9 < 0.05
    assert parse_count("350M") == 350_000_000 and parse_count("1.3b") == 1_300_000_000


@pytest.mark.parametrize("args,sentence", [
    (["--params", "lots"], "--params must be a positive count such as 7.5e9, 7.5B, 350M or 1.3b"),
    (["--params=-1B"], "--params must be a positive count"),
    (["--params", "1B", "--layers", "4"], "cannot be combined with --layers"),
    (["--heads", "12", "--kv-heads", "5"], "--heads 12 is not a multiple of --kv-heads 5"),
    (["--hidden", "1000"], "--hidden 1000 is not divisible by --heads 12"),
    (["--layers", "0"], "--layers must be a positive integer"),
    (["--ffn-hidden", "-4"], "--ffn-hidden must be a positive integer"),
    (["--attention", "sdpa"], "invalid choice: 'sdpa' (choose from 'flash', 'flash1', 'cudnn', 'eager')"),
    (["--allocator-reserve", "2"], "--allocator-reserve must be between 0 and 1"),
    (["--cuda-context-gb", "-1"], "--cuda-context-gb must be a non-negative number"),
    (["--efficiency", "0"], "--efficiency must be in (0, 1]"),
])
def test_bad_values_get_one_sentence_and_exit_status_2(capsys, args, sentence):
    assert main(["simulate", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert sentence in err, err
    assert "Traceback" not in err and len(err.splitlines()) == 1


def test_the_efficiency_default_is_the_per_op_model():
    assert resolve().settings.efficiency is None  # a float keeps the old flat roofline
    with pytest.raises(ScenarioError, match="--efficiency must be in"):
        simulate(efficiency=1.5)
    choices = "flash, flash1, cudnn, eager"
    with pytest.raises(ScenarioError, match=f"--attention must be one of {choices}, got 'sdpa'"):
        simulate(attention="sdpa")


# --- memory a GPU holds beyond its tensors ---------------------------------------------------------------


SCENARIO = dict(model="gpt2-1.5b", strategy="ddp", gpus=8, topology="dgx-a100", micro_batch=4)


def test_the_reserved_peak_adds_the_allocator_reserve_and_the_context():
    bare = simulate(**SCENARIO, cuda_context_gb=0, allocator_reserve=0).metrics["memory"]
    assert bare["reserved_peak_bytes"] == bare["peak_bytes"]
    mem = simulate(**SCENARIO, cuda_context_gb=2.0, allocator_reserve=0.25).metrics["memory"]
    assert mem["peak_bytes"] == bare["peak_bytes"]  # the tensors are the same
    assert mem["reserved_peak_bytes"] == round(bare["peak_bytes"] * 1.25) + 2_000_000_000


def test_the_defaults_are_the_sourced_ones():
    mem = simulate(**SCENARIO).metrics["memory"]
    assert mem["context_bytes"] == 1_100_000_000  # A100: CUDA context ~0.4 GB + one NCCL communicator ~0.7 GB
    assert mem["reserved_peak_bytes"] == round(mem["peak_bytes"] * 1.10) + 1_100_000_000
    h100 = simulate(**SCENARIO | {"gpu": "H100"}).metrics["memory"]
    assert h100["context_bytes"] == 1_500_000_000
    cpu = simulate(topology="cpu-gloo", backend="gloo", gpus=2, micro_batch=1).metrics["memory"]
    assert cpu["context_bytes"] == 0  # no CUDA context on CPU ranks


def test_a_run_that_recomputes_activations_leaves_a_third_of_its_peak_reserved_but_unused():
    # GMLake: recompute fragments the caching allocator to about 25% (reserved = peak / 0.75).
    recomputed = simulate(**SCENARIO, recompute="full", cuda_context_gb=0)
    mem = recomputed.metrics["memory"]
    assert recomputed.scenario.hardware.allocator_reserve == pytest.approx(1 / 3)
    assert mem["reserved_peak_bytes"] == round(mem["peak_bytes"] / 0.75)
    told = simulate(**SCENARIO, recompute="full", cuda_context_gb=0, allocator_reserve=0.1).metrics["memory"]
    assert told["reserved_peak_bytes"] == round(told["peak_bytes"] * 1.10)


def test_fits_is_judged_on_the_reserved_peak():
    roomy = simulate(**SCENARIO, cuda_context_gb=0, allocator_reserve=0).metrics["memory"]
    assert roomy["fits"] and roomy["peak_bytes"] < roomy["capacity_bytes"]
    context = (roomy["capacity_bytes"] - roomy["peak_bytes"]) / 1e9 + 1  # 1 GB too much
    tight = simulate(**SCENARIO, cuda_context_gb=context, allocator_reserve=0).metrics["memory"]
    assert tight["peak_bytes"] < tight["capacity_bytes"] < tight["reserved_peak_bytes"]
    assert tight["fits"] is False
    assert tight["shortfall_bytes"] == tight["reserved_peak_bytes"] - tight["capacity_bytes"]


def test_the_memory_knobs_work_from_the_command_line():
    out = run_cli("simulate", "--model", "gpt2-124m", "--gpus", "2", "--cuda-context-gb", "3",
                  "--allocator-reserve", "0", "--json")
    assert out.returncode == 0, out.stderr
    mem = json.loads(out.stdout)["memory"]
    assert mem["reserved_peak_bytes"] == mem["peak_bytes"] + 3_000_000_000


def test_a_workload_with_bad_shape_is_refused_in_python_too():
    from zero_sim.system.workload import WorkloadError

    with pytest.raises(WorkloadError, match="unknown mlp 'tanh'"):
        gpt_workload(GPTShape(2, 64, 2, mlp="tanh"))


def test_op_level_checkpointing_keeps_every_other_projection_and_the_attention_output():
    """torchtitan's op-level policy sits between selective and full recompute: it keeps the
    attention kernel's output and every other matmul output, and re-runs the other projections."""
    kw = dict(micro_batch=2, seq_len=2048, attention="flash")
    saved = {mode: preset("llama2-7b", recompute=mode, **kw).saved_activation_bytes()
             for mode in ("none", "selective", "op", "full")}
    assert saved["full"] < saved["op"] < saved["selective"] <= saved["none"]
    block = preset("llama2-7b", recompute="op", **kw).layers[1]
    t, h, f = 2 * 2048, 4096, 11008
    # q, v, gate and down are kept (2 bytes each), with the block input and the attention output
    # and its fp32 log-sum-exp per head.
    kept = 2 * t * (h + h + f + h) + 2 * t * h + 2 * t * (h + 4 * 32 // 2)
    assert block.checkpointed_activation_bytes == kept
    # k, o and up are the projections it re-runs.
    assert block.work.unsaved_matmul_flops == 2 * t * (h * h + h * h + h * f)


def test_op_level_checkpointing_costs_between_selective_and_full_recompute():
    kw = dict(model="llama2-7b", seq_len=2048, strategy="fsdp", gpus=8, topology="dgx-h100", micro_batch=2)
    step = {mode: simulate(recompute=mode, **kw).metrics["step_time_s"]
            for mode in ("selective", "op", "full")}
    assert step["selective"] < step["op"] < step["full"]


def test_encoders_attend_to_every_token_so_flash_attention_skips_nothing():
    """BERT, RoBERTa and T5's encoder are not causal: a flash kernel does twice a decoder's work
    on the same block (the decoder skips the masked half), at the somewhat higher rate kernels
    without a mask reach on short sequences, so it takes between 1.3 and 2 times as long."""
    from zero_sim.system.gpus import GPUS
    from zero_sim.system.hardware import ComputeModel

    t5 = preset("t5-11b").layers
    assert [layer.work.causal for layer in t5 if layer.kind == "block"] == [False] * 24 + [True] * 24
    assert not preset("bert-large").layers[1].work.causal and preset("llama2-7b").layers[1].work.causal
    decoder = preset("gpt2-350m", seq_len=1024, micro_batch=4).layers[1].work
    encoder = dataclasses.replace(decoder, causal=False)
    model = ComputeModel(GPUS["A100-80GB"])
    ratio = model.attention_seconds("fwd", encoder) / model.attention_seconds("fwd", decoder)
    assert 1.3 < ratio <= 2.0
