"""One ZeRO rule: the bytes of model states a rank holds are written once, in the shared vocabulary,
and the simulated strategies, the calculator and the real runs all take them from there.

The simulator's figure is the truth where the textbook formula leaves something out (DeepSpeed's
persistent small tensors, the padding collectives need); ``model_state_bytes`` follows it.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zero_sim.scenario.pipeline import prepare
from zero_sim.strategies import STRATEGIES
from zero_sim.strategies.states import shard
from zero_sim.vocabulary import GRADS, OPTIMIZER_STATE, PARAMS
from zero_sim.vocabulary.model_states import held_elements, model_state_bytes, sharded


def simulated_states(**settings) -> tuple[dict[str, int], object]:
    """The model states a strategy's step holds on the GPU, without running the step."""
    p = prepare(**settings)
    step = p.strategy.Step(p.ctx, p.strategy.can.stage)
    return {c: step.resident()[c] for c in (PARAMS, GRADS, OPTIMIZER_STATE)}, step


def rule(step, persistent: int = 0, trainable: int | None = None) -> dict[str, float]:
    """``model_state_bytes`` for the step's model, padded as the simulator pads."""
    p = step.p
    return model_state_bytes(step.stage, step.w.params, step.n, p.param_bytes, p.grad_bytes,
                             p.optimizer_bytes, shard, trainable=trainable, persistent=persistent)


def test_zero3_model_states_follow_the_simulator_with_persistent_tensors_and_padding():
    # gpt2-1.5b on 16 GPUs: the textbook (2b+K)Ψ/N gives 194,701,400 bytes of weights; DeepSpeed keeps
    # every tensor of at most 1e5 elements whole on every rank, and the rule counts them.
    states, step = simulated_states(model="gpt2-1.5b", strategy="zero3", gpus=16, topology="dgx-a100")
    assert states[PARAMS] == 196_579_400
    assert model_state_bytes(3, step.w.params, 16)[PARAMS] == pytest.approx(194_701_400)
    assert rule(step, persistent=step.persistent) == states


@settings(max_examples=12, deadline=None)
@given(model=st.sampled_from(["gpt2-124m", "gpt2-350m", "llama3-8b"]),
       gpus=st.sampled_from([1, 3, 8, 24, 64]), strategy=st.sampled_from(["ddp", "zero3"]))
def test_one_buffer_strategies_hold_exactly_what_model_state_bytes_says(model, gpus, strategy):
    states, step = simulated_states(model=model, strategy=strategy, gpus=gpus, topology="dgx-a100")
    persistent = getattr(step, "persistent", 0)
    assert rule(step, persistent=persistent) == states


@pytest.mark.parametrize("strategy", list(STRATEGIES))
@pytest.mark.parametrize("lora", [None, 16])
def test_every_strategy_holds_the_rule_applied_to_its_own_buffers(strategy, lora):
    """Each strategy says which buffers it cuts (the model, wrap units, gradient buckets); what a
    rank holds of them is the vocabulary's rule, byte for byte, with LoRA's frozen weights too."""
    states, step = simulated_states(model="gpt2-124m", strategy=strategy, gpus=6, topology="dgx-a100",
                                    lora_rank=lora)
    p, n = step.p, step.n
    grads = held_elements(step.gradient_units(), n, sharded(step.stage, GRADS), shard)
    optimizer = held_elements(step.trainable_units(), n, sharded(step.stage, OPTIMIZER_STATE), shard)
    if step.states.grads.padded and not sharded(step.stage, GRADS):  # ZeRO-1's flat buffers, padded to N
        grads = sum(shard(u, n) * n for u in step.gradient_units())
    assert states[GRADS] == p.grad_bytes * grads
    assert states[OPTIMIZER_STATE] == p.optimizer_bytes * optimizer


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_model_state_bytes_is_within_the_padding_of_every_strategy(strategy):
    """Against the one-buffer formula, a strategy that cuts several buffers holds at most a padded
    element per buffer and rank more."""
    states, step = simulated_states(model="gpt2-350m", strategy=strategy, gpus=16, topology="dgx-a100")
    expected = rule(step, persistent=getattr(step, "persistent", 0))
    buffers = max(len(step.shard_units()), len(step.trainable_units()), len(step.gradient_units()))
    for category, nbytes in states.items():
        assert 0 <= nbytes - expected[category] <= 16 * buffers * 12


def test_a_lora_split_counts_gradients_and_optimizer_state_for_what_trains():
    held = model_state_bytes(2, 1000, 4, 4, 4, 8, trainable=100)
    assert held == {PARAMS: 4000, GRADS: 4 * 25, OPTIMIZER_STATE: 8 * 25}
