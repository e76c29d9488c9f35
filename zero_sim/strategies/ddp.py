"""DDP: every rank keeps a full replica; gradients are all-reduced in buckets during backward.

One step on one rank, in the order the host issues it:

1. **Forward**, layer by layer, saving activations.
2. **Backward**, last layer first.  Gradients land in buckets that were laid out at
   construction in *reverse* parameter order, so buckets fill in the order backward
   produces gradients.  The moment a bucket's last gradient is written, its
   ``all_reduce B<k>`` is enqueued on the comm stream, where it overlaps the backward of
   earlier layers.  torch's default cap is 25 MiB, and the *first* bucket is capped at
   1 MiB (only when the cap is left at its default) so that communication starts early.
   Tiny buckets are latency-bound: many launches, each paying the ring's latency (seed 002).
3. The comm stream is FIFO: if all-reduces queue up faster than the link drains them,
   the last bucket (the embedding's gradients, produced last) starts late and its
   all-reduce sticks out past the end of backward: that is *exposed* communication.
4. **Optimizer**: the step waits for every bucket's all-reduce, then updates every
   parameter on every rank (no sharding: each rank repeats the same work).

Gradient accumulation: the first ``K-1`` micro-steps run forward and backward with no
communication (``no_sync``); the last one all-reduces.

Memory: weights, gradients and optimizer state are all replicated, ``(2 + 2 + K) Psi``.
Bucket storage is a second copy of the gradients unless ``gradient_as_bucket_view``
(torch's default is a copy).
"""

from __future__ import annotations

from zero_sim.engine.program import Program, ProgramBuilder
from zero_sim.strategies.base import (
    Bucket,
    Context,
    Knob,
    Strategy,
    StrategyError,
    backward,
    buckets,
    forward,
)
from zero_sim.vocabulary import (
    ALL_REDUCE,
    BACKWARD,
    BUFFERS,
    GRADS,
    OPTIMIZER,
    OPTIMIZER_STATE,
    PARAMS,
    bucket_collective,
    opt,
)
from zero_sim.vocabulary.buckets import DEFAULT_BUCKET_MB, bucket_caps


def gradient_buckets(ctx: Context) -> list[Bucket]:
    """The gradient buckets of every bucketed strategy (DDP, ZeRO-1, ZeRO-2), one plan for all,
    as the real runs share ``bucketize``: ``--bucket-mb`` cap, first bucket per :func:`bucket_caps`."""
    cap, first = bucket_caps(ctx.knob("bucket_mb"))
    return buckets(ctx.workload, cap, ctx.precision.grad_bytes, first)


def optimizer_ops(b: ProgramBuilder, ctx: Context, deps_of_layer, share: float = 1.0,
                  order=None) -> list[int]:
    """One ``opt L<i>`` per layer on the compute stream, each waiting for ``deps_of_layer(layer)``."""
    ops = []
    layers = order if order is not None else ctx.workload.layers
    for layer in layers:
        seconds = ctx.compute.optimizer_time(int(layer.numel * share))
        ops.append(b.compute(opt(layer.index), OPTIMIZER, seconds, layer=layer.index,
                             deps=deps_of_layer(layer)))
    return ops


class DDP(Strategy):
    name = "ddp"
    summary = "replicate everything; all-reduce gradient buckets during backward"
    knobs = (
        Knob("bucket_mb", DEFAULT_BUCKET_MB, "gradient bucket cap in MiB (torch default 25; first bucket 1 MiB)"),
        Knob("gradient_as_bucket_view", False, "gradients are views into the buckets (no second copy)", bool),
    )

    def validate(self, ctx: Context) -> None:
        if ctx.knob("bucket_mb") <= 0:
            raise StrategyError(f"--bucket-mb must be positive for ddp, got {ctx.knob('bucket_mb')}")

    def build(self, ctx: Context) -> Program:
        w, p = ctx.workload, ctx.precision
        psi = w.params
        resident = {PARAMS: p.param_bytes * psi, GRADS: p.grad_bytes * psi,
                    OPTIMIZER_STATE: p.optimizer_bytes * psi}
        if not ctx.knob("gradient_as_bucket_view"):
            resident[BUFFERS] = p.grad_bytes * psi
        b = ProgramBuilder(resident)
        plan = gradient_buckets(ctx)
        all_reduces = tuple(steps_with_bucketed_reduction(b, ctx, plan, ALL_REDUCE, transient_buffers=False).values())
        # torch's optimizer step follows backward(), whose finalisation makes the compute
        # stream wait for every bucket: each layer's update waits for all of them.
        optimizer_ops(b, ctx, lambda layer: all_reduces)
        prog = b.build()
        prog.model_flops = w.model_flops() * ctx.grad_accum
        prog.notes.append(f"{len(plan)} gradient buckets (cap {ctx.knob('bucket_mb')} MiB"
                          + (", first 1 MiB)" if bucket_caps(ctx.knob("bucket_mb"))[1] else ")"))
        return prog


def steps_with_bucketed_reduction(b: ProgramBuilder, ctx: Context, plan, kind: str,
                                  transient_buffers: bool) -> dict[int, int]:
    """Forward and backward of every micro-step; on the last, reduce each bucket as it fills.
    Returns each bucket's reduction op by bucket index, in the order they are launched.

    ``transient_buffers``: the bucket is a scratch buffer allocated for its collective
    (DeepSpeed's reduce buckets) rather than a persistent copy of the gradients (torch DDP).
    """
    ready: dict[int, list] = {}
    for bucket in plan:
        ready.setdefault(bucket.ready_after_layer, []).append(bucket)
    reductions: dict[int, int] = {}
    for micro in range(ctx.grad_accum):
        last = micro == ctx.grad_accum - 1
        forward(b, ctx)

        def after(layer, bwd_op, last=last):
            if not last:  # no_sync: gradients accumulate locally
                return
            for bucket in ready.get(layer.index, []):
                nbytes = bucket.numel * ctx.precision.grad_bytes
                scratch = ((BUFFERS, nbytes),) if transient_buffers else ()
                reductions[bucket.index] = b.collective(kind, bucket_collective(kind, bucket.index), nbytes, BACKWARD,
                                                        layer=layer.index, deps=(bwd_op,), alloc=scratch, free=scratch)

        backward(b, ctx, after=after)
    return reductions
