"""What a real run's ``run.json`` says beside its profiler traces, for a calibration from them.

``real_runs.train --trace`` leaves ``run.json`` one folder above the traces: the tokens each
rank computed a step (which per-layer times need to be used at other sizes), the ranks
computing at once, the CPU cores they shared and the parameters each rank's optimizer updates.
Anyone else's traces have none of it, and every fact is then None.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from zero_sim.strategies import get_strategy
from zero_sim.vocabulary import OPTIMIZER_STATE
from zero_sim.vocabulary.real_strategies import REAL_TO_SIM

# The real runs' strategies that keep the whole optimizer state on every rank (those replayed as a
# simulated strategy that does not shard it); the rest shard it.
UNSHARDED_OPTIMIZER = tuple(real for real, (simulated, _, _) in REAL_TO_SIM.items()
                            if not get_strategy(simulated).can.shards(OPTIMIZER_STATE))


@dataclass(frozen=True)
class RunFacts:
    """What the ``run.json`` of a real run says beside its traces (``real_runs.train --trace`` leaves
    it one folder up); all None for anyone else's traces."""

    tokens: int | None = None  # tokens per rank per step
    world_size: int | None = None  # ranks computing at once
    cores: int | None = None  # CPU cores the ranks shared
    params_updated: int | None = None  # parameters each rank's optimizer updates


def run_facts(path: Path) -> RunFacts:
    """The facts of the real run whose traces folder (or a trace in it) ``path`` is, read once."""
    run_json = (path if path.is_dir() else path.parent).parent / "run.json"
    try:
        run = json.loads(run_json.read_text())
    except (OSError, ValueError):
        return RunFacts()
    if not isinstance(run, dict):
        return RunFacts()

    def positive(key: str) -> int | None:
        value = run.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None

    # The optimizer updates what trains: a LoRA run's adapters (trainable_params), else every weight.
    world, params = positive("world_size"), positive("trainable_params") or positive("params")
    batch, seq = positive("global_batch"), positive("seq_len")
    tokens = batch // world * seq if batch and world and seq else None
    updated = None
    if params and world:
        updated = params if run.get("strategy") in UNSHARDED_OPTIMIZER else -(-params // world)
    return RunFacts(tokens, world, positive("cores"), updated)


def tokens_of_run(path: Path) -> int | None:
    """Tokens per rank per step of the real run whose traces ``path`` holds, else None."""
    return run_facts(path).tokens


__all__ = ["UNSHARDED_OPTIMIZER", "RunFacts", "run_facts", "tokens_of_run"]
