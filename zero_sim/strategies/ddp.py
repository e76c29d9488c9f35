"""DDP: every rank keeps a full replica; gradients are all-reduced in buckets during backward.

One step on one rank, in the order the host issues it:

1. **Forward**, layer by layer, saving activations.
2. **Backward**, last layer first.  Gradients land in buckets that were laid out at
   construction in *reverse* parameter order, so buckets fill in the order backward
   produces gradients.  The moment a bucket's last gradient is written, its
   ``all_reduce B<k>`` is enqueued on the comm stream, where it overlaps the backward of
   earlier layers.  torch's default cap is 25 MiB, and the *first* bucket is capped at
   1 MiB (only when the cap is left at its default) so that communication starts early.
   Tiny buckets are latency-bound: many launches, each paying the ring's latency
   (the 'GPT Adventures, Part 4: Distribute It' blog post).
3. The comm stream is FIFO: if all-reduces queue up faster than the link drains them,
   the last bucket (the embedding's gradients, produced last) starts late and its
   all-reduce sticks out past the end of backward: that is *exposed* communication.
4. **Optimizer**: the step waits for every bucket's all-reduce, then updates every
   parameter on every rank (no sharding: each rank repeats the same work).

Gradient accumulation: the first ``K-1`` micro-steps run forward and backward with no
communication (``no_sync``); the last one all-reduces.

What an all-reduce waits for: torch's reducer launches it from the autograd hook that marks
the bucket's last gradient ready (``torch/csrc/distributed/c10d/reducer.cpp``:
``Reducer::mark_bucket_ready`` -> ``all_reduce_bucket`` -> ``run_comm_hook``), with the
backward's stream current; ``ProcessGroupNCCL::collective`` then makes the NCCL stream wait
on the current stream (``syncStream``).  So each all-reduce follows the backward compute
issued before it (the program's default, ``after_compute=True``), and the FIFO comm stream
keeps buckets in order.

Memory: weights, gradients and optimizer state are all replicated, ``(2 + 2 + K) Psi``.
Bucket storage is a second copy of the gradients unless ``gradient_as_bucket_view``
(torch's default is a copy).
"""

from __future__ import annotations

from zero_sim.strategies.base import Knob, Step, Strategy
from zero_sim.strategies.buckets import GradientBuckets
from zero_sim.strategies.capabilities import PYTORCH, Capabilities
from zero_sim.strategies.states import ModelStates
from zero_sim.system.workload import Layer
from zero_sim.vocabulary import ALL_REDUCE
from zero_sim.vocabulary.buckets import DEFAULT_BUCKET_MB, bucket_caps


class DDPStep(Step):
    """All-reduce each bucket from the backward hook that fills it (on the last micro-step)."""


    def setup(self) -> None:
        self.buckets = GradientBuckets(self.ctx)

    def model_states(self) -> ModelStates:
        """Stage 0's replicated states, plus the buckets: a second copy of the gradients unless
        the gradients are views into them (the rule counts gradients once)."""
        states = super().model_states()
        if not self.ctx.knobs.gradient_as_bucket_view:
            states.buffers = self.p.grad_bytes * self.w.trainable_params
        return states

    def after_backward(self, layer: Layer, op: int) -> None:
        """Gradients accumulate locally (``no_sync``) until the last micro-step, which reduces
        each bucket as the layer filling it finishes its backward."""
        if self.last_micro:
            for bucket in self.buckets.filled_by(layer):
                self.buckets.reduce(self.b, ALL_REDUCE, bucket, f"B{bucket.index}", (op,))

    def optimizer(self) -> None:
        """torch's optimizer step follows backward(), whose finalisation makes the compute
        stream wait for every bucket: each layer's update waits for all of them."""
        self.update_layers(tuple(self.buckets.reductions.values()))

    def note(self) -> str:
        bucket_mb = self.ctx.knobs.bucket_mb
        return (f"{len(self.buckets.plan)} gradient buckets (cap {bucket_mb} MiB"
                + (", first 1 MiB)" if bucket_caps(bucket_mb)[1] else ")"))


class DDP(Strategy):
    name = "ddp"
    label = "DDP"
    summary = "replicate everything; all-reduce gradient buckets during backward"
    can = Capabilities(stage=0, library=PYTORCH, cannot_place=(
        "DDP replicates every model state on every GPU and cannot offload them; use --strategy zero2 "
        "--offload-optimizer cpu (ZeRO-Offload), or zero3 / fsdp"))
    knobs = (
        Knob("bucket_mb", DEFAULT_BUCKET_MB,
             "gradient bucket cap in MiB (torch default 25; first bucket 1 MiB)", gt=0, le=2**20),
        Knob("gradient_as_bucket_view", False, "gradients are views into the buckets (no second copy)", bool),
    )
    Step = DDPStep

