"""One simulated rank standing for every rank: where the simulator does it, and that nothing changes.

At eight GPUs or fewer the simulator simulates every rank unless their timelines are bound to be
rank 0's (zero_sim.scenario.symmetry); then it simulates rank 0 alone, which is up to eight times
fewer events.  These tests pin where each happens and that the figures are every rank's."""

from __future__ import annotations

import pytest

from zero_sim import simulate

ALIKE = [
    # The optimizer offloaded on a DGX A100: two GPUs behind each PCIe switch share its uplink.
    dict(model="gpt2-350m", strategy="zero2", topology="dgx-a100", gpus=8, offload_optimizer="cpu"),
    dict(model="gpt2-350m", strategy="zero3", topology="dgx-a100", gpus=8, offload_optimizer="cpu",
         offload_params="cpu", grad_accum=2),
    dict(model="gpt2-124m", strategy="fsdp", topology="pcie", gpus=4, micro_batch=2),
    dict(model="gpt2-124m", strategy="ddp", topology="pcie-host-bridge", gpus=8, recompute="full"),
    dict(model="gpt2-124m", strategy="zero3", topology="dgx-h100", gpus=8, zero_quantized_weights=True),
]


def _figures(result) -> dict:
    m = result.metrics
    return {"step": m["step_time_s"], "tokens": m["tokens_per_s"], "memory": m["memory"],
            "interval": m["tokens_per_s_interval"], "phases": m["phases"], "exposed": m["exposed_comm_s"]}


@pytest.mark.parametrize("scenario", ALIKE, ids=lambda s: f"{s['strategy']}-{s['topology']}")
def test_ranks_alike_are_simulated_as_one_with_every_ranks_figures(scenario):
    one = simulate(**scenario)
    every = simulate(**scenario, explicit_ranks=True)
    assert one.simulated_ranks == [0] and every.simulated_ranks == list(range(scenario["gpus"]))
    assert one.events * 2 < every.events  # the point of it
    assert _figures(one) == _figures(every)


DIFFERING = [
    # Three GPUs on a DGX A100 with copies to the host: the third is alone behind its PCIe switch.
    dict(gpus=3, offload_optimizer="cpu"),
    dict(straggler_prob=0.1, straggler_ms=5.0),  # each rank draws its own stalls
    dict(backend="gloo"),  # gloo's worker threads are modelled per rank
    dict(explicit_ranks=True),  # asked for
]


@pytest.mark.parametrize("differing", DIFFERING, ids=lambda d: next(iter(d)))
def test_ranks_that_may_differ_are_each_simulated(differing):
    scenario = dict(model="gpt2-124m", topology="dgx-a100", gpus=8, strategy="zero2") | differing
    assert simulate(**scenario).simulated_ranks == list(range(scenario["gpus"]))


def test_above_eight_gpus_one_rank_stands_for_all_unless_asked():
    scenario = dict(model="gpt2-124m", topology="dgx-a100", gpus=16, strategy="ddp",
                    straggler_prob=0.1, straggler_ms=5.0)
    assert simulate(**scenario).simulated_ranks == [0]
    assert simulate(**scenario, explicit_ranks=True).simulated_ranks == list(range(16))
