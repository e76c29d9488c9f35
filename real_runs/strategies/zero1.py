"""ZeRO-1: DDP's gradients, a sharded optimizer.

The buckets are DDP's, padded to a multiple of the world size N so that each splits
into N equal chunks; rank r owns chunk r of every bucket and keeps Adam state for that
chunk only.

Communication phases of one step, in order:

1. **forward**: none; every rank holds all parameters.
2. **backward**: as DDP, an async ``all_reduce B<k>`` per bucket launched from the
   gradient hooks in reverse parameter order.  Every rank receives the whole averaged
   gradient although it will only use its own chunk, which is what ZeRO-1 (and torch's
   ``ZeroRedundancyOptimizer`` under DDP) trades for simplicity; ZeRO-2 replaces this
   all-reduce with a reduce-scatter.
3. **optimizer**: per bucket, wait for its all-reduce, run AdamW on this rank's chunk,
   and launch ``all_gather B<k>`` so every rank receives every other rank's updated
   chunk.  The gathers of early buckets overlap the updates of later ones; the step
   ends when all have arrived.

Per-rank model states (fp32): params 4Ψ + grads 4Ψ + Adam 8Ψ/N; with LoRA, as DDP, the buckets
hold the trainable adapters alone (Ψ_t): 4Ψ + 4Ψ_t + 8Ψ_t/N.
"""

from __future__ import annotations

import torch

from zero_sim.vocabulary import ALL_GATHER, bucket_collective

from .base import Flat
from .ddp import DDP


class ZeRO1(DDP):
    name = "zero1"
    stage = 1
    pad_to_world = True

    def update_target(self, f: Flat, buf: torch.Tensor) -> torch.Tensor:
        return f.mine(buf)

    def step(self) -> None:
        self.launcher.flush()
        gathers = []
        for f in self.flats:
            self.update_bucket(f)
            gathers.append(self.all_gather(f.data, f.mine(f.data), bucket_collective(ALL_GATHER, f.index)))
        for g in gathers:
            g.wait()

    def full_optimizer_state(self) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        return self.gathered_moments()
