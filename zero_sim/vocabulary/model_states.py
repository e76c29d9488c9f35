"""Model states per rank: the ZeRO paper's arithmetic, written once for every part of the project.

Training with Adam keeps, per parameter, its weight (``b`` bytes), its gradient (``b``
bytes) and ``K`` bytes of optimizer state (mixed precision: b = 2 and K = 12 for the fp32
master weight and the two moments; plain fp32: b = 4, K = 8).  Each ZeRO stage shards one
more of the three over the ``N`` data-parallel ranks:

========  ===============  =========================
stage     sharded          bytes per rank
========  ===============  =========================
0 (DDP)   nothing          (2b + K) Ψ
1         optimizer state  2b Ψ + K Ψ / N
2         + gradients      b Ψ + (b + K) Ψ / N
3, FSDP   + parameters     (2b + K) Ψ / N
========  ===============  =========================

The simulator's strategies, the memory calculator and the real runs' check of their own
tensors all take their figures from :func:`model_state_bytes`.
"""

from __future__ import annotations

from collections.abc import Callable

from zero_sim.vocabulary import GRADS, OPTIMIZER_STATE, PARAMS

# The ZeRO stage whose sharding each strategy's model states follow.
STAGE = {"ddp": 0, "zero1": 1, "zero2": 2, "zero3": 3, "fsdp": 3}

# A category is sharded from this stage on.
SHARDED_FROM = {OPTIMIZER_STATE: 1, GRADS: 2, PARAMS: 3}

FORMULAS = {0: "(2b+K)Ψ", 1: "2bΨ + KΨ/N", 2: "bΨ + (b+K)Ψ/N", 3: "(2b+K)Ψ/N"}


def even_share(numel: float, n: int) -> float:
    """A rank's share of ``numel`` elements split evenly (no padding)."""
    return numel / n


def model_state_bytes(stage: int, psi: float, n: int, param_bytes: float = 2, grad_bytes: float = 2,
                      optimizer_bytes: float = 12,
                      share: Callable[[float, int], float] = even_share) -> dict[str, float]:
    """Bytes of parameters, gradients and optimizer state one of ``n`` ranks holds at ``stage``.

    ``share(numel, n)`` is a rank's part of a sharded tensor: even by default; the simulator
    passes its padded shard, as collectives need equal chunks."""
    if stage not in FORMULAS:
        raise ValueError(f"ZeRO stage must be 0, 1, 2 or 3, got {stage!r}")
    if n < 1:
        raise ValueError(f"the number of ranks N must be at least 1, got {n!r}")

    def held(category: str) -> float:
        return share(psi, n) if stage >= SHARDED_FROM[category] else psi

    return {PARAMS: param_bytes * held(PARAMS), GRADS: grad_bytes * held(GRADS),
            OPTIMIZER_STATE: optimizer_bytes * held(OPTIMIZER_STATE)}


def formula(stage: int, psi: int, n: int, elem_bytes: int, k: int) -> dict:
    """The formula for ``stage`` in words and its total, for a record to show beside measured bytes."""
    total = sum(model_state_bytes(stage, psi, n, elem_bytes, elem_bytes, k).values())
    return {"formula": FORMULAS[stage], "b": elem_bytes, "K": k, "psi": psi, "N": n,
            "bytes": int(round(total))}
