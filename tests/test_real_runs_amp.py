"""Real runs under AMP (``--precision amp``), as Hugging Face Trainer and Lightning train: fp32
weights, the forward under ``torch.autocast`` in bf16, fp32 gradients reduced in fp32 and Adam
on the weights themselves.  Sharing the work over ranks on gloo lands where one process lands.
"""

from __future__ import annotations

import pytest
import torch
from real_runs_helpers import load_state, max_rel_err, real_run, reference_for

from real_runs.strategies import STRATEGIES
from zero_sim.vocabulary.model_states import model_state_bytes

pytestmark = pytest.mark.slow


def test_one_rank_under_amp_trains_exactly_as_torch_amps_recipe():
    # An fp32 model, its forward under autocast, torch's AdamW on the fp32 weights: bit for bit.
    run, out = real_run("ddp", 1, precision="amp")
    ref, state = reference_for(run), load_state(out)
    assert (run["precision"], run["dtype"]) == ("amp", "float32")
    for part in ("params", "exp_avg", "exp_avg_sq"):
        assert max_rel_err(state[part], ref[part]) == 0
    assert all(t.dtype == torch.float32 for t in state["params"].values())


@pytest.mark.parametrize("strategy", ["ddp", "zero1", "fsdp"])
def test_two_ranks_under_amp_hold_4_4_8_bytes_and_land_where_one_process_does(strategy):
    run, out = real_run(strategy, 2, precision="amp")
    # fp32 weights and gradients, Adam's two fp32 moments and no master: fp32's bytes.
    expected = model_state_bytes(STRATEGIES[strategy].stage, run["params"], 2, 4, 4, 8)
    for per_rank in run["memory"].values():
        assert {k: per_rank[k] for k in expected} == expected
    # Each rank's weight gradients are rounded to bf16 on its own half of the batch before the fp32
    # sum, where one process rounds the whole batch's: the same training within that rounding, and
    # nearer it than the fp32 run (autocast's bf16 matmuls are in the result).
    params = load_state(out)["params"]
    amp, fp32 = reference_for(run)["params"], reference_for({**run, "precision": "fp32"})["params"]
    assert max_rel_err(params, amp) < 2e-3
    assert max_rel_err(params, amp) < max_rel_err(params, fp32)
    # Every strategy sums the same fp32 gradients and updates the same weights: DDP's bits.
    ddp = load_state(real_run("ddp", 2, precision="amp")[1])["params"]
    assert all(torch.equal(params[k], ddp[k]) for k in ddp)
