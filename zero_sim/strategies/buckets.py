"""What the bucketed strategies (DDP, ZeRO-1, ZeRO-2) share, as pieces each composes: gradient
buckets with the reductions launched on them (:class:`GradientBuckets`), ZeRO-1/2's flat,
padded model states (:func:`flat_bucket_states`) and their sliced update and all-gather
(:func:`update_slices_then_gather`).

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

from dataclasses import dataclass, replace

from zero_sim.engine.program import ProgramBuilder
from zero_sim.strategies.base import Alloc, Context, Step
from zero_sim.strategies.states import ModelStates, shard
from zero_sim.system.workload import Layer, Workload
from zero_sim.vocabulary import ALL_GATHER, BACKWARD, OPTIMIZER, opt, wait
from zero_sim.vocabulary.buckets import bucket_caps, fill_buckets


@dataclass(frozen=True)
class Bucket:
    index: int
    layers: tuple[int, ...]  # layer indices with tensors in this bucket, in the order they fill
    numel: int
    ready_after_layer: int  # the bucket is full once this layer's backward has run


def buckets(workload: Workload, cap_bytes: float, bytes_per_elem: int,
            first_cap_bytes: float | None = None) -> list[Bucket]:
    """The workload's trainable tensors in gradient buckets by the shared rule
    (:func:`zero_sim.vocabulary.buckets.fill_buckets`), taken in reverse parameter order; a frozen
    weight has no gradient, so no bucket holds it (torch's DDP reducer skips it)."""
    order = [(layer.index, tensor.numel) for layer in reversed(workload.layers)
             for tensor in reversed(layer.tensors) if tensor.trainable]
    plan = fill_buckets([numel * bytes_per_elem for _, numel in order], cap_bytes, first_cap_bytes)
    result = []
    for index, positions in enumerate(plan):
        layers = tuple(dict.fromkeys(order[i][0] for i in positions))  # in the order they fill
        result.append(Bucket(index, layers, sum(order[i][1] for i in positions), layers[-1]))
    return result


def gradient_buckets(ctx: Context) -> list[Bucket]:
    """The gradient buckets of every bucketed strategy (DDP, ZeRO-1, ZeRO-2), one plan for all,
    as the real runs share ``bucketize``: ``--bucket-mb`` cap, first bucket per :func:`bucket_caps`."""
    cap, first = bucket_caps(ctx.knobs.bucket_mb)
    return buckets(ctx.workload, cap, ctx.precision.grad_bytes, first)


class GradientBuckets:
    """A bucketed strategy's gradient buckets and the reductions launched on them (DDP, ZeRO-1, ZeRO-2).

    ``reductions`` holds each bucket's latest reduction op by bucket index, in the order they
    were first launched.  Without ``overlap_comm`` a reduction runs on the compute stream, so
    the next compute op follows it: :meth:`take_blocking` hands those ops to it."""

    def __init__(self, ctx: Context):
        self.plan = gradient_buckets(ctx)
        self.grad_bytes = ctx.precision.grad_bytes
        self.travel_bytes = ctx.precision.travel_bytes  # what a reduction sends (--reduce-dtype)
        self.overlap = getattr(ctx.knobs, "overlap_comm", True)  # DDP has no such knob: always beside
        self._filled_by: dict[int, list[Bucket]] = {}  # layer -> the buckets its backward completes
        for bucket in self.plan:
            self._filled_by.setdefault(bucket.ready_after_layer, []).append(bucket)
        self.reductions: dict[int, int] = {}
        self._blocking: tuple[int, ...] = ()

    def filled_by(self, layer: Layer) -> list[Bucket]:
        """The buckets whose last gradient ``layer``'s backward writes."""
        return self._filled_by.get(layer.index, [])

    def nbytes(self, bucket: Bucket) -> int:
        return bucket.numel * self.grad_bytes

    def take_blocking(self) -> tuple[int, ...]:
        """The reductions issued on the compute stream since its last op, which that op follows."""
        blocking, self._blocking = self._blocking, ()
        return blocking

    def reduce(self, b: ProgramBuilder, kind: str, bucket: Bucket, label: str, deps: tuple[int, ...],
               alloc: Alloc = (), free: Alloc = ()) -> int:
        """Issue ``<kind> <label>`` over the bucket's gradients after ``deps``."""
        op = b.collective(kind, f"{kind} {label}", bucket.numel * self.travel_bytes, BACKWARD,
                          layer=bucket.ready_after_layer, deps=deps, alloc=alloc, free=free)
        self.reductions[bucket.index] = op
        if not self.overlap:
            self._blocking += (op,)
        return op


def flat_bucket_states(step: Step, units: tuple[int, ...]) -> ModelStates:
    """ZeRO-1/2 model states: the rule's, with whatever is held whole (weights; gradients
    below stage 2) kept in the buckets' flat buffers, each padded to a multiple of N so that its
    slices are equal (DeepSpeed pads its flat groups for the same reason)."""
    states = Step.model_states(step)
    frozen = step.w.weight_bytes(step.p.param_bytes, trainable=False)  # held whole, outside the buckets
    states.weights = replace(states.weights, units=units, padded=True, stored_bytes=frozen)
    states.grads = replace(states.grads, padded=True)
    return states


def offload_slice(step: Step, bucket: Bucket, label: str, reduction: int) -> None:
    """ZeRO-Offload: copy this rank's slice of the reduced bucket to the host once it lands."""
    if step.host_moves is not None:
        step.host_moves.grads_down(label, shard(bucket.numel, step.n), step.p.grad_bytes, (reduction,),
                                   BACKWARD, bucket.ready_after_layer)


def update_slices_then_gather(step: Step, buckets: GradientBuckets, label) -> None:
    """ZeRO-1/2's ``optimizer.step()``: per bucket, in the order reductions were launched, update
    this rank's ``1/N`` once the reduction lands, then all-gather the slice; ``step()`` returns
    when every gather is back (DeepSpeed and torch's ZeroRedundancyOptimizer both block here).
    Offloaded (ZeRO-Offload), the CPU updates every slice at once after the gradient copies, and
    each updated slice is copied up before its all-gather."""
    by_index = {bucket.index: bucket for bucket in buckets.plan}
    if step.host_moves is not None:
        step.host_moves.update_on_cpu(sum(shard(by_index[k].numel, step.n) for k in buckets.reductions))
    gathers = []
    for k, reduction in buckets.reductions.items():
        bucket, name = by_index[k], label(by_index[k])
        if step.host_moves is not None:
            ready = step.host_moves.params_up(name, shard(bucket.numel, step.n), step.p.param_bytes,
                                              OPTIMIZER, bucket.ready_after_layer)
        else:
            seconds = step.ctx.compute.optimizer_time(bucket.numel // step.ctx.world_size)
            ready = step.b.compute(opt(name), OPTIMIZER, seconds, layer=bucket.ready_after_layer,
                                   deps=(reduction,))
        gathers.append(step.b.collective(
            ALL_GATHER, f"{ALL_GATHER} {name}", bucket.numel * step.p.param_bytes, OPTIMIZER,
            layer=bucket.ready_after_layer, deps=(ready,)))
    step.b.sync(wait(ALL_GATHER), OPTIMIZER, tuple(gathers))
