"""How Adam's update runs: one multi-tensor pass over the states, or a Python loop that launches
each parameter tensor's update as separate kernels (transformers' own AdamW, the Trainer's default
optimizer in 2020-22).  The loop moves more bytes and keeps the host launching."""

from __future__ import annotations

import pytest

from zero_sim import simulate
from zero_sim.cli import main
from zero_sim.scenario import resolve
from zero_sim.system.hardware import ADAM_BYTES_PER_PARAM
from zero_sim.system.optimizer_kernels import OPTIMIZER_KERNELS

# transformers v4.12 AdamW.step, per element of a parameter, fp32: (bytes read, bytes written).
HF_ADAMW_LOOP = {"exp_avg.mul_(beta1)": (4, 4), "exp_avg.add_(grad)": (8, 4),
                 "exp_avg_sq.mul_(beta2)": (4, 4), "exp_avg_sq.addcmul_(grad, grad)": (12, 4),
                 "exp_avg_sq.sqrt()": (4, 4), "denom.add_(eps)": (4, 4),
                 "p.addcdiv_(exp_avg, denom)": (12, 4)}
GPT2 = dict(model="gpt2-124m", strategy="ddp", gpus=2, micro_batch=1, steps=1)


def updates(result, stream: str) -> dict[str, float]:
    return {op["name"]: op["end_s"] - op["start_s"] for op in result.step_ops(0)
            if op["stream"] == stream and op["name"].startswith(("opt L", "launch opt L"))}


def test_the_loop_is_counted_kernel_by_kernel():
    loop = OPTIMIZER_KERNELS["per-param"]
    assert loop.bytes_per_param == sum(r + w for r, w in HF_ADAMW_LOOP.values()) == 76
    assert loop.kernels_per_tensor == len(HF_ADAMW_LOOP) == 7
    assert OPTIMIZER_KERNELS["fused"].bytes_per_param == ADAM_BYTES_PER_PARAM == 28


def test_a_per_parameter_loop_moves_more_bytes_and_keeps_the_host_launching():
    fused = simulate(**GPT2, stack="hf-trainer-2021", optimizer_impl="fused")
    loop = simulate(**GPT2, stack="hf-trainer-2021")  # the stack's: transformers' AdamW
    assert "Adam as a per-parameter loop (7 kernels a tensor, 76 B of traffic a parameter)" in \
        loop.metrics["precision"]
    gpu_fused, gpu_loop = updates(fused, "compute"), updates(loop, "compute")
    for name, seconds in gpu_fused.items():
        assert gpu_loop[name] == pytest.approx(seconds * 76 / 28, rel=1e-9)
    # A GPT-2 block holds 12 tensors (two norms' weight and bias, four projections' weight and
    # bias): 84 launches at the stack's 12 us each.
    assert updates(loop, "host")["launch opt L1"] == pytest.approx(12 * 7 * 12e-6, rel=1e-9)
    assert "launch opt L1" not in updates(fused, "host")
    assert loop.metrics["step_time_s"] > fused.metrics["step_time_s"]


def test_the_stack_fills_it_only_where_the_trainer_runs_its_own_optimizer():
    assert resolve(stack="hf-trainer-2021", strategy="ddp").settings.optimizer_impl == "per-param"
    # A DeepSpeed engine runs its own FusedAdam, whatever the trainer around it.
    assert resolve(stack="hf-trainer-2021", strategy="zero1").settings.optimizer_impl is None
    assert resolve(stack="hf-trainer", strategy="ddp").settings.optimizer_impl is None


def test_a_bad_value_on_the_command_line_exits_with_status_2(capsys):
    assert main(["simulate", "--optimizer-impl", "loop"]) == 2
    err = capsys.readouterr().err.strip()
    assert "invalid choice: 'loop'" in err and "Traceback" not in err and len(err.splitlines()) == 1
