"""ZeRO-2: shard the gradients as well as the optimizer state (Modded-NanoGPT's DistAdam).

The DistAdam of the blog post 'A Thousand Ways to Write ZeRO-2: Setting a New Modded-NanoGPT
Record' and of its pull request 'Adam Gradient Sync in Backward Hooks'.

ZeRO-1's step, but each rank keeps only the reduced ``1/N`` slice of the gradients.  One
step on one rank:

1. forward;
2. backward; each unit's gradient (a tensor when ``bucket_mb = 0``, else a bucket) is
   reduce-scattered and its unsharded copy freed once that finishes.  *When* the
   reduce-scatter is launched is the ``zero2_launch`` knob:

   * ``hook``: from the post-accumulate-grad hook, the moment the unit's last gradient
     exists, so reduce-scatters overlap the rest of backward; the step then walks the
     units in reverse order, the order their reduce-scatters finish;
   * ``step``: all at the start of ``optimizer.step()``, after backward, in parameter
     order; the step waits for each in turn.  Because the comm stream is a FIFO queue,
     every all-gather launched by the step queues behind *all* the reduce-scatters, and
     each slice's update waits for its own reduce-scatter: compute sits idle in between
     (the blog post);
   * ``compiled_backward``: a compiled backward graph runs its hooks only when the whole
     graph finishes, so ``hook`` launches collapse to the end of backward (the blog post).

3. optimizer on each slice, then ``all_gather`` of the unit's updated weights, unit by
   unit in the order the reduce-scatters were launched (ZeRO-1's step).

Memory: ``2 Psi`` weights + ``(2 + K) Psi / N`` sharded gradients and optimizer state,
plus the unsharded gradients that wait for their reduce-scatter (``buffers``): with
``step`` launches they all wait until backward ends, with ``hook`` only a few at a time.
"""

from __future__ import annotations

from zero_sim.strategies.base import Alloc, Knob, Step, Strategy
from zero_sim.strategies.buckets import (
    Bucket,
    GradientBuckets,
    flat_bucket_states,
    offload_slice,
    update_slices_then_gather,
)
from zero_sim.strategies.capabilities import DEEPSPEED, Capabilities, PlacementRule
from zero_sim.strategies.states import ModelStates
from zero_sim.system.workload import Layer
from zero_sim.vocabulary import BUFFERS, REDUCE_SCATTER
from zero_sim.vocabulary.buckets import DEFAULT_BUCKET_MB


class ZeRO2Step(Step):
    """ZeRO-1's step with reduce-scatters that free the unsharded gradients, launched per ``zero2_launch``."""


    def setup(self) -> None:
        knobs = self.ctx.knobs
        self.buckets = GradientBuckets(self.ctx)
        self.per_tensor = knobs.bucket_mb == 0  # DDP's plan at 0 MB: one unit per tensor
        self.hook = knobs.zero2_launch == "hook"
        self.compiled = knobs.compiled_backward

    def trainable_units(self) -> tuple[int, ...]:
        """Each unit is sharded on its own: rank r owns chunk r of every unit (the buckets hold what
        trains)."""
        return tuple(bucket.numel for bucket in self.buckets.plan)

    def model_states(self) -> ModelStates:
        return flat_bucket_states(self, self.trainable_units())

    def label(self, bucket: Bucket) -> str:
        """A per-tensor unit is named after its layer (``reduce_scatter L5``), a bucket ``B<k>``."""
        return f"L{bucket.layers[0]}" if self.per_tensor else f"B{bucket.index}"

    def reduce(self, bucket: Bucket, deps: tuple[int, ...]) -> None:
        """Reduce-scatter one unit; its unsharded gradient is freed once the collective has landed."""
        freed = ((BUFFERS, self.buckets.nbytes(bucket)),)
        reduced = self.buckets.reduce(self.b, REDUCE_SCATTER, bucket, self.label(bucket), deps, free=freed)
        offload_slice(self, bucket, self.label(bucket), reduced)

    def before_forward(self, layer: Layer) -> tuple[int, ...]:
        return self.buckets.take_blocking()  # without overlap_comm, the reductions issued before it

    def before_backward(self, layer: Layer) -> tuple[int, ...]:
        return self.buckets.take_blocking()

    def backward_allocs(self, layer: Layer) -> Alloc:
        """Unsharded gradients live until their reduce-scatter: every micro-step with hooks,
        accumulated locally until step() otherwise (allocated once, by the first)."""
        if self.hook or self.micro == 0:
            return ((BUFFERS, layer.trainable_numel * self.p.grad_bytes),) if layer.trainable_numel else ()
        return ()

    def after_backward(self, layer: Layer, op: int) -> None:
        """``hook`` launches: from the post-accumulate-grad hooks, every micro-step (DeepSpeed
        reduces each micro-batch), unless the backward is compiled."""
        self.last_backward = op
        if self.hook and not self.compiled:
            for bucket in self.buckets.filled_by(layer):
                self.reduce(bucket, (op,))

    def micro_step(self) -> None:
        """A compiled backward runs the hooks, in the order they would have run, once it ends."""
        super().micro_step()
        if self.hook and self.compiled:
            for unit in self.buckets.plan:
                self.reduce(unit, (self.last_backward,))

    def optimizer(self) -> None:
        """``step`` launches every reduce-scatter at the start of step(), in parameter order;
        then ZeRO-1's sliced update and all-gather, unit by unit in launch order."""
        if not self.hook:
            for unit in reversed(self.buckets.plan):
                self.reduce(unit, ())
        update_slices_then_gather(self, self.buckets, self.label)

    def note(self) -> str:
        return (f"{len(self.buckets.plan)} reduce-scatter units "
                f"({'per tensor' if self.per_tensor else 'buckets'}), "
                f"launched from {'backward hooks' if self.hook else 'step()'}"
                + (" at the end of a compiled backward" if self.hook and self.compiled else ""))


class ZeRO2(Strategy):
    name = "zero2"
    label = "ZeRO-2"
    summary = "shard optimizer state and gradients; reduce-scatter gradients, all-gather weights"
    can = Capabilities(stage=2, library=DEEPSPEED, placement=PlacementRule(params="never"))
    knobs = (
        Knob("bucket_mb", DEFAULT_BUCKET_MB, "reduce bucket cap in MiB (first bucket 1 MiB at the default); "
             "0 = one reduce-scatter per tensor", ge=0, le=2**20),
        Knob("zero2_launch", "hook", "launch reduce-scatters from backward hooks or in step()", str,
             ("hook", "step")),
        Knob("compiled_backward", False, "backward is one compiled graph: hooks fire only when it ends",
             bool),
        Knob("overlap_comm", True, "reduce on a side stream beside backward (DeepSpeed overlap_comm, whose "
             "default is off for stages 1 and 2); off: on the compute stream, which waits for each", bool),
    )
    Step = ZeRO2Step

