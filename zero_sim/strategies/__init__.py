"""Strategies: each turns (workload, knobs) into the per-rank program of ops.

One file per strategy, readable alone: each a :class:`Strategy` with a
:class:`~zero_sim.strategies.base.Step` subclass that overrides a few hooks of the shared step
skeleton and composes shared pieces (gradient buckets and ZeRO-1/2's sliced update in
``buckets.py``) rather than inheriting from another strategy.  A strategy's knobs are read
by attribute (``ctx.knobs.bucket_mb``).  What a strategy can do (its ZeRO stage, what it may
offload, the plug-ins it accepts) is declared on its class (``capabilities.py``), so nothing
outside this package compares strategy names.  Register new ones in ``STRATEGIES``.
"""

from __future__ import annotations

from zero_sim.strategies.base import PRECISIONS, Context, Knob, Precision, Strategy, StrategyError
from zero_sim.strategies.ddp import DDP
from zero_sim.strategies.fsdp import FSDP
from zero_sim.strategies.zero1 import ZeRO1
from zero_sim.strategies.zero2 import ZeRO2
from zero_sim.strategies.zero3 import ZeRO3

STRATEGIES: dict[str, Strategy] = {s.name: s for s in (DDP(), ZeRO1(), ZeRO2(), ZeRO3(), FSDP())}


def get_strategy(name: str) -> Strategy:
    if name not in STRATEGIES:
        raise StrategyError(f"unknown strategy {name!r}; choose one of {', '.join(STRATEGIES)}")
    return STRATEGIES[name]


def declaring(library: str, *, stage: int | None = None, shards: str | None = None) -> Strategy | None:
    """The first registered strategy of ``library`` at ZeRO ``stage`` or sharding the model state
    ``shards`` (``Strategy.can``), None where none is: how a configuration file's reader finds the
    strategy it describes without naming one."""
    return next((s for s in STRATEGIES.values() if s.can.library == library
                 and (stage is None or s.can.stage == stage) and (shards is None or s.can.shards(shards))),
                None)


def accepting(feature: str) -> list[str]:
    """The strategies that accept the plug-in ``feature`` (``Strategy.can``), in registry order."""
    return [name for name, strategy in STRATEGIES.items() if strategy.can.accepts(feature)]


def all_knobs() -> dict[str, list[tuple[str, Knob]]]:
    """Every knob name -> the strategies that accept it (CLI uses this to refuse misplaced flags)."""
    owners: dict[str, list[tuple[str, Knob]]] = {}
    for strategy in STRATEGIES.values():
        for knob in strategy.knobs:
            owners.setdefault(knob.name, []).append((strategy.name, knob))
    return owners


__all__ = ["Context", "Knob", "Precision", "PRECISIONS", "STRATEGIES", "Strategy", "StrategyError",
           "accepting", "all_knobs", "declaring", "get_strategy"]
