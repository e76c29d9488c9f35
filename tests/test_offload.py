"""Offloading: model states in host memory, the update on the CPU, and copies over each GPU's host link."""

import json

import pytest

from zero_sim import simulate
from zero_sim.cli import main
from zero_sim.configs.deepspeed import read_deepspeed
from zero_sim.configs.fsdp import read_fsdp
from zero_sim.plan.fit_advice import fit_advice
from zero_sim.scenario import ScenarioError
from zero_sim.system.host_side import CPU_ADAM_RATE, HOSTS, TORCH_CPU_ADAM_RATE, host_for
from zero_sim.system.model_presets import preset

LLAMA = dict(model="llama2-7b", gpus=8, topology="dgx-a100", micro_batch=1)
PSI = preset("llama2-7b", 1).params


def run(strategy: str, **extra):
    return simulate(strategy=strategy, **LLAMA, **extra)


def ops_named(result, prefix: str) -> list[dict]:
    step = result.metrics["reported_step"]
    return [op for op in result.ops
            if op["rank"] == 0 and op["step"] == step and op["name"].startswith(prefix)]


def test_zero_offload_moves_the_optimizer_state_and_gradient_slice_to_the_host():
    kept, offloaded = run("zero2").metrics["memory"], run("zero2", offload_optimizer="cpu").metrics["memory"]
    # On the GPU only the bf16 weights stay (stage 2 keeps no gradient slice once it is copied down).
    assert offloaded["model_states_bytes"] == pytest.approx(2 * PSI, rel=0.01)
    assert offloaded["reserved_peak_bytes"] < kept["reserved_peak_bytes"] - 10e9
    # On the host: Adam's 12 bytes and an fp32 gradient per parameter of the rank's slice, for 8 ranks.
    assert offloaded["host_bytes_per_rank"] == pytest.approx((12 + 4) * PSI / 8, rel=0.01)
    assert offloaded["host_bytes_per_node"] == 8 * offloaded["host_bytes_per_rank"]


def test_the_cpu_updates_the_ranks_slice_at_the_published_rate_on_its_share_of_the_cores():
    m = run("zero2", offload_optimizer="cpu").metrics
    cores = HOSTS["dgx-a100"].cores / 8  # DeepSpeed binds each rank to its share of the node's cores
    assert m["cpu_update_s"] == pytest.approx(PSI / 8 / (CPU_ADAM_RATE * 1e6 * cores), rel=0.01)
    # The GPU idles meanwhile: the step grows by about the update, which replaces the GPU's.
    assert m["step_time_s"] > run("zero2").metrics["step_time_s"] + 0.9 * m["cpu_update_s"]
    faster = run("zero2", offload_optimizer="cpu", cpu_adam_rate=2 * CPU_ADAM_RATE).metrics
    assert faster["cpu_update_s"] == pytest.approx(m["cpu_update_s"] / 2, rel=0.01)


def test_gradients_go_down_during_backward_and_each_updated_slice_comes_up_before_its_gather():
    r = run("zero2", offload_optimizer="cpu")
    down, up = ops_named(r, "d2h"), ops_named(r, "h2d")
    backward_end = max(op["end_s"] for op in ops_named(r, "bwd"))
    cpu = ops_named(r, "cpu_adam")[0]
    assert down and min(op["start_s"] for op in down) < backward_end  # overlapped with backward
    assert all(op["end_s"] <= cpu["start_s"] + 1e-9 for op in down)  # the update waits for every copy
    gathers = {op["name"].split()[-1]: op for op in ops_named(r, "all_gather")}
    assert len(up) == len(gathers)
    for op in up:
        assert op["start_s"] >= cpu["end_s"] - 1e-9
        assert gathers[op["name"].split()[-1]]["start_s"] >= op["end_s"] - 1e-9


def test_two_gpus_behind_one_pcie_switch_share_its_uplink():
    # DGX A100: two GPUs per PCIe switch, 25 GB/s each way.  Alone a GPU copies at 25 GB/s; with its
    # neighbour copying too, at half of it; simulating every rank shows the same as the collapsed rank.
    for gpus, share in ((1, 1.0), (8, 0.5)):
        for explicit in (False, True):
            r = simulate(strategy="zero2", offload_optimizer="cpu", model="llama2-7b", layers=2, gpus=gpus,
                         topology="dgx-a100", micro_batch=1, explicit_ranks=explicit)
            op = ops_named(r, "h2d")[0]
            rate = op["bytes"] / (op["end_s"] - op["start_s"])
            assert rate == pytest.approx(25e9 * share, rel=0.01), (gpus, explicit)


def test_offloaded_weights_come_up_before_every_gather_and_leave_the_gpu():
    r = run("zero3", offload_optimizer="cpu", offload_params="cpu")
    mem = r.metrics["memory"]
    assert mem["model_states_bytes"] < 0.01 * 2 * PSI  # only the small persistent tensors stay
    gathers, ups = ops_named(r, "all_gather"), ops_named(r, "h2d")
    assert len(ups) == len(gathers)
    assert sum(op["bytes"] for op in ups) * 8 == pytest.approx(sum(op["bytes"] for op in gathers), rel=0.01)
    # With the weights on the host the update writes them there: nothing comes up after the step.
    cpu = ops_named(r, "cpu_adam")[0]
    assert all(op["start_s"] < cpu["start_s"] for op in ups)
    # The host holds the fp16 partition besides the optimizer: 2 + 4 + 12 bytes per parameter.
    assert mem["host_bytes_per_rank"] == pytest.approx(18 * PSI / 8, rel=0.01)


def test_fsdp2_cpu_offload_policy_copies_fp32_shards_and_updates_with_torch_adam():
    r = run("fsdp", offload_params="cpu")
    gathers, ups = ops_named(r, "all_gather"), ops_named(r, "h2d")
    # The fp32 shard (4 bytes) comes up and is cast to the 2-byte gather.
    gathered = sum(op["bytes"] for op in gathers)
    assert sum(op["bytes"] for op in ups) * 8 == pytest.approx(2 * gathered, rel=0.01)
    cores = HOSTS["dgx-a100"].cores / 8
    assert r.metrics["cpu_update_s"] == pytest.approx(PSI / 8 / (TORCH_CPU_ADAM_RATE * 1e6 * cores), rel=0.02)
    assert "torch.optim.AdamW" in r.metrics["offload"]


def test_states_too_big_for_the_nodes_ram_do_not_fit_and_more_ram_does():
    big = dict(model="llama2-70b", gpus=8, topology="dgx-a100", micro_batch=1, strategy="zero3",
               offload_optimizer="cpu", offload_params="cpu", recompute="full", steps=1)
    mem = simulate(**big).metrics["memory"]
    # 18 bytes per parameter in host memory: 1.24 TB for Llama-2-70B, beyond a DGX A100's 1 TB.
    assert mem["host_bytes_per_node"] == pytest.approx(18 * preset("llama2-70b", 1).params, rel=0.01)
    assert mem["host_fits"] is False and mem["fits"] is False
    assert simulate(**big, host_memory_gb=2048).metrics["memory"]["host_fits"] is True


def test_the_interval_widens_by_the_cpu_updates_assumed_spread():
    plain, offloaded = run("zero2").metrics, run("zero2", offload_optimizer="cpu").metrics
    low, high = offloaded["step_time_s_interval"]
    cpu = offloaded["cpu_update_s"]
    assert low <= offloaded["step_time_s"] - cpu / 2 + 0.1 and high >= offloaded["step_time_s"] + cpu * 0.9
    p_low, p_high = plain["step_time_s_interval"]
    assert (high - low) / offloaded["step_time_s"] > (p_high - p_low) / plain["step_time_s"]


@pytest.mark.parametrize("settings, words", [
    (dict(strategy="ddp", offload_optimizer="cpu"), "DDP replicates"),
    (dict(strategy="zero2", offload_optimizer="cpu", offload_params="cpu"), "cannot be offloaded"),
    (dict(strategy="zero3", offload_params="cpu"), "weights alone"),
    (dict(strategy="fsdp", offload_optimizer="cpu"), "CPUOffloadPolicy"),
    (dict(strategy="zero2", offload_optimizer="nvme"), "NVMe is DeepSpeed ZeRO-Infinity's"),
    (dict(strategy="zero3", host_cores=64), "nothing is offloaded"),
    (dict(strategy="zero3", offload_optimizer="cpu", zero_quantized_weights=True), "ZeRO++"),
    (dict(strategy="fsdp", offload_params="cpu", precision="fp8", fp8_all_gather=True, topology="dgx-h100"),
     "float8 all-gather"),
])
def test_what_the_libraries_cannot_offload_is_refused_in_one_sentence(settings, words):
    with pytest.raises(ScenarioError, match=words) as err:
        simulate(**(LLAMA | settings))
    assert str(err.value).count(". ") == 0


def test_cpu_ranks_have_nothing_to_offload():
    with pytest.raises(ScenarioError, match="already keep their states in host memory"):
        simulate(model="gpt2-124m", gpus=2, topology="cpu-gloo", strategy="zero2", offload_optimizer="cpu")


def test_a_topology_without_host_figures_needs_them_given():
    assert host_for("imported", 8) is None
    given = host_for("imported", 8, memory_gb=512, cores=64, link_gbps=20)
    assert (given.memory_gb, given.cores, given.d2h_gbps, given.h2d_gbps) == (512, 64, 20, 20)
    # The preset's figures give way to what the user says, one by one.
    assert host_for("dgx-h100", 8, cores=56).cores == 56 and host_for("dgx-h100", 8).cores == 112


def test_deepspeed_offload_keys_become_the_offload_settings(tmp_path):
    config = {"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True},
              "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": True},
                                    "offload_param": {"device": "cpu", "pin_memory": True}}}
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(config))
    settings = read_deepspeed(path).settings
    assert settings["offload_optimizer"] == "cpu" and settings["offload_params"] == "cpu"
    legacy = {"zero_optimization": {"stage": 2, "cpu_offload": True}}
    path.write_text(json.dumps(legacy))
    assert read_deepspeed(path).settings["offload_optimizer"] == "cpu"
    partial = {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "ratio": 0.3}}}
    path.write_text(json.dumps(partial))
    with pytest.raises(ValueError, match="twin flow"):
        read_deepspeed(path)


def test_fsdp2_cpu_offload_policy_in_a_fully_shard_file(tmp_path):
    path = tmp_path / "fsdp.json"
    path.write_text(json.dumps({"offload_policy": {"type": "CPUOffloadPolicy", "pin_memory": True}}))
    assert read_fsdp(path).settings["offload_params"] == "cpu"
    path.write_text(json.dumps({"offload_policy": "OffloadPolicy"}))
    assert "offload_params" not in read_fsdp(path).settings


def test_a_model_too_big_for_one_gpu_is_told_that_zero_offload_fits_it():
    """On its one GPU only offloading fits; the advice says so beside what more GPUs would do."""
    too_big = dict(model="llama2-13b", gpus=1, topology="dgx-a100", micro_batch=1, strategy="ddp")
    on_one = [a for a in fit_advice(too_big) if "gpus" not in a["settings"]]
    assert on_one and all(a["settings"]["offload_optimizer"] == "cpu" and a["spare_gb"] > 0 for a in on_one)


def test_the_summary_says_where_the_states_went_and_what_updated_them(capsys):
    args = ["simulate", "--model", "llama2-7b", "--gpus", "8", "--topology", "dgx-a100", "--micro-batch", "1",
            "--strategy", "zero3", "--offload-optimizer", "cpu"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "updating on the CPU" in out and "DeepSpeed's CPU Adam" in out
    assert "host memory     13.48 GB per rank, 107.8 GB per node of 1,024 GB RAM" in out
    assert main(args[:-2] + ["--offload-params", "cpu"]) == 2
    assert "offload the optimizer with them" in capsys.readouterr().err
