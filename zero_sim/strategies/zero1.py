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

from zero_sim.strategies.base import Knob, Step, Strategy
from zero_sim.strategies.buckets import (
    GradientBuckets,
    flat_bucket_states,
    offload_slice,
    update_slices_then_gather,
)
from zero_sim.strategies.capabilities import DEEPSPEED, Capabilities, PlacementRule
from zero_sim.strategies.states import ModelStates
from zero_sim.system.workload import Layer
from zero_sim.vocabulary import ALL_REDUCE, BUFFERS, REDUCE_SCATTER
from zero_sim.vocabulary.buckets import DEFAULT_BUCKET_MB


class ZeRO1Step(Step):
    """Reduce buckets as DDP does; the step updates this rank's slice of each and gathers it."""


    def setup(self) -> None:
        self.buckets = GradientBuckets(self.ctx)
        self.kind = ALL_REDUCE if self.ctx.knobs.zero1_reduce == "all_reduce" else REDUCE_SCATTER

    def trainable_units(self) -> tuple[int, ...]:
        """Each gradient bucket is sharded on its own: rank r owns chunk r of every bucket (the
        buckets hold what trains)."""
        return tuple(bucket.numel for bucket in self.buckets.plan)

    def model_states(self) -> ModelStates:
        return flat_bucket_states(self, self.trainable_units())

    def before_forward(self, layer: Layer) -> tuple[int, ...]:
        return self.buckets.take_blocking()  # without overlap_comm, the reductions issued before it

    def before_backward(self, layer: Layer) -> tuple[int, ...]:
        return self.buckets.take_blocking()

    def after_backward(self, layer: Layer, op: int) -> None:
        """On the last micro-step (``no_sync`` before it), reduce each bucket the layer fills,
        into a scratch buffer held for its collective only (DeepSpeed's reduce buckets)."""
        if self.last_micro:
            for bucket in self.buckets.filled_by(layer):
                scratch = ((BUFFERS, self.buckets.nbytes(bucket)),)
                reduced = self.buckets.reduce(self.b, self.kind, bucket, f"B{bucket.index}", (op,), scratch,
                                              scratch)
                offload_slice(self, bucket, f"B{bucket.index}", reduced)

    def optimizer(self) -> None:
        update_slices_then_gather(self, self.buckets, lambda bucket: f"B{bucket.index}")

    def note(self) -> str:
        return (f"{len(self.buckets.plan)} gradient buckets reduced by {self.kind}; each bucket's slice "
                f"updated and all-gathered as soon as its reduction lands")


class ZeRO1(Strategy):
    name = "zero1"
    label = "ZeRO-1"
    summary = "shard optimizer state; reduce gradients as DDP; all-gather updated weights"
    can = Capabilities(stage=1, library=DEEPSPEED, placement=PlacementRule(params="never"))
    knobs = (
        Knob("bucket_mb", DEFAULT_BUCKET_MB, "gradient bucket cap in MiB", gt=0, le=2**20),
        Knob("zero1_reduce", "reduce_scatter", "how gradient buckets are reduced", str,
             ("reduce_scatter", "all_reduce")),
        Knob("overlap_comm", True, "reduce on a side stream beside backward (DeepSpeed overlap_comm, whose "
             "default is off for stages 1 and 2); off: on the compute stream, which waits for each", bool),
    )
    Step = ZeRO1Step

