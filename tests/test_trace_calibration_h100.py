"""Calibrating from traces of this project's own runs on one GPU, replaying them, and predicting others.

The runs (tests/data/h100_gpt2_124m_ddp and h200_gpt2_350m_ddp, READMEs there): DDP, bf16, 8 x 1024
tokens, each also run untraced. The H100 run's layers were also timed alone with CUDA events, which
bound what the trace may say from above; the H200 run was also run untraced at batch 4 and 16.
"""

import json
from pathlib import Path

import pytest

from sim2real.cli import main as zero_sim
from zero_sim.calibration import Calibration
from zero_sim.calibration.from_traces import calibration_from_traces

RUN = Path(__file__).parent / "data" / "h100_gpt2_124m_ddp"
H200_RUN = Path(__file__).parent / "data" / "h200_gpt2_350m_ddp"
TRACES = RUN / "traced" / "traces"
H100_BF16_PEAK_FLOPS = 989e12  # dense bf16, the H100 SXM datasheet
BLOCK_PARAMS = 768 * 3 * 768 + 768 * 768 + 2 * 768 * 3072  # gpt2-124m's block matrices (biases aside)


@pytest.fixture(scope="module")
def findings():
    return calibration_from_traces([TRACES])


@pytest.fixture(scope="module")
def cuda_events():
    return json.loads((RUN / "layers_cuda_events.json").read_text())["by_kind"]


def test_the_gpu_and_the_tokens_come_from_the_trace_and_its_run(findings):
    assert findings.gpu == "H100"
    assert findings.calibration.compute.tokens == 8 * 1024


def test_hoppers_gemms_launched_by_the_driver_still_count_in_their_layer(findings, cuda_events):
    # cuBLAS launches its Hopper GEMMs with cuLaunchKernelEx (the driver), not cudaLaunchKernel; a
    # block's forward kernels then take at least its matrix products' FLOPs at the GPU's peak, and
    # at most the layer's time alone on the GPU (CUDA events around it).
    block_ms = findings.layer_ms["block"]["fwd"]
    assert 2 * 8192 * BLOCK_PARAMS / H100_BF16_PEAK_FLOPS * 1e3 < block_ms < cuda_events["block"]["fwd"] * 1e3
    assert findings.kernel_mix_ms["GEMM and convolution"] > 0.25 * sum(findings.kernel_mix_ms.values())


def test_backward_kernels_launched_from_autograds_thread_are_backward(findings):
    # No user annotation encloses autograd's own thread; its evaluate_function ops mark it.
    phases = findings.phases_ms
    assert phases["backward"] > phases["forward"] > phases["optimizer"] > 0
    assert phases.get("other", 0.0) < 0.02 * sum(phases.values())


def test_the_hosts_time_to_issue_each_layer_is_kept_apart_from_its_kernels(findings, tmp_path):
    # Small blocks on an H100 are host-bound: the host takes longer to issue a block than the GPU
    # to run it. The head (a large matrix product and the fp32 loss) is GPU-bound.
    host, gpu = findings.host_layer_ms, findings.layer_ms
    assert host["block"]["fwd"] > gpu["block"]["fwd"]
    assert host["head"]["fwd"] < gpu["head"]["fwd"]
    compute = findings.calibration.compute
    assert compute.host_seconds["block"]["fwd"] == pytest.approx(host["block"]["fwd"] * 1e-3)
    # The update: a per-parameter loop, so its host part outweighs its kernels.
    assert compute.optimizer_host_seconds_per_param > compute.optimizer_seconds_per_param > 0
    findings.calibration.save(tmp_path / "cal.json")
    assert Calibration.load(tmp_path / "cal.json").compute == compute


def test_one_gpu_communicates_nothing_and_the_report_says_so(findings):
    assert findings.calibration.collectives == {}
    assert any("no NCCL kernel ran" in why for why in findings.not_found)


def test_the_traced_run_replays_from_its_own_trace(capsys, figures):
    assert zero_sim(["validate", "--trace", str(RUN / "traced"), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    phases = {row["phase"]: row for row in result["phases"]}
    figures(*(f"{name}: predicted {row['predicted_s'] * 1e3:.2f} ms, "
              f"measured {row['measured_s'] * 1e3:.2f} ms"
              for name, row in phases.items() if name in ("step time", "forward", "backward", "optimizer")))
    assert abs(result["summary"]["step_error"]) < 0.15
    for phase in ("forward", "backward", "optimizer"):
        row = phases[phase]
        assert row["predicted_s"] == pytest.approx(row["measured_s"], rel=0.2), phase


def measured_step_s(run_dir: Path) -> float:
    return json.loads((run_dir / "run.json").read_text())["median_step_s"]


def test_the_profilers_own_host_cost_comes_out_given_the_untraced_step():
    # Traced, the host-bound step took 88 ms; the same run's log said 57 ms without the profiler.
    untraced = measured_step_s(RUN / "untraced") * 1e3
    plain = calibration_from_traces([TRACES]).calibration.compute
    cleared = calibration_from_traces([TRACES], untraced_step_ms=untraced)
    kept = cleared.calibration.compute.host_seconds["block"]["fwd"] / plain.host_seconds["block"]["fwd"]
    assert 0.3 < kept < 1.0
    assert cleared.calibration.compute.layer_seconds == plain.layer_seconds  # kernels are the GPU's
    assert "profiler's own cost taken out" in cleared.report()


def test_a_trace_at_one_batch_predicts_the_untraced_run_at_others_closer_than_the_presets(figures):
    from sim2real.replay import predict_run

    untraced_b8 = measured_step_s(H200_RUN / "untraced_b8") * 1e3
    calibration = calibration_from_traces([H200_RUN / "traced" / "traces"],
                                          untraced_step_ms=untraced_b8).calibration
    lines = []
    for batch in (4, 8, 16):
        run = json.loads((H200_RUN / f"untraced_b{batch}" / "run.json").read_text())
        measured = run["median_step_s"]
        from_trace = predict_run(run, calibration).metrics["step_time_s"] / measured - 1
        preset = predict_run(run).metrics["step_time_s"] / measured - 1
        lines.append(f"gpt2-350m on an H200, batch {batch}: from the batch-8 trace {from_trace:+.0%}, "
                     f"from presets {preset:+.0%} (measured {measured * 1e3:.1f} ms)")
        assert abs(from_trace) < 0.35 and abs(from_trace) < abs(preset)
    figures(*lines)
