"""ZeRO-1: shard the optimizer state; reduce gradients as DDP; all-gather the updated weights.

Every rank still holds the full bf16 weights, so forward and backward are DDP's.  What
changes is who owns which slice of the optimizer: rank ``r`` updates only the ``r``-th
``1/N`` of every parameter, then the updated slices are all-gathered back.  One step:

1. forward, backward; gradient buckets are reduce-scattered so each rank receives the
   sum of its own slice (``zero1_reduce=reduce_scatter``, the ZeRO paper's ``Psi`` on
   the wire), or all-reduced as in DDP (``all_reduce``, ``2 Psi``: simpler, and what
   torch's ZeroRedundancyOptimizer does under DDP);
2. optimizer, bucket by bucket in the order they were reduced: once a bucket's reduction
   has landed, each rank updates its ``1/N`` of it (a ``1/N`` of DDP's optimizer time)
   and launches ``all_gather B<k>`` of the updated slice, so the gathers of early
   buckets overlap the reductions and updates of later ones (as ``real_runs``' ZeRO-1);
3. ``step()`` returns when every gather has landed (DeepSpeed and torch's
   ZeroRedundancyOptimizer both block here).

Memory: ``2 Psi`` weights + ``2 Psi`` gradients + ``K Psi / N`` optimizer, plus each
bucket's scratch buffer (DeepSpeed's reduce buckets) while its reduction runs.
"""

from __future__ import annotations

from zero_sim.strategies.base import Alloc, Knob, Strategy, shard
from zero_sim.strategies.buckets import BucketedStep
from zero_sim.vocabulary import (
    ALL_GATHER,
    ALL_REDUCE,
    BUFFERS,
    GRADS,
    OPTIMIZER,
    PARAMS,
    REDUCE_SCATTER,
    opt,
    wait,
)
from zero_sim.vocabulary.buckets import DEFAULT_BUCKET_MB


class ZeRO1Step(BucketedStep):
    """Reduce buckets as DDP does; the step updates this rank's slice of each and gathers it."""

    stage = 1

    @property
    def kind(self) -> str:
        return ALL_REDUCE if self.ctx.knob("zero1_reduce") == "all_reduce" else REDUCE_SCATTER

    def shard_units(self) -> tuple[int, ...]:
        """Each gradient bucket is sharded on its own: rank r owns chunk r of every bucket."""
        return tuple(bucket.numel for bucket in self.plan)

    def resident(self) -> dict[str, int]:
        """The formula's states, with whatever is held whole (weights; gradients below stage 2)
        kept in the buckets' flat buffers, each padded to a multiple of N so that its slices are
        equal (DeepSpeed pads its flat groups for the same reason)."""
        states = super().resident()
        padded = sum(shard(u, self.n) * self.n for u in self.shard_units())
        states[PARAMS] = self.p.param_bytes * padded
        if self.stage < 2:
            states[GRADS] = self.p.grad_bytes * padded
        return states

    def reduction_memory(self, nbytes: int) -> tuple[Alloc, Alloc]:
        """The bucket is a scratch buffer held for its collective only (DeepSpeed's reduce buckets)."""
        scratch = ((BUFFERS, nbytes),)
        return scratch, scratch

    def optimizer(self) -> None:
        """Per bucket, in the order reductions were launched: update this rank's ``1/N`` once the
        reduction lands, then all-gather the slice; ``step()`` returns when every gather is back."""
        by_index = {bucket.index: bucket for bucket in self.plan}
        gathers = []
        for k, reduction in self.reductions.items():
            bucket, name = by_index[k], self.label(by_index[k])
            seconds = self.ctx.compute.optimizer_time(bucket.numel // self.ctx.world_size)
            update = self.b.compute(opt(name), OPTIMIZER, seconds, layer=bucket.ready_after_layer,
                                    deps=(reduction,))
            gathers.append(self.b.collective(
                ALL_GATHER, f"{ALL_GATHER} {name}", bucket.numel * self.p.param_bytes, OPTIMIZER,
                layer=bucket.ready_after_layer, deps=(update,)))
        self.b.sync(wait(ALL_GATHER), OPTIMIZER, tuple(gathers))

    def note(self) -> str:
        return (f"{len(self.plan)} gradient buckets reduced by {self.kind}; each bucket's slice updated and "
                f"all-gathered as soon as its reduction lands")


class ZeRO1(Strategy):
    name = "zero1"
    summary = "shard optimizer state; reduce gradients as DDP; all-gather updated weights"
    knobs = (
        Knob("bucket_mb", DEFAULT_BUCKET_MB, "gradient bucket cap in MiB", gt=0, le=2**20),
        Knob("zero1_reduce", "reduce_scatter", "how gradient buckets are reduced", str,
             ("reduce_scatter", "all_reduce")),
        Knob("overlap_comm", True, "reduce on a side stream beside backward (DeepSpeed overlap_comm, whose "
             "default is off for stages 1 and 2); off: on the compute stream, which waits for each", bool),
    )
    Step = ZeRO1Step

