"""Software stacks: what a run's software costs, named the way users know it.

A stack fills the settings it bundles unless they are given; the default is what most people
run (eager PyTorch with SDPA); every output says which stack it assumed; eager Python's cost of
issuing kernels makes small micro-batches on fast GPUs host-bound."""

from __future__ import annotations

import json

import pytest

from zero_sim import simulate
from zero_sim.cli import main
from zero_sim.scenario import ScenarioError, resolve
from zero_sim.system.host_costs import block_forward_ops
from zero_sim.system.model_presets import PRESETS
from zero_sim.system.stacks import DEFAULT_STACK, STACKS, get_stack

SMALL_ON_H100 = dict(model="gpt2-124m", strategy="ddp", gpus=8, topology="dgx-h100", steps=2)


def test_the_default_stack_is_eager_pytorch_and_every_output_says_so(capsys):
    assert DEFAULT_STACK == "pytorch-eager"
    result = simulate(**SMALL_ON_H100, micro_batch=4)
    assert result.metrics["stack"] == "pytorch-eager" and result.scenario.training.stack_given is False
    assert result.notes[0].startswith("stack: pytorch-eager (eager PyTorch 2.x")
    assert main(["simulate", "--model", "gpt2-124m", "--topology", "dgx-h100"]) == 0
    assert "· stack pytorch-eager" in capsys.readouterr().out.splitlines()[0]


def test_a_stack_fills_what_it_bundles_and_a_given_setting_wins_with_a_note():
    titan = resolve(strategy="fsdp", stack="torchtitan")
    assert titan.settings.elementwise == "eager"
    assert (titan.knobs.copies, titan.settings.reduce_dtype) == ("fsdp2", "fp32")
    mine = resolve(strategy="fsdp", stack="torchtitan", elementwise="fused", copies="fsdp1")
    assert (mine.settings.elementwise, mine.knobs.copies) == ("fused", "fsdp1")
    assert "overridden: elementwise=fused (stack torchtitan has eager)" in mine.stack_notes
    assert "overridden: copies=fsdp1 (stack torchtitan has fsdp2)" in mine.stack_notes
    # A strategy without the knob is not handed it: DDP has no FSDP copies.
    assert not hasattr(resolve(strategy="ddp", stack="torchtitan").knobs, "copies")


def test_stack_names_are_case_insensitive_and_a_near_miss_is_named():
    assert resolve(stack="TorchTitan").settings.stack == "torchtitan"
    with pytest.raises(ScenarioError, match="unknown stack 'titan'; did you mean 'torchtitan'"):
        resolve(stack="titan")
    assert get_stack("HF-Trainer") is STACKS["hf-trainer"]


def test_an_unknown_stack_on_the_command_line_is_one_sentence_and_status_2(capsys):
    assert main(["simulate", "--stack", "jax"]) == 2
    err = capsys.readouterr().err
    assert "unknown stack 'jax'" in err and "pytorch-eager" in err and "Traceback" not in err


def test_cpu_ranks_take_the_ideal_stack_and_no_eager_host_cost():
    cpu = simulate(model="gpt2-124m", strategy="ddp", gpus=2, topology="cpu-gloo", micro_batch=1)
    assert cpu.metrics["stack"] == "ideal"
    assert not [op for op in cpu.ops if op["name"].startswith("launch ")]
    assert cpu.metrics["prediction_interval"] is None and cpu.metrics["mfu"] is None


def test_an_eager_block_dispatches_more_ops_than_a_fused_one():
    llama, gpt2 = PRESETS["llama3-8b"], PRESETS["gpt2-124m"]
    assert block_forward_ops(llama, "flash", "eager") == 50
    assert block_forward_ops(llama, "flash", "fused") == 22
    # LayerNorm, GELU and learned positions are one kernel each however the code is written.
    assert block_forward_ops(gpt2, "flash", "eager") == block_forward_ops(gpt2, "flash", "fused")


def test_a_small_micro_batch_on_a_fast_gpu_is_host_bound():
    """The host's launches take longer than the kernels they launch: the GPU waits for Python."""
    def step(micro_batch, stack):
        # GPT-2's gelu_new chain (eager-hf) would add GPU work of its own: host costs alone here.
        return simulate(**SMALL_ON_H100, micro_batch=micro_batch, stack=stack,
                        elementwise="fused").metrics["step_time_s"]

    assert step(1, "hf-trainer") > 1.15 * step(1, "ideal")
    # At a large micro-batch the kernels outlast their launches and the host hides behind them.
    assert step(16, "hf-trainer") < 1.03 * step(16, "ideal")


def test_the_host_lane_shows_each_layers_launches():
    result = simulate(**SMALL_ON_H100, micro_batch=1, stack="pytorch-eager")
    launches = [op for op in result.step_ops(0) if op["name"].startswith("launch ")]
    block = next(op for op in launches if op["name"] == "launch fwd L1")
    ops = block_forward_ops(PRESETS["gpt2-124m"], "flash", "eager")
    assert block["stream"] == "host" and block["end_s"] - block["start_s"] == pytest.approx(ops * 10e-6)
    assert {op["phase"] for op in launches} >= {"forward", "backward"}


def test_the_training_loop_ends_each_step_with_host_work_and_a_sync():
    result = simulate(**SMALL_ON_H100, micro_batch=4, stack="hf-trainer")
    names = [op["name"] for op in result.step_ops(0) if op["stream"] == "host"]
    assert "training loop" in names
    loop = next(op for op in result.step_ops(0) if op["name"] == "training loop")
    assert loop["end_s"] - loop["start_s"] == pytest.approx(3e-3)
    assert simulate(**SMALL_ON_H100, micro_batch=4, stack="hf-trainer", step_host_ms=0).metrics[
        "step_time_s"] <= result.metrics["step_time_s"]


def test_a_torchtitan_config_implies_its_stack_and_compile_fuses(tmp_path):
    path = tmp_path / "titan.toml"
    path.write_text('[model]\nname = "llama3"\nflavor = "8B"\n[training]\nseq_len = 2048\n')
    plain = simulate(torchtitan_config=path, gpus=8, topology="dgx-h100")
    assert plain.metrics["stack"] == "torchtitan" and plain.scenario.training.stack_given
    path.write_text(path.read_text() + "[compile]\nenable = true\n")
    compiled = simulate(torchtitan_config=path, gpus=8, topology="dgx-h100").scenario
    assert (compiled.workload.elementwise, compiled.hardware.kernel_host_us) == ("fused", 5.0)


def test_every_stack_names_a_source_for_each_choice():
    for stack in STACKS.values():
        if stack.name == "ideal":
            continue
        unsourced = {"attention", "elementwise", "kernel_host_us", "step_host_ms"} - set(stack.sources)
        assert not unsourced, f"{stack.name} does not say where {unsourced} come from"


def test_the_stacks_command_lists_each_with_the_default_marked(capsys):
    from zero_sim.cli import main as cli

    assert cli(["stacks"]) == 0
    out = capsys.readouterr().out
    assert "pytorch-eager (default):" in out and all(f"{name}" in out for name in STACKS)


def test_json_states_the_stack(capsys):
    assert main(["simulate", "--stack", "torch-compile", "--json"]) == 0
    metrics = json.loads(capsys.readouterr().out)
    assert metrics["stack"] == "torch-compile"
