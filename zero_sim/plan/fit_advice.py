"""When a scenario does not fit: the smallest change that would, found by trying them in order.

The changes, cheapest for the run first: activation recompute (``full`` keeps one input per
block), a smaller micro-batch (halved down to 1; with a fixed global batch the accumulation
grows to match), a sharded strategy (``fsdp``, then ``zero3``), offloading to host memory on
the same GPUs (ZeRO-3's optimizer state, then its weights too: slower steps, no new hardware;
docs/offload.md), more GPUs of the same kind (doubling, up to 16 times as many), then a GPU with
more memory.  Each try is first checked
against the memory bound (:mod:`zero_sim.plan.bounds`) and only simulated when it might fit;
the first that fits is the answer.
"""

from __future__ import annotations

from collections.abc import Iterator

from zero_sim.plan.bounds import bounds
from zero_sim.scenario import ScenarioError, simulate
from zero_sim.scenario.settings import COMMON, MAX_GPUS
from zero_sim.strategies import STRATEGIES, all_knobs, get_strategy
from zero_sim.strategies.capabilities import PYTORCH
from zero_sim.system.gpus import GPUS
from zero_sim.vocabulary import PARAMS

# The strategies that shard the weights, PyTorch's first (it needs nothing beyond torch).
SHARDED = tuple(sorted((name for name, st in STRATEGIES.items() if st.can.shards(PARAMS)),
                       key=lambda name: STRATEGIES[name].can.library != PYTORCH))
# The one that offloads the optimizer state alone, then the weights with it (DeepSpeed's ZeRO-3).
OFFLOADS = next(name for name, st in STRATEGIES.items()
                if st.can.shards(PARAMS) and st.can.placement and st.can.placement.params == "with_optimizer")
MORE_GPUS = (2, 4, 8, 16)
DEFAULT_STRATEGY = next(setting.default for setting in COMMON if setting.name == "strategy")


def _tries(s: dict, capacity: float) -> Iterator[tuple[str, dict]]:
    """(what changes, the changed scenario), in the order they are tried."""
    if s.get("recompute", "none") != "full":
        yield "--recompute full", s | {"recompute": "full"}
    micro = s.get("micro_batch", 8)
    while micro > 1:
        micro //= 2
        accum = s.get("grad_accum", 1) * s.get("micro_batch", 8) // micro
        smaller = {"micro_batch": micro, "grad_accum": accum, "recompute": "full"}
        yield f"--micro-batch {micro} --grad-accum {accum} --recompute full", s | smaller
    for strategy in SHARDED:
        if s.get("strategy", DEFAULT_STRATEGY) not in SHARDED:
            yield f"--strategy {strategy} --recompute full", _switch(s, strategy) | {"recompute": "full"}
    gpus = s.get("gpus", 8)
    current = s.get("strategy", DEFAULT_STRATEGY)
    sharded = current if current in SHARDED else SHARDED[0]
    base = _switch(s, sharded) | {"recompute": "full"}
    if s.get("offload_params", "none") == "none":
        offloaded = _switch(s, OFFLOADS) | {"recompute": "full", "offload_optimizer": "cpu"}
        yield f"--strategy {OFFLOADS} --offload-optimizer cpu --recompute full", offloaded
        yield (f"--strategy {OFFLOADS} --offload-optimizer cpu --offload-params cpu --recompute full",
               offloaded | {"offload_params": "cpu"})
    for factor in MORE_GPUS:
        if gpus * factor <= MAX_GPUS:
            yield f"--gpus {gpus * factor} (--strategy {base['strategy']} --recompute full)", \
                base | {"gpus": gpus * factor}
    for name, gpu in sorted(GPUS.items(), key=lambda kv: kv[1].hbm_bytes):
        if gpu.hbm_bytes > capacity and gpu.profile is not None:
            yield f"--gpu {name} (--strategy {base['strategy']} --recompute full)", base | {"gpu": name}


def _switch(s: dict, strategy: str) -> dict:
    """``s`` under another strategy, without the knobs only the old one takes."""
    own = {k.name for k in get_strategy(strategy).knobs}
    return {k: v for k, v in s.items() if k not in all_knobs() or k in own} | {"strategy": strategy}


def first_change_that_fits(scenario: dict) -> tuple[str, float] | None:
    """The first change (as flags) under which ``scenario`` fits, and the GB it leaves spare;
    None when none of the changes fits."""
    try:
        capacity = bounds(**scenario).capacity_bytes
    except (ScenarioError, ValueError):
        return None
    for words, changed in _tries(dict(scenario), capacity):
        try:
            if bounds(**changed).cannot_fit:
                continue
            mem = simulate(**changed, steps=1).metrics["memory"]
        except (ScenarioError, ValueError):
            continue
        if mem["fits"]:
            return words, (mem["capacity_bytes"] - mem["reserved_peak_bytes"]) / 1e9
    return None


__all__ = ["first_change_that_fits"]
