"""What the bucketed strategies (DDP, ZeRO-1, ZeRO-2) share: gradient buckets, and a backward
that reduces each bucket as soon as it fills.

Buckets are laid out in *reverse* parameter order, so they fill in the order backward
produces gradients; the real runs cut the same model into the same buckets
(``bucketize`` there, :func:`zero_sim.vocabulary.buckets.fill_buckets` for both).

Every collective here is issued from the host with the compute stream current (a backward
hook, or the step after the update it gathers), so it follows the compute issued before it:
the program's default ``after_compute=True`` (see ``zero_sim/engine/program.py``).

A reduction runs beside compute unless the strategy's ``overlap_comm`` knob is off
(DeepSpeed stages 1 and 2, whose default it is): then DeepSpeed reduces on the compute
stream itself (``stage_1_and_2.py``, ``reduce_ipg_grads``), so the compute after it,
the next layer's backward or the next micro-step's forward, waits for it.
"""

from __future__ import annotations

from dataclasses import dataclass

from zero_sim.strategies.base import Alloc, Context, Step
from zero_sim.system.workload import Layer, Workload
from zero_sim.vocabulary import ALL_REDUCE, BACKWARD
from zero_sim.vocabulary.buckets import bucket_caps, fill_buckets


@dataclass(frozen=True)
class Bucket:
    index: int
    layers: tuple[int, ...]  # layer indices with tensors in this bucket, in the order they fill
    numel: int
    ready_after_layer: int  # the bucket is full once this layer's backward has run


def buckets(workload: Workload, cap_bytes: float, bytes_per_elem: int,
            first_cap_bytes: float | None = None) -> list[Bucket]:
    """The workload's tensors in gradient buckets by the shared rule
    (:func:`zero_sim.vocabulary.buckets.fill_buckets`), taken in reverse parameter order."""
    order = [(layer.index, tensor.numel) for layer in reversed(workload.layers)
             for tensor in reversed(layer.tensors)]
    plan = fill_buckets([numel * bytes_per_elem for _, numel in order], cap_bytes, first_cap_bytes)
    result = []
    for index, positions in enumerate(plan):
        layers = tuple(dict.fromkeys(order[i][0] for i in positions))  # in the order they fill
        result.append(Bucket(index, layers, sum(order[i][1] for i in positions), layers[-1]))
    return result


def gradient_buckets(ctx: Context) -> list[Bucket]:
    """The gradient buckets of every bucketed strategy (DDP, ZeRO-1, ZeRO-2), one plan for all,
    as the real runs share ``bucketize``: ``--bucket-mb`` cap, first bucket per :func:`bucket_caps`."""
    cap, first = bucket_caps(ctx.knob("bucket_mb"))
    return buckets(ctx.workload, cap, ctx.precision.grad_bytes, first)


class BucketedStep(Step):
    """Forward and backward of every micro-step; each bucket's reduction is launched from the
    backward hook of the layer that fills it.  ``reductions`` holds each bucket's latest
    reduction op by bucket index, in the order they were first launched."""

    kind = ALL_REDUCE  # the collective that reduces a bucket

    def setup(self) -> None:
        self.plan = gradient_buckets(self.ctx)
        self.ready: dict[int, list[Bucket]] = {}  # layer -> the buckets its backward completes
        for bucket in self.plan:
            self.ready.setdefault(bucket.ready_after_layer, []).append(bucket)
        self.reductions: dict[int, int] = {}
        self.blocking: tuple[int, ...] = ()  # without overlap_comm: reductions the next compute waits for

    def overlaps_compute(self) -> bool:
        """Reductions run on a side stream (DDP always; DeepSpeed with ``overlap_comm``)."""
        return self.ctx.knobs.get("overlap_comm", True)

    def before_forward(self, layer: Layer) -> tuple[int, ...]:
        return self.take_blocking()

    def before_backward(self, layer: Layer) -> tuple[int, ...]:
        return self.take_blocking()

    def take_blocking(self) -> tuple[int, ...]:
        """The reductions issued on the compute stream since its last op, which that op follows."""
        blocking, self.blocking = self.blocking, ()
        return blocking

    def reduce_in_backward(self) -> bool:
        """Gradients accumulate locally (``no_sync``) until the last micro-step."""
        return self.last_micro

    def reduction_memory(self, nbytes: int) -> tuple[Alloc, Alloc]:
        """(alloc, free) of a bucket's reduction: none here, the buckets are resident."""
        return (), ()

    def label(self, bucket: Bucket) -> str:
        """Ops on a bucket are named after it: ``all_reduce B3``, ``opt B3``."""
        return f"B{bucket.index}"

    def after_backward(self, layer: Layer, op: int) -> None:
        if self.reduce_in_backward():
            for bucket in self.ready.get(layer.index, []):
                self.reduce(bucket, (op,))

    def reduce(self, bucket: Bucket, deps: tuple[int, ...]) -> None:
        nbytes = bucket.numel * self.p.grad_bytes
        alloc, free = self.reduction_memory(nbytes)
        self.reductions[bucket.index] = self.b.collective(
            self.kind, f"{self.kind} {self.label(bucket)}", nbytes, BACKWARD, layer=bucket.ready_after_layer,
            deps=deps, alloc=alloc, free=free)
        if not self.overlaps_compute():
            self.blocking += (self.reductions[bucket.index],)
