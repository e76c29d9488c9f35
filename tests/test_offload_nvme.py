"""NVMe offload (DeepSpeed ZeRO-Infinity): ZeRO-3's states on the node's drives, swapped through
host memory around the update and the gathers, at the node's measured NVMe rates."""

import pytest

from zero_sim import simulate
from zero_sim.scenario import ScenarioError
from zero_sim.strategies.nvme import NVME
from zero_sim.system.model_presets import preset

BIG = dict(model="llama2-70b", gpus=8, topology="dgx-a100", micro_batch=1, strategy="zero3",
           recompute="full", steps=1)
SMALL = dict(model="gpt2-1.5b", gpus=8, topology="dgx-a100", micro_batch=4, strategy="zero3", steps=2)


def swaps(result, prefix: str) -> list[dict]:
    step = result.metrics["reported_step"]
    return [op for op in result.ops
            if op["rank"] == 0 and op["step"] == step and op["name"].startswith(prefix)]


def test_states_too_big_for_the_nodes_ram_fit_on_its_drives():
    # Llama-2-70B's 18 bytes a parameter outgrow a DGX A100's 1 TB of RAM when offloaded to the CPU...
    in_ram = simulate(**BIG, offload_optimizer="cpu", offload_params="cpu").metrics["memory"]
    assert in_ram["host_fits"] is False and in_ram["fits"] is False
    # ...and fit once the optimizer state, its gradients and the weights live on NVMe instead.
    on_nvme = simulate(**BIG, offload_optimizer="nvme", offload_params="nvme").metrics["memory"]
    assert on_nvme["fits"] is True and on_nvme.get("host_bytes_per_node", 0) == 0
    assert on_nvme["nvme_bytes_per_node"] == pytest.approx(in_ram["host_bytes_per_node"], rel=1e-6)
    assert on_nvme["nvme_bytes_per_node"] == pytest.approx(18 * preset("llama2-70b", 1).params, rel=0.01)


def test_the_optimizer_on_nvme_leaves_the_weights_copy_in_ram():
    mem = simulate(**SMALL, offload_optimizer="nvme", offload_params="cpu").metrics["memory"]
    psi = preset("gpt2-1.5b", 1).params
    assert mem["nvme_bytes_per_rank"] == pytest.approx((12 + 4) * psi / 8, rel=0.01)
    assert mem["host_bytes_per_rank"] == pytest.approx(2 * psi / 8, rel=0.01)


def test_the_update_waits_for_the_state_to_be_read_and_is_followed_by_its_write():
    r = simulate(**SMALL, offload_optimizer="nvme")
    read, cpu, write = swaps(r, "nvme_read")[0], swaps(r, "cpu_adam")[0], swaps(r, "nvme_write")[0]
    assert read["end_s"] <= cpu["start_s"] + 1e-9 and cpu["end_s"] <= write["start_s"] + 1e-9
    # The node's drives serve its 8 ranks together: each reads (K + 4) bytes a parameter of its slice
    # at an eighth of the node's rate.
    psi, nvme = preset("gpt2-1.5b", 1).params, NVME["dgx-a100"]
    expected = 16 * psi / 8 / (nvme.read_gbps * 1e9 / 8)
    assert read["end_s"] - read["start_s"] == pytest.approx(expected, rel=0.01)
    assert r.metrics["nvme_swap_s"] == pytest.approx(sum(op["end_s"] - op["start_s"]
                                                         for op in swaps(r, "nvme_")), rel=1e-9)


def test_nvme_is_slower_than_host_memory_where_the_drives_are_the_bottleneck():
    cpu = simulate(**SMALL, offload_optimizer="cpu").metrics
    nvme = simulate(**SMALL, offload_optimizer="nvme").metrics
    assert nvme["step_time_s"] > cpu["step_time_s"] + 0.9 * nvme["nvme_swap_s"]
    # Faster drives (8 Gen5 SSDs on an H100 node) swap the same bytes sooner.
    assert NVME["dgx-h100"].read_gbps > NVME["dgx-a100"].read_gbps


def test_weights_on_nvme_are_read_before_each_gather_copies_them_up():
    r = simulate(**SMALL, offload_optimizer="nvme", offload_params="nvme")
    reads = [op for op in swaps(r, "nvme_read") if op["name"] != "nvme_read optimizer"]
    ups = swaps(r, "h2d")
    assert reads and len(reads) == len(ups)
    assert all(read["end_s"] <= up["start_s"] + 1e-9 for read, up in zip(reads, ups, strict=True))


@pytest.mark.parametrize("settings, words", [
    (dict(strategy="zero2", offload_optimizer="nvme"), "swaps states only in stage 3; zero2 cannot"),
    (dict(strategy="fsdp", offload_params="nvme"), "swaps states only in stage 3; fsdp cannot"),
    (dict(offload_params="nvme"), "weights alone"),
    (dict(offload_optimizer="nvme", topology="gb200-nvl72", gpus=72), "states no NVMe read and write rates"),
])
def test_what_nvme_offload_cannot_do_is_refused_in_one_sentence(settings, words):
    with pytest.raises(ScenarioError, match=words) as err:
        simulate(**(SMALL | settings))
    assert str(err.value).count(". ") == 0


def test_every_preset_rate_states_its_source():
    assert all(n.read_gbps > n.write_gbps > 0 and "DeepNVMe" in n.source for n in NVME.values())
