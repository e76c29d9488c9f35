"""FP8 training: the blocks' linear GEMMs on FP8 tensor cores, the casts that feed them, and FSDP2's
float8 all-gather (zero_sim.system.fp8)."""

import json

import pytest

from zero_sim import simulate
from zero_sim.cli import main
from zero_sim.scenario import ScenarioError, prepare
from zero_sim.system import fp8 as fp8_model
from zero_sim.system.fp8 import BlockLinears, Fp8Training
from zero_sim.system.gpus import GPUS
from zero_sim.system.hardware import ComputeModel
from zero_sim.system.model_presets import preset

# Llama-3-8B under FSDP on one DGX H100, torchtitan's December 2024 benchmark shape (local batch 2,
# 8k tokens, op-level checkpointing), compiled as its float8 rows were.
LLAMA = dict(model="llama3-8b", strategy="fsdp", gpus=8, topology="dgx-h100", micro_batch=2, seq_len=8192,
             recompute="op", copies="fsdp2", stack="torch-compile")


def ops_of(**settings) -> list:
    p = prepare(**settings)
    return p.strategy.build(p.ctx).ops


def block_gathers(**settings) -> list[float]:
    """Bytes of each block's forward all-gather (the root's is the embedding and head, bf16 either way)."""
    return [op.nbytes for op in ops_of(**settings)
            if op.collective == "all_gather" and op.phase == "forward" and op.layer not in (0, 33)]


def test_the_float8_all_gather_moves_the_linear_weights_at_one_byte_instead_of_two():
    block = preset("llama3-8b", 2).layers[1]
    linears = sum(t.numel for t in block.tensors if not t.name.startswith("ln_"))
    norms = block.numel - linears
    bf16 = block_gathers(**LLAMA)
    fp8 = block_gathers(**LLAMA, precision="fp8")
    gathered = block_gathers(**LLAMA, precision="fp8", fp8_all_gather=True)
    assert len(gathered) == 32 and set(bf16) == {2 * block.numel}
    assert fp8 == bf16  # fp8 GEMMs alone gather the bf16 weights, as torchao casts after the gather
    assert set(gathered) == {linears * 1 + norms * 2}  # the norms stay bf16
    assert gathered[0] / bf16[0] == pytest.approx(0.5, abs=0.001)


def test_the_precomputed_scales_are_one_small_all_reduce_after_the_optimizer():
    ops = ops_of(**LLAMA, precision="fp8", fp8_all_gather=True)
    amax = [op for op in ops if op.name == "all_reduce amax"]
    assert len(amax) == 1 and amax[0].phase == "optimizer"
    assert amax[0].nbytes == 4 * 7 * 32  # one fp32 amax for each of 7 linears in 32 blocks
    assert not [op for op in ops_of(**LLAMA, precision="fp8") if op.name == "all_reduce amax"]


def test_fp8_speeds_a_gemm_bound_h100_step_but_by_less_than_the_peak_ratio():
    bf16 = simulate(**LLAMA).metrics["step_time_s"]
    fp8 = simulate(**LLAMA, precision="fp8", fp8_all_gather=True).metrics["step_time_s"]
    peak_ratio = GPUS["H100"].fp8_tflops / GPUS["H100"].peak_tflops
    assert peak_ratio == pytest.approx(2.0, rel=0.01)
    # Attention, norms and the head stay bf16 and the casts cost HBM time: well short of 2x.
    assert 1.15 < bf16 / fp8 < 1.45


def test_the_casts_are_ops_in_the_timeline_and_cost_time(monkeypatch):
    run = simulate(**LLAMA, precision="fp8")
    casts = [op for op in run.ops
             if op["name"].startswith("fp8_cast") and op["rank"] == 0 and op["step"] == 1]
    assert {op["phase"] for op in casts} == {"forward", "backward"}
    assert len(casts) == 2 * 32  # one before each block's forward and one before its backward
    assert min(op["end_s"] - op["start_s"] for op in casts) > 0
    with_casts = run.metrics["step_time_s"]
    free = {recipe: {role: (0, 0) for role in table} for recipe, table in fp8_model.CAST_BYTES.items()}
    monkeypatch.setattr(fp8_model, "CAST_BYTES", free)
    assert simulate(**LLAMA, precision="fp8").metrics["step_time_s"] < with_casts


def test_only_the_blocks_gemms_run_in_fp8():
    gpu = GPUS["H100"]
    workload = preset("llama3-8b", 2, 8192)
    bf16 = ComputeModel(gpu)
    fp8 = ComputeModel(gpu, fp8=fp8_model.fp8_training(gpu, workload))
    block, head = workload.layers[1], workload.layers[-1]
    gemm = [m.gemm_seconds("block", "fwd", block.work) for m in (bf16, fp8)]
    assert 1.8 < gemm[0] / gemm[1] <= 2.0  # large GEMMs: nearly the peak ratio
    assert fp8.gemm_seconds("head", "fwd", head.work) == bf16.gemm_seconds("head", "fwd", head.work)
    assert fp8.attention_seconds("fwd", block.work) == bf16.attention_seconds("fwd", block.work)


def test_small_gemms_gain_less_than_large_ones():
    gpu = GPUS["H100"]
    small, large = preset("llama3-8b", 1, 256), preset("llama3-8b", 2, 8192)
    gains = []
    for workload in (small, large):
        fp8 = ComputeModel(gpu, fp8=fp8_model.fp8_training(gpu, workload))
        work = workload.layers[1].work
        bf16 = ComputeModel(gpu).gemm_seconds("block", "fwd", work)
        gains.append(bf16 / fp8.gemm_seconds("block", "fwd", work))
    assert gains[0] < gains[1]


def test_compiled_cast_bytes_are_torchaos_tensorwise_roofline():
    # One linear of M x K input, K x N weight: input 2MK amax + (2 + 1 + 1)MK cast; weight 2KN amax, 3KN
    # forward cast, 3KN backward cast; grad_output 2MN amax + 4MN cast (roofline_utils, tensorwise).
    m, k, n = 8192, 4096, 14336
    fp8 = Fp8Training(GPUS["H100"], BlockLinears(m * k, m * n, k * n, 1), compiled=True)
    block = preset("llama3-8b", 1).layers[1]
    assert fp8.cast_bytes(block, "fwd") == 6 * m * k + 5 * k * n
    assert fp8.cast_bytes(block, "bwd") == 6 * m * n + 3 * k * n
    eager = Fp8Training(GPUS["H100"], BlockLinears(m * k, m * n, k * n, 1), compiled=False)
    assert eager.cast_bytes(block, "fwd") > 5 * fp8.cast_bytes(block, "fwd")
    assert fp8.cast_bytes(preset("llama3-8b", 1).layers[-1], "fwd") == 0  # the head casts nothing


def test_without_compile_the_eager_casts_cost_more_than_fp8_saves():
    eager = dict(LLAMA, stack="pytorch-eager")
    fp8, bf16 = (simulate(**eager, precision=p).metrics["step_time_s"] for p in ("fp8", "mixed"))
    assert fp8 > bf16


def test_model_states_are_mixed_precisions():
    mixed, fp8 = (simulate(**LLAMA, precision=p).metrics["memory"]["model_states_bytes"]
                  for p in ("mixed", "fp8"))
    assert fp8 == mixed


@pytest.mark.parametrize("gpu", ["A100-80GB", "A100-40GB", "V100"])
def test_a_gpu_without_fp8_tensor_cores_is_refused(gpu):
    with pytest.raises(ScenarioError, match=f"needs FP8 tensor cores, which the {gpu} does not have"):
        simulate(**dict(LLAMA, topology="dgx-a100", gpu=gpu), precision="fp8")


@pytest.mark.parametrize("extra, sentence", [
    ({"fp8_all_gather": True}, "gathers the float8 weights of --precision fp8"),
    ({"precision": "fp8", "fp8_all_gather": True, "strategy": "zero3"}, "zero3 does not gather"),
    ({"precision": "fp8", "efficiency": 0.5}, "drop --efficiency"),
    ({"precision": "fp8", "lora_rank": 16}, "is not modelled"),
])
def test_what_fp8_does_not_model_is_refused(extra, sentence):
    settings = {k: v for k, v in LLAMA.items() if k != "copies" or extra.get("strategy") is None}
    with pytest.raises(ScenarioError, match=sentence):
        simulate(**settings | extra)


def test_the_command_line_says_fp8_was_assumed_and_exits_2_on_an_a100(capsys):
    args = ["simulate", "--model", "llama3-8b", "--gpus", "8", "--micro-batch", "1", "--strategy", "fsdp",
            "--topology", "dgx-h100", "--precision", "fp8", "--fp8-all-gather"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "assumed         fp8: block linear GEMMs on FP8 tensor cores (1,979 TFLOP/s dense" in out
    assert main([*args, "--json"]) == 0
    record = json.loads(capsys.readouterr().out)["fp8"]
    assert record["recipe"] == "tensorwise" and record["fp8_all_gather"] is True
    assert "roofline_utils" in record["source"]
    assert main([*args[:-3], "--topology", "dgx-a100", "--precision", "fp8"]) == 2
    assert "A100-80GB does not have" in capsys.readouterr().err


TORCHTITAN = """
[model]
name = "llama3"
flavor = "8B"
{converters}

[training]
local_batch_size = 2
seq_len = 8192

[parallelism]
data_parallel_shard_degree = -1

{table}
enable_fsdp_float8_all_gather = true
precompute_float8_dynamic_scale_for_fsdp = true
filter_fqns = ["output"]
{extra}
"""


def torchtitan(tmp_path, converters='converters = ["float8"]', table="[float8]", extra=""):
    path = tmp_path / "llama3_8b.toml"
    path.write_text(TORCHTITAN.format(converters=converters, table=table, extra=extra))
    return simulate(torchtitan_config=str(path), gpus=8, topology="dgx-h100")


@pytest.mark.parametrize("converters, table", [
    ('converters = ["float8"]', "[float8]"),  # 2025
    ('converters = ["quantize.linear.float8"]', "[quantize.linear.float8]"),  # from September 2025
    ("", "[float8]\nenable_float8_linear = true"),  # 2024
])
def test_the_torchtitan_reader_turns_float8_into_fp8_with_the_float8_all_gather(tmp_path, converters, table):
    sim = torchtitan(tmp_path, converters, table)
    assert sim.scenario.training.precision == "fp8" and sim.scenario.training.fp8_all_gather is True
    assert sim.metrics["fp8"]["fp8_all_gather"] is True
    assert any(n.startswith("read:") and "--precision fp8" in n for n in sim.metrics["config_notes"])


def test_a_float8_table_no_converter_turns_on_changes_nothing(tmp_path):
    sim = torchtitan(tmp_path, converters="")
    assert sim.scenario.training.precision == "mixed" and sim.metrics["fp8"] is None
    assert any(n.startswith("ignored: [float8]: no converter") for n in sim.metrics["config_notes"])


@pytest.mark.parametrize("extra, sentence", [
    ('recipe_name = "rowwise"', "recipe_name 'rowwise'"),
    ("emulate = true", "emulated in high precision"),
    ('filter_fqns = ["attention.wk", "output"]', "also keeps attention.wk out of float8"),
    ("filter_fqns = []", "the LM head would run in float8"),
    ("precompute_float8_dynamic_scale_for_fsdp = false", "all-reduces each weight's amax"),
])
def test_float8_options_not_modelled_are_refused(tmp_path, extra, sentence):
    # A key written twice is invalid TOML: the refused value replaces the template's line.
    key = extra.split(" =")[0]
    path = tmp_path / "llama3_8b.toml"
    text = TORCHTITAN.format(converters='converters = ["float8"]', table="[float8]", extra="")
    lines = [line for line in text.splitlines() if not line.startswith(key + " =")]
    path.write_text("\n".join(lines) + "\n" + extra + "\n")
    with pytest.raises(ScenarioError, match=sentence):
        simulate(torchtitan_config=str(path), gpus=8, topology="dgx-h100")


def test_the_planner_plans_fp8_and_says_so(capsys):
    args = ["plan", "--model", "llama3-8b", "--gpus", "8", "--topology", "dgx-h100", "--seq-len", "8192",
            "--strategies", "fsdp", "--recompute", "op", "--micro-batch", "1", "--stack", "torch-compile",
            "--top", "40", "--precision", "fp8", "--workers", "1"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "fp8 (block linear GEMMs in float8" in out.splitlines()[0]
    assert "fp8_all_gather" in out  # FSDP candidates are also tried with the float8 all-gather
    assert main([*args[:6], "dgx-a100", *args[7:]]) == 0
    assert "nothing can run: --precision fp8 needs FP8 tensor cores" in capsys.readouterr().out
