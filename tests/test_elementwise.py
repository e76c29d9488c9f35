"""Element-wise chains: eager PyTorch runs an RMSNorm or a rotary embedding as a chain of
kernels, each an HBM round trip, where a fused or compiled kernel makes one.

The bytes are counted from the sources' code (the table is in zero_sim/system/elementwise.py);
the ratio is checked against Liger-Kernel's A100 benchmark of eager against fused RMSNorm.
``fused`` is the default and leaves every figure as it was."""

from __future__ import annotations

import pytest

from zero_sim import simulate
from zero_sim.cli import main
from zero_sim.published import load_points
from zero_sim.scenario import ScenarioError, resolve
from zero_sim.system.elementwise import AUTOCAST_SCORE_BYTES, ELEMENTWISE_BYTES, HF_EXTRA_BYTES
from zero_sim.system.gpt_layers import gpt_workload
from zero_sim.system.gpus import GPUS
from zero_sim.system.hardware import MEMORY_BWD_OVER_FWD, ComputeModel
from zero_sim.system.model_presets import PRESETS, preset
from zero_sim.system.workload import WorkloadError

# torchtitan's (and Meta's reference) eager RMSNorm, step by step: (bytes read, bytes written)
# per element of the hidden state, bf16 in and out; the per-row mean and rsqrt are negligible.
EAGER_RMSNORM = {"x.float()": (2, 4), "pow(2)": (4, 4), "mean(-1)": (4, 0), "x * rsqrt": (4, 4),
                 "type_as(x)": (4, 2), "* weight": (2, 2)}
# torchtitan's apply_rotary_emb, per element of Q and K.
EAGER_ROTARY = {"xq.float()": (2, 4), "complex multiply": (4, 4), "type_as(xq)": (4, 2)}
# fms's RotaryEmbedding.adjusted_qk: the product with 2 x 2 rotations writes fp32 twice q's size.
FMS_ROTARY = {"q.float()": (2, 4), "freqs.mul(q_)": (4, 8), "sum(5)": (8, 4), "type_as(q)": (4, 2)}
# transformers' GPT2Attention._attn between its two matmuls, per score element, fp16: forward kernels
# and the backward autograd runs for each (the additive mask needs no gradient: none runs).
HF_SCORES_FWD = {"/ sqrt(d)": (2, 2), "+ attention_mask": (2, 2)}
HF_SCORES_BWD = {"grad / sqrt(d)": (2, 2)}
HF_CAUSAL_FWD = {"torch.where(causal_mask, w, min)": (2, 2)}
HF_CAUSAL_BWD = {"torch.where(causal_mask, grad, 0)": (2, 2)}
# NewGELUActivation, 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x**3))), per element of the MLP.
GELU_NEW_FWD = {"pow(x, 3)": (2, 2), "0.044715 *": (2, 2), "x +": (4, 2), "sqrt(2 / pi) *": (2, 2),
                "tanh": (2, 2), "1 +": (2, 2), "0.5 * x": (2, 2), "*": (4, 2)}
GELU_NEW_BWD = {"grad * (1 + tanh)": (4, 2), "grad * 0.5x": (4, 2), "tanh_backward": (4, 2),
                "* sqrt(2 / pi)": (2, 2), "* 0.044715": (2, 2), "pow(x, 2)": (2, 2), "* 3": (2, 2),
                "* grad": (4, 2), "* 0.5": (2, 2), "x's gradients: two adds": (8, 4)}


def chain_bytes(chain: dict[str, tuple[int, int]]) -> int:
    return sum(read + written for read, written in chain.values())


def block(name: str, elementwise: str = "fused", **kw):
    return preset(name, micro_batch=1, seq_len=4096, elementwise=elementwise, **kw).layers[1]


# --- the bytes: counted op by op ----------------------------------------------------------------


def test_an_eager_rmsnorm_moves_nine_times_the_bytes_of_a_fused_one():
    assert chain_bytes(EAGER_RMSNORM) == ELEMENTWISE_BYTES["eager"]["rmsnorm"] == 36
    assert ELEMENTWISE_BYTES["fused"]["rmsnorm"] == 4  # one kernel: read 2, write 2
    # Liger-Kernel's A100-80GB benchmark at M=2048, H=4096: eager forward 0.280 ms, fused 0.031 ms.
    assert 36 / 4 == pytest.approx(0.280 / 0.031, rel=0.05)


def test_eager_rotary_is_the_complex_multiply_and_fms_writes_twice_as_much():
    assert chain_bytes(EAGER_ROTARY) == ELEMENTWISE_BYTES["eager"]["rotary"] == 20
    assert chain_bytes(FMS_ROTARY) == ELEMENTWISE_BYTES["eager-fms"]["rotary"] == 36
    assert ELEMENTWISE_BYTES["fused"]["rotary"] == 4


def test_hugging_faces_attention_scores_and_gelu_new_are_counted_kernel_by_kernel_both_ways():
    assert HF_EXTRA_BYTES["scores"] == (chain_bytes(HF_SCORES_FWD), chain_bytes(HF_SCORES_BWD)) == (8, 4)
    assert HF_EXTRA_BYTES["causal_mask"] == (chain_bytes(HF_CAUSAL_FWD), chain_bytes(HF_CAUSAL_BWD)) == (4, 4)
    # The chain less the one GeLU kernel it stands for: forward 2 + 2, backward gelu_backward's 4 + 2.
    assert chain_bytes(GELU_NEW_FWD) == 36 and chain_bytes(GELU_NEW_BWD) == 56
    assert HF_EXTRA_BYTES["gelu_tanh"] == (36 - 4, 56 - 6)


def test_eager_hf_adds_to_gpt2_what_its_code_runs_and_nothing_to_an_sdpa_llama():
    model = ComputeModel(GPUS["V100"])
    eager = block("gpt2-350m", "eager", attention="eager")
    hf = block("gpt2-350m", "eager-hf", attention="eager")
    assert hf.work.memory_bytes == eager.work.memory_bytes  # the rule-following part is eager's
    b, s, a, f = 1, 4096, 16, 4096
    scores, mlp = b * a * s * s, b * s * f
    assert hf.work.listed_bytes_fwd == 8 * scores + 4 * scores + 32 * mlp
    assert hf.work.listed_bytes_bwd == 4 * scores + 4 * scores + 50 * mlp
    rate = GPUS["V100"].hbm_gbps * 1e9 * model.elementwise_efficiency
    for direction, listed in (("fwd", hf.work.listed_bytes_fwd), ("bwd", hf.work.listed_bytes_bwd)):
        extra = model.op_seconds("block", direction, hf.work)["memory"] - \
            model.op_seconds("block", direction, eager.work)["memory"]
        assert extra == pytest.approx(listed / rate, rel=1e-9)
    # Llama under SDPA: the scores never leave the kernel and SwiGLU is not gelu_new.
    llama_eager, llama_hf = block("llama2-7b", "eager"), block("llama2-7b", "eager-hf")
    assert llama_hf.work == llama_eager.work
    assert resolve(stack="hf-trainer").settings.elementwise == "eager-hf"
    assert resolve(stack="hf-trainer-2021").settings.elementwise == "eager-hf"


def test_under_autocast_eager_attention_softmaxes_its_scores_in_fp32_and_flash_pays_nothing():
    """The softmax is on autocast's fp32 list: cast up, softmax and dropout in fp32, cast back."""
    cast_in, softmax, dropout, cast_out = (2, 4), (4 + 4) - (2 + 2), (4 + 4 + 1) - (2 + 2 + 1), (4, 2)
    assert sum(cast_in) + softmax + dropout + sum(cast_out) == AUTOCAST_SCORE_BYTES[0] == 20
    # backward: the casts' (2 + 4 and 4 + 2), dropout's and softmax's in fp32 against fp16
    assert 6 + ((4 + 1 + 4) - (2 + 1 + 2)) + ((4 + 4 + 4) - (2 + 2 + 2)) + 6 == AUTOCAST_SCORE_BYTES[1]
    plain, amp = ComputeModel(GPUS["V100"]), ComputeModel(GPUS["V100"], autocast=True)
    eager = block("gpt2-350m", "eager-hf", attention="eager").work
    scores = 16 * 4096 * 4096
    rate = GPUS["V100"].hbm_gbps * 1e9 * plain.elementwise_efficiency
    for i, direction in enumerate(("fwd", "bwd")):
        extra = amp.op_seconds("block", direction, eager)["memory"] - \
            plain.op_seconds("block", direction, eager)["memory"]
        assert extra == pytest.approx(AUTOCAST_SCORE_BYTES[i] * scores / rate, rel=1e-9)
    flash = block("gpt2-350m", "eager-hf").work
    assert amp.op_seconds("block", "bwd", flash) == plain.op_seconds("block", "bwd", flash)
    kw = dict(model="gpt2-350m", strategy="ddp", gpus=2, micro_batch=1, attention="eager", steps=1)
    assert simulate(**kw, precision="amp").metrics["compute_time_s"] > \
        simulate(**kw, precision="mixed").metrics["compute_time_s"]
    assert resolve(stack="hf-trainer-2021", strategy="ddp").settings.precision == "amp"


def test_ops_eager_pytorch_already_runs_as_one_kernel_cost_the_same_in_every_setting():
    """LayerNorm is one ATen kernel; SwiGLU is silu then a product in both; adds, dropout, the
    gather and the loss are counted as eager code runs them already."""
    for setting, table in ELEMENTWISE_BYTES.items():
        changed = {op for op in table if table[op] != ELEMENTWISE_BYTES["fused"][op]}
        assert changed <= {"rmsnorm", "rotary"}, setting
    assert ELEMENTWISE_BYTES["eager"]["silu"] + ELEMENTWISE_BYTES["eager"]["product"] == 10


# --- the bytes in a block, a head and a whole model --------------------------------------------------


def test_a_llama_block_charges_the_chains_of_its_two_norms_and_its_rotary():
    t, h, f, qk = 4096, 4096, 11008, 4096 + 4096
    fused, eager, fms = (block("llama2-7b", e).work for e in ("fused", "eager", "eager-fms"))
    # Two norms, two residual adds, SiLU and product, rotary over Q and K.
    assert fused.memory_bytes == 2 * (4 + 6) * t * h + 10 * t * f + 4 * t * qk
    assert eager.memory_bytes == 2 * (36 + 6) * t * h + 10 * t * f + 20 * t * qk
    assert fms.memory_bytes == eager.memory_bytes + (36 - 20) * t * qk
    assert (eager.matmul_flops, eager.attention_flops) == (fused.matmul_flops, fused.attention_flops)
    # torchtitan's Triton fused_rmsnorm without compile: the norms fused, the rotary still its chain.
    norm_only = block("llama2-7b", "fused-norm").work
    assert norm_only.memory_bytes == fused.memory_bytes + (20 - 4) * t * qk


def test_the_head_charges_its_final_norm_and_the_embedding_is_unchanged():
    fused, eager = (preset("llama2-7b", seq_len=4096, elementwise=e) for e in ("fused", "eager"))
    assert eager.layers[-1].work.memory_bytes - fused.layers[-1].work.memory_bytes == (36 - 4) * 4096 * 4096
    assert eager.layers[0].work.memory_bytes == fused.layers[0].work.memory_bytes


def test_a_layernorm_gelu_model_is_the_same_eager_or_fused():
    for e in ("eager", "eager-fms"):
        eager = preset("gpt2-1.5b", elementwise=e)
        fused = preset("gpt2-1.5b")
        assert [layer.work for layer in eager.layers] == [layer.work for layer in fused.layers]


def test_saved_activations_do_not_depend_on_the_setting():
    fused, eager = block("llama2-7b"), block("llama2-7b", "eager", recompute="none")
    assert eager.activation_bytes == fused.activation_bytes


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_fused_keeps_every_presets_bytes_as_the_per_op_count_had_them(name):
    """The count before the setting existed, written out again: with the default a block moves
    exactly these bytes, so no existing figure moves."""
    s = PRESETS[name]
    t, h, f = 2 * s.seq_len, s.d_model, s.d_ffn

    def block_bytes(sublayers: int) -> int:  # each sublayer: a norm, a residual add, a dropout
        total = (4 + 6 + (5 if s.dropout else 0)) * t * h * sublayers
        total += {"gelu": 4, "gelu_tanh": 4, "relu": 4, "swiglu": 10}[s.mlp] * t * f
        if s.positions == "rotary":
            total += 4 * t * (s.n_head + s.n_kv_head) * s.d_head
        return total

    w = preset(name, micro_batch=2)
    assert w.layers[1].work.memory_bytes == block_bytes(3 if s.cross_attention == s.n_layer else 2)
    assert w.layers[-2].work.memory_bytes == block_bytes(3 if s.cross_attention else 2)
    assert w.layers[-1].work.memory_bytes == 4 * t * h + 14 * t * s.vocab  # final norm and the loss


# --- the time: only the memory-bound part grows ------------------------------------------------------


def test_an_eager_7b_block_on_an_a100_is_slower_by_its_extra_memory_traffic_alone():
    model = ComputeModel(GPUS["A100-80GB"])
    fused, eager = block("llama2-7b"), block("llama2-7b", "eager")

    def fwd_bwd(layer):
        flops = layer.fwd_flops
        return (model.layer_time("block", "fwd", flops, layer.work.tokens, layer.work)
                + model.layer_time("block", "bwd", 2 * flops, layer.work.tokens, layer.work))

    parts_fused = model.op_seconds("block", "fwd", fused.work)
    parts_eager = model.op_seconds("block", "fwd", eager.work)
    assert parts_eager["gemm"] == parts_fused["gemm"] and parts_eager["attention"] == parts_fused["attention"]
    extra_bytes = (eager.work.memory_bytes - fused.work.memory_bytes) * (1 + MEMORY_BWD_OVER_FWD)
    achievable = GPUS["A100-80GB"].hbm_gbps * 1e9 * model.elementwise_efficiency
    assert fwd_bwd(eager) - fwd_bwd(fused) == pytest.approx(extra_bytes / achievable, rel=1e-9)
    # The memory-bound share is small fused (about 7% of the block) and grows to about a fifth.
    assert 0.05 < parts_fused["memory"] * 3 / fwd_bwd(fused) < 0.1
    assert 0.15 < parts_eager["memory"] * 3 / fwd_bwd(eager) < 0.25


def test_a_simulated_step_is_longer_eager_and_holds_the_same_memory():
    kw = dict(model="llama2-7b", strategy="fsdp", gpus=2, micro_batch=1, seq_len=2048, steps=1)
    fused, eager = simulate(**kw, elementwise="fused").metrics, simulate(**kw, elementwise="eager").metrics
    assert eager["step_time_s"] > fused["step_time_s"]
    assert eager["memory"]["peak_bytes"] == fused["memory"]["peak_bytes"]


# --- the setting --------------------------------------------------------------------------------------


def test_elementwise_is_a_setting_and_the_default_stack_runs_eager_chains():
    # Most training runs eager PyTorch, whose norms and rotary are chains of ATen kernels.
    assert resolve().settings.elementwise == "eager"
    assert resolve(stack="torch-compile").settings.elementwise == "fused"
    assert resolve(stack="torch-compile", elementwise="eager").settings.elementwise == "eager"
    assert "eager element-wise chains" in preset("llama2-7b", elementwise="eager").describe()
    assert "element-wise" not in preset("llama2-7b").describe()


def test_a_bad_value_gets_one_sentence():
    sentence = "--elementwise must be one of fused, fused-norm, eager, eager-fms, eager-hf, got 'compiled'"
    with pytest.raises(ScenarioError, match=sentence):
        simulate(elementwise="compiled")
    with pytest.raises(WorkloadError, match="unknown elementwise 'compiled'"):
        gpt_workload(PRESETS["llama2-7b"], elementwise="compiled")


def test_a_bad_value_on_the_command_line_exits_with_status_2(capsys):
    assert main(["simulate", "--elementwise", "compiled"]) == 2
    err = capsys.readouterr().err.strip()
    choices = "'fused', 'fused-norm', 'eager', 'eager-fms', 'eager-hf'"
    assert f"invalid choice: 'compiled' (choose from {choices})" in err, err
    assert "Traceback" not in err and len(err.splitlines()) == 1


# --- the published points that ran eager chains say so -------------------------------------------------


def test_the_published_points_name_the_chains_their_code_ran():
    setting = {p["id"]: p["scenario"].get("elementwise", "fused") for p in load_points() if "scenario" in p}
    for pid, value in setting.items():
        if "-compile" in pid or pid.startswith("torchao-float8"):
            assert value == "fused", pid  # torch.compile fuses the norms, rotary and float8 casts
        elif pid.startswith(("torchtitan-h100", "torchtitan-pr165")) or pid.endswith("70b-full"):
            assert value == "eager", pid  # no compile, torchtitan's eager RMSNorm
        elif pid.startswith("ibm-fms"):
            assert value == "eager-fms", pid  # fms-fsdp's table before compile was turned on
        elif pid.startswith("torchtitan-a100"):
            assert value == "fused-norm", pid  # the config's Triton fused_rmsnorm, uncompiled rotary
        elif pid.startswith("llmfoundry"):
            assert value == "fused", pid  # one layer_norm kernel, no rotary
