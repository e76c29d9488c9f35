"""Model states per rank: the ZeRO sharding rule, written once for every part of the project.

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

The rule has two halves, each a function here: which states a stage shards (:func:`sharded`)
and what a rank holds of a state cut from some buffers (:func:`held_elements`: each buffer's
share when sharded, all of it when not, plus what is held whole on every rank).  The
simulator's layer of states (``zero_sim.strategies.states``), the memory calculator and the
real runs' check of their own tensors all ask these two, through :func:`model_state_bytes`
for a model given by its parameter count.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from zero_sim.vocabulary import GRADS, OPTIMIZER_STATE, PARAMS

# A category is sharded from this stage on.
SHARDED_FROM = {OPTIMIZER_STATE: 1, GRADS: 2, PARAMS: 3}

FORMULAS = {0: "(2b+K)Ψ", 1: "2bΨ + KΨ/N", 2: "bΨ + (b+K)Ψ/N", 3: "(2b+K)Ψ/N"}

Share = Callable[[float, int], float]


def even_share(numel: float, n: int) -> float:
    """A rank's share of ``numel`` elements split evenly (no padding)."""
    return numel / n


def sharded(stage: int, category: str) -> bool:
    """Whether ZeRO ``stage`` shards the model state ``category`` (params, grads, optimizer)."""
    return stage >= SHARDED_FROM[category]


def held_elements(units: Iterable[float], n: int, is_sharded: bool, share: Share = even_share,
                  whole: float = 0) -> float:
    """Elements a rank holds of a state cut from buffers of ``units`` elements: each buffer's share
    of ``n`` ranks when sharded (each buffer is split on its own), every element when not; plus
    ``whole`` elements held whole on every rank either way (ZeRO-3's persistent tensors)."""
    units = tuple(units)
    return (sum(share(u, n) for u in units) if is_sharded else sum(units)) + whole


def model_state_bytes(stage: int, psi: float, n: int, param_bytes: float = 2, grad_bytes: float = 2,
                      optimizer_bytes: float = 12, share: Share = even_share, *,
                      trainable: float | None = None, persistent: float = 0) -> dict[str, float]:
    """Bytes of parameters, gradients and optimizer state one of ``n`` ranks holds at ``stage``.

    ``share(numel, n)`` is a rank's part of a sharded tensor: even by default; the simulator
    passes its padded shard, as collectives need equal chunks.  ``trainable`` parameters (all by
    default; LoRA trains fewer) have gradients and optimizer state; ``persistent`` parameters stay
    whole on every rank although the stage shards weights (DeepSpeed's small tensors)."""
    if stage not in FORMULAS:
        raise ValueError(f"ZeRO stage must be 0, 1, 2 or 3, got {stage!r}")
    if n < 1:
        raise ValueError(f"the number of ranks N must be at least 1, got {n!r}")
    trained = psi if trainable is None else trainable
    weights = (held_elements((psi - persistent,), n, True, share, persistent) if sharded(stage, PARAMS)
               else psi)
    return {PARAMS: param_bytes * weights,
            GRADS: grad_bytes * held_elements((trained,), n, sharded(stage, GRADS), share),
            OPTIMIZER_STATE: optimizer_bytes * held_elements((trained,), n, sharded(stage, OPTIMIZER_STATE),
                                                             share)}


def formula(stage: int, psi: int, n: int, elem_bytes: int, k: int) -> dict:
    """The formula for ``stage`` in words and its total, for a record to show beside measured bytes."""
    total = sum(model_state_bytes(stage, psi, n, elem_bytes, elem_bytes, k).values())
    return {"formula": FORMULAS[stage], "b": elem_bytes, "K": k, "psi": psi, "N": n,
            "bytes": int(round(total))}
