"""How a step's time is divided into phases: forward, backward and the optimizer's tail.

Under gradient accumulation a step runs forward and backward once per micro-step; each
micro-step's forward is forward time, wherever in the step it runs.
"""

from __future__ import annotations

import pytest

from zero_sim import simulate
from zero_sim.breakdown import step_breakdown


def test_one_micro_step_splits_at_the_first_and_last_backward_op():
    compute = [(0.0, 1.0), (1.0, 3.0), (3.5, 4.0)]
    parts = step_breakdown(compute, [], backward=[(1.0, 3.0)], lo=0.0, hi=4.0, forward=[(0.0, 1.0)])
    assert (parts["forward_s"], parts["backward_s"], parts["optimizer_s"]) == (1.0, 2.0, 1.0)


def test_each_micro_steps_forward_counts_as_forward():
    forward, backward = [(0.0, 1.0), (3.0, 4.0)], [(1.0, 3.0), (4.0, 6.0)]
    parts = step_breakdown(forward + backward, [], backward=backward, lo=0.0, hi=7.0, forward=forward)
    assert (parts["forward_s"], parts["backward_s"], parts["optimizer_s"]) == (2.0, 4.0, 1.0)
    assert parts["forward_s"] + parts["backward_s"] + parts["optimizer_s"] == parts["step_time_s"]


def test_an_idle_gap_belongs_to_the_phase_of_the_op_before_it():
    forward, backward = [(0.0, 1.0), (3.5, 4.0)], [(1.0, 3.0), (4.0, 5.0)]
    parts = step_breakdown(forward + backward, [], backward=backward, lo=0.0, hi=5.0, forward=forward)
    assert parts["forward_s"] == 1.5 and parts["backward_s"] == 3.5  # 3.0-3.5 waits after a backward op


@pytest.mark.parametrize("accum", [4, 16])
def test_accumulating_gradients_keeps_the_backward_to_forward_ratio(accum):
    one, many = (simulate(model="gpt2-124m", strategy="fsdp", gpus=8, topology="dgx-h100", seq_len=512,
                          micro_batch=4, grad_accum=k).metrics["phases"] for k in (1, accum))
    ratio_one = one["backward_s"] / one["forward_s"]
    assert 1.3 < ratio_one < 3
    assert many["backward_s"] / many["forward_s"] == pytest.approx(ratio_one, rel=0.2)
    assert many["forward_s"] == pytest.approx(accum * one["forward_s"], rel=0.2)
