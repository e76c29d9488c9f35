"""Real multi-process runs on gloo: every strategy trains the same model as one process
would, holds the bytes the ZeRO formulas promise, and leaves records with the shape its
communication schedule predicts.

Each (strategy, ranks) pair is launched once per session (see ``real_runs_helpers``);
the tests below read the same runs from different angles.
"""

from __future__ import annotations

import math
import os

import pytest
import torch
from real_runs_helpers import RUN, load_state, max_rel_err, rank_record, real_run, reference_for

from real_runs.allocator import ranks_allocator
from real_runs.launch import launch
from real_runs.strategies import STRATEGIES
from zero_sim.vocabulary import (
    MEMORY_CATEGORIES,
    REAL_STRATEGIES,
    STREAMS,
    parse_op_name,
)
from zero_sim.vocabulary.model_states import model_state_bytes
from zero_sim.vocabulary.records import OP_FIELDS

pytestmark = pytest.mark.slow
TOL = 1e-5
# Strategies that compute with the weights they were given: fsdp-qwz computes with int8-rounded
# copies of them, and is held to its own tolerance in tests/test_real_runs_quantized.py.
EXACT = tuple(s for s in REAL_STRATEGIES if s != "fsdp-qwz")


# --- 1. Same parameters as one process on the whole batch -------------------------------

@pytest.mark.parametrize("nproc", [1, 2, 4])
@pytest.mark.parametrize("strategy", EXACT)
def test_every_strategy_reaches_the_single_process_parameters(strategy, nproc):
    run, out = real_run(strategy, nproc)
    ref = reference_for(RUN)
    state = load_state(out)
    assert max_rel_err(state["params"], ref["params"]) < TOL
    # Sharded Adam moments, gathered back, are the unsharded optimizer's.
    assert max_rel_err(state["exp_avg"], ref["exp_avg"]) < TOL
    assert max_rel_err(state["exp_avg_sq"], ref["exp_avg_sq"]) < TOL
    l2 = math.sqrt(sum(float(t.double().pow(2).sum()) for t in ref["params"].values()))
    assert run["param_l2"] == pytest.approx(l2, rel=TOL)


def test_a_world_size_that_does_not_divide_the_model_is_padded_not_refused():
    run, out = real_run("fsdp", 3, global_batch=6)
    ref = reference(run)
    assert max_rel_err(load_state(out)["params"], ref["params"]) < TOL
    formula = run["model_states_formula"]
    # Each of the n_layer + 2 flat buffers pads by at most N-1 elements of 16 bytes' state.
    slack = (run["model_config"]["n_layer"] + 2) * 2 * 16
    for measured in formula["measured"].values():
        assert formula["bytes"] <= measured <= formula["bytes"] + slack


def reference(run):
    return reference_for({k: run[k] for k in ("model", "global_batch", "seq_len", "steps", "seed", "lr")})


# --- 2. Memory: the ZeRO formulas, byte for byte ------------------------------------------

@pytest.mark.parametrize("strategy", REAL_STRATEGIES)
def test_model_state_bytes_per_rank_equal_the_zero_formula(strategy):
    run, _ = real_run(strategy, 2)
    formula = run["model_states_formula"]
    assert formula["b"] == 4 and formula["K"] == 8 and run["dtype"] == "float32"
    # nano's layers all split evenly in two, so no padding: exact equality.
    assert set(formula["measured"].values()) == {formula["bytes"]}
    for per_rank in run["memory"].values():
        assert set(MEMORY_CATEGORIES) <= set(per_rank)
        assert per_rank["activations"] > 0


def test_sharding_shrinks_model_states_in_the_order_of_the_stages():
    held = {s: real_run(s, 2)[0]["model_states_formula"]["measured"]["0"]
            for s in ("ddp", "zero1", "zero2", "fsdp")}
    assert held["ddp"] > held["zero1"] > held["zero2"] > held["fsdp"]


# --- 2b. bf16: bf16 weights and gradients, fp32 master weights and Adam ----------------------

def test_in_bf16_one_rank_trains_exactly_as_the_textbook_mixed_precision_recipe():
    # A bf16 model, torch's AdamW on fp32 masters of its weights, the masters rounded back.
    run, out = real_run("ddp", 1, precision="bf16")
    ref, state = reference_for(run), load_state(out)
    assert run["precision"] == "bf16" and run["dtype"] == "bfloat16"
    for part in ("params", "exp_avg", "exp_avg_sq"):
        assert max_rel_err(state[part], ref[part]) == 0
    assert all(t.dtype == torch.bfloat16 for t in state["params"].values())


@pytest.mark.parametrize("strategy", EXACT)
def test_in_bf16_every_strategy_holds_2_2_12_bytes_a_parameter_and_lands_where_ddp_does(strategy):
    run, out = real_run(strategy, 2, precision="bf16")
    formula = run["model_states_formula"]
    assert (formula["b"], formula["K"]) == (2, 12)
    assert set(formula["measured"].values()) == {formula["bytes"]}  # nano splits evenly: no padding
    # torch's FSDP2 keeps fp32 shards as the masters: the same total, split 4 + 4 + 8.
    split = (4, 4, 8) if strategy == "fsdp-torch" else (2, 2, 12)
    expected = model_state_bytes(STRATEGIES[strategy].stage, run["params"], 2, *split)
    for per_rank in run["memory"].values():
        assert {k: per_rank[k] for k in expected} == expected
    # Every hand-written strategy, and torch's DDP, reduce the same bf16 gradients and update
    # the same masters: the same bits as DDP.  FSDP2's own recipe lands within bf16's rounding.
    ddp = load_state(real_run("ddp", 2, precision="bf16")[1])["params"]
    params = load_state(out)["params"]
    if strategy == "fsdp-torch":
        assert 0 < max_rel_err(params, ddp) < 5e-3
    else:
        assert all(torch.equal(params[k], ddp[k]) for k in ddp)


# --- 3. Output files -------------------------------------------------------------------------

def test_run_json_carries_the_contracted_fields_and_rank_files_use_the_shared_schema():
    run, out = real_run("zero2", 2)
    for key in ("strategy", "world_size", "backend", "model", "params", "global_batch", "seq_len", "steps",
                "step_times_s", "final_loss", "param_l2", "memory", "versions"):
        assert key in run
    assert (run["backend"], run["world_size"], len(run["step_times_s"])) == ("gloo", 2, RUN["steps"])
    assert set(run["memory"]) == {"0", "1"}
    # The ranks ran on jemalloc exactly where it is installed (real_runs.allocator).
    assert run["versions"]["allocator"] == ranks_allocator()
    assert {"run.json", "rank0.json", "rank1.json"} <= set(os.listdir(out))
    rec = rank_record(out, 1)
    assert rec["ops"] and all(tuple(op) == OP_FIELDS for op in rec["ops"])
    for op in rec["ops"]:
        parse_op_name(op["name"])
        assert op["stream"] in STREAMS and op["rank"] == 1
        assert 0 <= op["start_s"] <= op["end_s"]
    assert {m["category"] for m in rec["memory_timeline"]} <= set(MEMORY_CATEGORIES)


# --- 4. The records show each schedule ------------------------------------------------------

def ops(out, step=1, rank=0):
    """Rank 0's ops in the last step (the first one warms up)."""
    return [op for op in rank_record(out, rank)["ops"] if op["step"] == step]


def backward_end(step_ops):
    return max(op["end_s"] for op in step_ops if op["name"].startswith("bwd "))


def first(step_ops, kind):
    return min(op["start_s"] for op in step_ops if op["name"].startswith(kind))


def test_zero2_hook_launches_its_first_reduce_scatter_during_backward_and_step_after():
    hook, step = ops(real_run("zero2-hook", 2)[1]), ops(real_run("zero2-step", 2)[1])
    assert first(hook, "reduce_scatter") < backward_end(hook)
    assert first(step, "reduce_scatter") >= backward_end(step)


def test_ddp_all_reduces_overlap_backward():
    step_ops = ops(real_run("ddp", 2)[1])
    buckets = [op for op in step_ops if op["name"].startswith("all_reduce")]
    assert len(buckets) > 1
    assert first(step_ops, "all_reduce") < backward_end(step_ops)


def test_fsdp_gathers_each_layer_before_its_forward_and_again_before_its_backward():
    step_ops = ops(real_run("fsdp", 2)[1])
    n_layers = real_run("fsdp", 2)[0]["model_config"]["n_layer"] + 2

    def start(name):
        return next(op["start_s"] for op in step_ops if op["name"] == name)

    for i in range(n_layers):
        gathers = sorted(op["start_s"] for op in step_ops if op["name"] == f"all_gather L{i}")
        assert gathers and gathers[0] <= start(f"fwd L{i}")
        assert any(t <= start(f"bwd L{i}") for t in gathers)
        if 0 < i < n_layers - 1:  # blocks are freed after forward and gathered again
            assert len(gathers) == 2 and start(f"fwd L{i}") < gathers[1] <= start(f"bwd L{i}")
    reduce_scatters = [op for op in step_ops if op["name"].startswith("reduce_scatter L")]
    assert len(reduce_scatters) == n_layers


def test_progress_streams_to_the_caller_and_a_profiler_trace_is_written_on_request(tmp_path):
    import json

    lines = []
    run = launch("ddp", nproc=1, out=tmp_path, trace=True, on_line=lines.append, **RUN)
    assert any(line.startswith(f"step {RUN['steps']}/{RUN['steps']} loss") for line in lines)
    assert "traces/rank0.pt.trace.json" in run["files"]
    with open(tmp_path / "traces" / "rank0.pt.trace.json") as f:
        assert json.load(f)["traceEvents"]
