"""DDP, written out by hand.

Every rank holds the whole model and the whole Adam state; only gradients travel.

Communication phases of one step, in order:

1. **forward**: none.  Each rank runs its own rows of the batch.
2. **backward**: parameters are grouped into buckets of about ``--bucket-mb`` in *reverse*
   order, because that is the order backward produces their gradients (at the default
   cap the first bucket holds only 1 MiB, as in torch).  Each gradient
   is a view into its bucket, so autograd accumulates straight into the buffer that
   will be sent.  When the last gradient of a bucket lands, its hook launches an async
   ``all_reduce B<k>`` (average) and backward carries on: the reduction of late layers
   overlaps the backward of early ones.
3. **optimizer**: wait for each bucket's all-reduce in launch order and run AdamW on
   the bucket as one flat tensor.  Every rank applies the same update to the same
   numbers, so the replicas stay identical without a broadcast.

Per-rank model states (fp32): params 4Ψ + grads 4Ψ + Adam 8Ψ = 16Ψ.  Fine-tuning with LoRA
(:mod:`real_runs.lora`) buckets, reduces and updates the Ψ_t trainable adapter weights only:
4Ψ + 4Ψ_t + 8Ψ_t, the frozen weights held whole beside the buckets.
"""

from __future__ import annotations

import torch

from zero_sim.vocabulary import ALL_REDUCE, bucket_collective, opt

from .base import AdamState, Flat, InOrder, Strategy, bucketize, model_state_bytes


class DDP(Strategy):
    name = "ddp"
    stage = 0
    pad_to_world = False  # replicas need no padding; ZeRO-1 shards the same buckets

    def setup(self) -> None:
        world, rank = (self.world, self.rank) if self.pad_to_world else (1, 0)
        # Only what trains has a gradient to reduce: frozen weights (LoRA) are in no bucket, as
        # torch's reducer skips parameters that do not require one.
        groups = bucketize(self.trainable, self.bucket_bytes, self.first_bucket_bytes)
        self.flats = [Flat(g, k, None, world, rank) for k, g in enumerate(groups)]
        for f in self.flats:
            f.bind()
            f.bind_grads()
        self.adam = [AdamState(self.update_target(f, f.data), self.hp) for f in self.flats]
        self.pending = [None] * len(self.flats)
        self.launcher = InOrder(self.flats, self.launch)

    def update_target(self, f: Flat, buf: torch.Tensor) -> torch.Tensor:
        """The part of a bucket this rank's optimizer updates: all of it, for DDP."""
        return buf

    def zero_grad(self) -> None:
        for f in self.flats:
            f.grad.zero_()
        self.launcher.reset()

    def grad_ready(self, p) -> None:
        self.launcher.ready(p)

    def launch(self, f: Flat) -> None:
        self.pending[f.index] = self.all_reduce(f.grad, bucket_collective(ALL_REDUCE, f.index))

    def update_bucket(self, f: Flat) -> None:
        self.pending[f.index].wait()
        p, g = self.update_target(f, f.data), self.update_target(f, f.grad)
        with self.rec.span(opt(f"B{f.index}"), nbytes=p.nbytes):
            self.adam[f.index].update(p, g)

    def step(self) -> None:
        self.launcher.flush()
        for f in self.flats:
            self.update_bucket(f)

    def full_optimizer_state(self) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        return self.moments_by_name(self.flats, [a.m for a in self.adam], [a.v for a in self.adam])

    def model_state_bytes(self) -> dict[str, int]:
        return model_state_bytes(
            params=sum(f.nbytes for f in self.flats) + self.frozen_bytes,
            grads=sum(f.nbytes for f in self.flats),
            optimizer=sum(a.nbytes for a in self.adam),
        )
