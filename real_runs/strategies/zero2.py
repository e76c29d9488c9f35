"""ZeRO-2: gradients and optimizer state sharded; parameters replicated.

Rank r owns chunk r of every bucket (buckets padded to a multiple of the world size N).
Three variants share this file and differ only in bucket size and launch time:

- ``zero2``: buckets of about ``--bucket-mb``, reduce-scatters launched from the
  gradient hooks during backward;
- ``zero2-step``: one bucket per parameter, every reduce-scatter launched at the start
  of ``step()`` in parameter order, then waited for in that same order (the DistAdam
  of modded-nanogpt before its hook rewrite);
- ``zero2-hook``: one bucket per parameter, each reduce-scatter launched from that
  parameter's ``register_post_accumulate_grad_hook`` as soon as backward produces its
  gradient, and the step walks parameters in *reverse* order, the order in which their
  reductions were launched and therefore finish.

Communication phases of one step, in order:

1. **forward**: none; every rank holds all parameters.
2. **backward**: autograd accumulates each gradient into its bucket's full-size buffer.
   ``zero2`` and ``zero2-hook`` launch ``reduce_scatter B<k>`` (average) into this
   rank's chunk-sized gradient shard as each bucket completes; ``zero2-step`` launches
   nothing yet, so the communication cannot overlap backward.
3. **optimizer**: per bucket, wait for its reduce-scatter, free the full-size bucket
   (only the shard survives the step: that is ZeRO-2's memory saving), run AdamW on this
   rank's chunk of the parameters, and launch ``all_gather B<k>`` of the updated chunk.
   The step ends when every gather has arrived.

Per-rank model states (fp32): params 4Ψ + grads 4Ψ/N + Adam 8Ψ/N; with LoRA the buckets hold
the trainable adapters alone (Ψ_t): 4Ψ + 4Ψ_t/N + 8Ψ_t/N, frozen weights held whole.  The full-size
gradient buckets exist only between backward and the reduce-scatter and are recorded
as ``buffers``.
"""

from __future__ import annotations

import torch

from zero_sim.vocabulary import ALL_GATHER, BUFFERS, REDUCE_SCATTER, bucket_collective, opt

from .base import (
    AdamState,
    Flat,
    InOrder,
    Strategy,
    bucketize,
    free,
    model_state_bytes,
    realloc,
)


class ZeRO2(Strategy):
    name = "zero2"
    stage = 2
    per_param = False
    launch_in_step = False

    def setup(self) -> None:
        params = self.trainable  # frozen weights (LoRA) have no gradient to shard: held whole, outside
        groups = bucketize(params, 0) if self.per_param else bucketize(params, self.bucket_bytes,
                                                                          self.first_bucket_bytes)
        self.flats = [Flat(g, k, self.layer_of[g[0]], self.world, self.rank) for k, g in enumerate(groups)]
        for f in self.flats:
            f.bind()
            f.bind_grads()
            free(f.grad)
        self.grad_shards = [torch.zeros_like(f.mine(f.data)) for f in self.flats]
        self.adam = [AdamState(f.mine(f.data), self.hp) for f in self.flats]
        self.pending = [None] * len(self.flats)
        self.launcher = InOrder(self.flats, self.launch)

    def zero_grad(self) -> None:
        for f in self.flats:
            realloc(f.grad)
            f.grad.zero_()
            self.rec.add_memory(BUFFERS, f.nbytes)
        self.launcher.reset()

    def grad_ready(self, p) -> None:
        if not self.launch_in_step:
            self.launcher.ready(p)

    def launch(self, f: Flat) -> None:
        name = bucket_collective(REDUCE_SCATTER, f.index)
        self.pending[f.index] = self.reduce_scatter(self.grad_shards[f.index], f.grad, name, f.layer)

    def step(self) -> None:
        if self.launch_in_step:
            order = self.flats[::-1]  # parameter order
            for f in order:
                self.launch(f)
        else:
            self.launcher.flush()
            order = self.flats  # reverse parameter order: the order the hooks launched them
        gathers = []
        for f in order:
            self.pending[f.index].wait()
            free(f.grad)
            self.rec.add_memory(BUFFERS, -f.nbytes)
            mine = f.mine(f.data)
            with self.rec.span(opt(f"B{f.index}"), f.layer, mine.nbytes):
                self.adam[f.index].update(mine, self.grad_shards[f.index])
            gathers.append(self.all_gather(f.data, mine, bucket_collective(ALL_GATHER, f.index), f.layer))
        for g in gathers:
            g.wait()

    def full_optimizer_state(self) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        return self.gathered_moments()

    def model_state_bytes(self) -> dict[str, int]:
        return model_state_bytes(
            params=sum(f.nbytes for f in self.flats) + self.frozen_bytes,
            grads=sum(g.nbytes for g in self.grad_shards),
            optimizer=sum(a.nbytes for a in self.adam),
        )


class ZeRO2Step(ZeRO2):
    name = "zero2-step"
    per_param = True
    launch_in_step = True


class ZeRO2Hook(ZeRO2):
    name = "zero2-hook"
    per_param = True
    launch_in_step = False
