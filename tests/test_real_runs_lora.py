"""LoRA fine-tuning in the real runs: two gloo ranks under DDP, ZeRO-1, ZeRO-2 and FSDP train the
adapters as one process does on the whole batch, hold gradients and Adam state for the adapters alone, and
replay in the simulator as the same LoRA scenario.

The run: the nano model, rank-4 adapters on q, v and the MLP's down projection (``out``), two
steps, two ranks.  Runs are launched once per pytest session and shared (``real_runs_helpers``).
"""

from __future__ import annotations

import functools

import pytest
import torch
from real_runs_helpers import RUN, load_state, max_rel_err, rank_record, real_run

from real_runs.lora import add_lora
from real_runs.lora_targets import ALIASES, ALL_LINEAR, PROJECTIONS, adapter_params, parse_targets
from real_runs.model import PRESETS, build_model, global_batch
from real_runs.strategies import AdamW
from real_runs.train import main
from sim2real.replay import predict_run, real_shape
from zero_sim.system import lora as sim_lora

LORA = dict(lora_rank=4, lora_targets="q_proj,v_proj,out")
TARGETS = ("q", "v", "down")
# Equal to single-process training within fp32 rounding: the two ranks' gradients are averaged
# in another order than one process sums the batch (tests/test_real_runs_runs.py uses the same).
TOL = 1e-5


@functools.cache
def reference() -> dict:
    """One process, the whole global batch: torch's AdamW on the adapters of the same adapted model."""
    torch.set_num_threads(1)
    cfg = PRESETS[RUN["model"]]
    net = add_lora(build_model(cfg, RUN["seed"]), LORA["lora_rank"], TARGETS, 8.0, RUN["seed"])
    initial = {n: p.detach().clone() for n, p in net.named_parameters()}
    trainable = [p for p in net.parameters() if p.requires_grad]
    opt = AdamW(lr=RUN["lr"]).torch_optimizer(trainable)
    losses = []
    for step in range(RUN["steps"]):
        x, y = global_batch(cfg, RUN["seed"], step, RUN["global_batch"], RUN["seq_len"])
        opt.zero_grad()
        loss = net(x, y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    names = {p: n for n, p in net.named_parameters()}
    return {"losses": losses, "initial": initial,
            "params": {n: p.detach().clone() for n, p in net.named_parameters()},
            "exp_avg": {names[p]: s["exp_avg"] for p, s in opt.state.items()},
            "trainable": sum(p.numel() for p in trainable)}


def lora_run(strategy: str):
    return real_run(strategy, 2, **LORA)


STRATEGIES = ("ddp", "zero1", "zero2", "fsdp")


@pytest.mark.slow
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_two_ranks_train_the_adapters_as_one_process_does(strategy):
    run, out = lora_run(strategy)
    ref, state = reference(), load_state(out)
    assert run["losses"] == pytest.approx(ref["losses"], rel=TOL)
    adapters = {n: t for n, t in ref["params"].items() if ".lora_" in n}
    assert len(adapters) == 2 * len(TARGETS) * PRESETS[RUN["model"]].n_layer
    # The adapters moved (B starts at zero), as far as one process moved them.
    assert all(not torch.equal(adapters[n], ref["initial"][n]) for n in adapters if ".lora_B." in n)
    assert max_rel_err({n: state["params"][n] for n in adapters}, adapters) < TOL
    # Adam holds moments for the adapters alone, and they are one process's.
    assert set(state["exp_avg"]) == set(adapters)
    assert max_rel_err(state["exp_avg"], ref["exp_avg"]) < TOL
    # Every other weight is exactly where it started.
    frozen = [n for n in ref["initial"] if n not in adapters]
    assert all(torch.equal(state["params"][n], ref["initial"][n]) for n in frozen)


@pytest.mark.slow
@pytest.mark.parametrize("strategy, shards", [("ddp", (1, 1, 1)), ("zero1", (1, 1, 2)), ("zero2", (1, 2, 2)),
                                              ("fsdp", (2, 2, 2))])
def test_gradients_and_adam_state_are_held_for_the_adapters_only(strategy, shards):
    """``shards``: over how many ranks weights, gradients and Adam state are split (the ZeRO stage)."""
    run, _ = lora_run(strategy)
    cfg = PRESETS[RUN["model"]]
    adapters = adapter_params(cfg.n_layer, cfg.d_model, LORA["lora_rank"], TARGETS)
    assert run["trainable_params"] == adapters == reference()["trainable"]
    assert (run["lora_rank"], run["lora_targets"]) == (4, "q,v,down")
    weights, grads, adam = shards
    for per_rank in run["memory"].values():  # fp32: 4 bytes a gradient, 8 of Adam (m and v)
        assert per_rank["grads"] == 4 * adapters // grads
        assert per_rank["optimizer"] == 8 * adapters // adam
        assert per_rank["params"] == 4 * run["params"] // weights  # every weight, frozen ones included
    formula = run["model_states_formula"]
    assert set(formula["measured"].values()) == {formula["bytes"]}


@pytest.mark.slow
def test_fsdp_gathers_every_weight_and_ddp_and_fsdp_reduce_the_adapters_only():
    cfg = PRESETS[RUN["model"]]
    adapters = adapter_params(cfg.n_layer, cfg.d_model, LORA["lora_rank"], TARGETS)
    run, out = lora_run("fsdp")
    net = add_lora(build_model(cfg, RUN["seed"]), LORA["lora_rank"], TARGETS, 8.0, RUN["seed"])
    step = [op for op in rank_record(out, 0)["ops"] if op["step"] == 1]
    sent = {op["name"]: op["bytes"] for op in step if op["stream"] == "comm"}
    for i, layer in enumerate(net.layers):  # whole layers, frozen weights and adapters (nano: no padding)
        assert sent[f"all_gather L{i}"] == 4 * sum(p.numel() for p in layer.parameters())
    reduced = {name: b for name, b in sent.items() if name.startswith("reduce_scatter")}
    assert set(reduced) == {f"reduce_scatter L{i}" for i in range(1, cfg.n_layer + 1)}  # blocks only
    assert sum(reduced.values()) == 4 * adapters
    # The copy out of the all-gather buffer runs where a layer holds both kinds: the blocks.
    assert {op["name"] for op in step if op["name"].startswith("copy_out")} == {
        f"copy_out L{i}" for i in range(1, cfg.n_layer + 1)}
    ddp_step = [op for op in rank_record(lora_run("ddp")[1], 0)["ops"] if op["step"] == 1]
    assert sum(op["bytes"] for op in ddp_step if op["name"].startswith("all_reduce")) == 4 * adapters


@pytest.mark.slow
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_replay_of_a_lora_run_simulates_the_same_lora_scenario(strategy):
    run, _ = lora_run(strategy)
    sim = predict_run(run)
    assert sim.metrics["trainable_params"] == run["trainable_params"]
    assert sim.scenario.workload.params == run["params"]
    memory = sim.metrics["memory"]
    measured = run["memory"]["0"]
    assert (memory["params_bytes"], memory["grads_bytes"], memory["optimizer_bytes"]) == (
        measured["params"], measured["grads"], measured["optimizer"])


# --- fast: names and bad input ----------------------------------------------------------------

@pytest.mark.parametrize("name", [*sim_lora.ALIASES, *PROJECTIONS, ALL_LINEAR, "q_proj,v_proj", "qkv", "out"])
def test_every_target_name_means_what_the_simulator_takes_it_to_mean(name):
    shape = real_shape(PRESETS["tiny"], 64)
    real_name = {"qkv": "c_attn", "proj": "o_proj", "out": "down_proj"}.get(name, name)
    try:
        expected = sim_lora.parse_targets(real_name, shape)
    except ValueError:
        expected = None
    try:
        got = parse_targets(name)
    except ValueError:
        got = None
    assert got == expected
    assert set(ALIASES) >= set(sim_lora.ALIASES) - {"gate_proj", "up_proj"}  # the real MLP has no gate


@pytest.mark.parametrize("argv, says", [
    (["--lora-rank", "4", "--lora-targets", "gate_proj"], "LoRA target 'gate_proj' is not a projection"),
    (["--lora-targets", "q"], "no --lora-rank"),
    (["--lora-rank", "0"], "--lora-rank must be an integer from 1"),
    (["--lora-rank", "4", "--strategy", "fsdp-qwz"], "fsdp-qwz gathers int8"),
])
def test_bad_lora_input_is_one_sentence_and_status_2(argv, says, tmp_path, capfd):
    strategy = [] if "--strategy" in argv else ["--strategy", "ddp"]
    assert main([*strategy, *argv, "--out", str(tmp_path)]) == 2
    err = capfd.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1 and "Traceback" not in err
