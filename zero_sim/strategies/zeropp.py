"""ZeRO++, a plug-in of the transfers (:mod:`zero_sim.strategies.transfers`): how ZeRO-3's bytes
travel when any of ``zero_quantized_weights``, ``zero_hpz_partition_size`` or
``zero_quantized_gradients`` is on, with its settings (:data:`ZEROPP_KNOBS`) and refusals.

What each part sends, computes and holds is :mod:`zero_sim.system.zeropp` (with its sources);
this module places it in the step, where DeepSpeed's stage 3 does:

* a weight all-gather (``gather``) runs over all ranks, or over the secondary partition's
  ``k`` ranks for weights that have a secondary copy; with qwZ it is two all-gathers (int8
  data, then fp32 scales), the quantize kernel charged to the data's on its stream;
* the first wait on a quantized gather (``ready``) dequantizes the whole call's buffer on
  the compute stream before the layer computes (``AllGatherCoalescedHandle.wait``);
* releasing a gathered layer (``released``) first copies its slice into the secondary
  partition (hpZ), on the compute stream, and the host waits for it
  (``current_stream().synchronize()`` in ``_partition_param_sec``); the copies are dropped
  after the optimizer (``optimizer``, ``invalidate_secondary_tensor``);
* a reduce bucket (``reduce``) under qgZ on several nodes: each gradient tensor in turn, its
  four all-to-alls with the quantization kernels on the reduce stream, or a reduce-scatter of
  that tensor alone where DeepSpeed falls back to one.

Memory: the secondary partition is counted in ``params`` (weights); int8 gather buffers and
qgZ's working buffers in ``buffers``.
"""

from __future__ import annotations

from zero_sim.strategies.base import Context, Knob, StrategyError
from zero_sim.strategies.transfers import Bucket, Key, ShardedWeights, WeightTransfers
from zero_sim.system.zeropp import (
    ZeroPP,
    check,
    dequantize_weight_bytes,
    is_vector,
    quantize_weight_bytes,
    quantized_gather_bytes,
    quantized_reduction,
    reduction_buffers,
    secondary_numel,
)
from zero_sim.vocabulary import (
    ALL_GATHER,
    ALL_TO_ALL,
    BACKWARD,
    BUFFERS,
    OPTIMIZER,
    PARAMS,
    REDUCE_SCATTER,
    bucket_collective,
    dequantize,
    layer_collective,
    secondary,
    wait,
)

# ZeRO-3's knobs for ZeRO++, named as DeepSpeed's zero_optimization keys.
ZEROPP_KNOBS = (
    Knob("zero_quantized_weights", False, "ZeRO++ qwZ: weight all-gathers in int8 with fp32 block scales "
         "(DeepSpeed zero_quantized_weights; docs/zeropp.md)", bool),
    Knob("zero_hpz_partition_size", 1, "ZeRO++ hpZ: a secondary copy of the weights sharded over this many "
         "ranks of a node, so gathers after a step's first forward stay in the node; 1: off (DeepSpeed "
         "zero_hpz_partition_size)", int, ge=1, le=4096),
    Knob("zero_quantized_gradients", False, "ZeRO++ qgZ: gradients reduced by int4 all-to-alls, inside the "
         "node then across (DeepSpeed zero_quantized_gradients)", bool),
)


def refuse_zeropp(ctx: Context) -> None:
    """ZeRO++'s settings that are not modelled, refused in one sentence (system/zeropp.py)."""
    refusal = check(ZeroPP.from_knobs(ctx.knobs), ctx.world_size, ctx.gpus_per_node,
                    ctx.compute.gpu.name == "CPU")
    if refusal:
        raise StrategyError(refusal)


class ZeroPlusPlus(WeightTransfers):
    """ZeRO++'s ways for one build of a ZeRO-3 step: quantized and hierarchical gathers, hpZ's
    secondary copies, qgZ's reductions; the rest is the plain transfers'."""

    def __init__(self, s: ShardedWeights):
        super().__init__(s)
        self.parts = ZeroPP.from_knobs(s.ctx.knobs)
        self.r = s.ctx.gpus_per_node
        k = self.parts.hpz
        self.hpz_group = "intra" if k == self.r else f"intra:{k}"
        self.secondary: set[Key] = set()  # weights with a secondary copy, until the optimizer drops them
        self.secondary_bytes = 0
        self.quantized: dict[int, tuple[int, float]] = {}  # gather op -> (elements, int8 + scale bytes)
        self.width = getattr(s.w.shape, "d_model", None)

    @classmethod
    def applies(cls, ctx: Context) -> bool:
        return ZeroPP.from_knobs(ctx.knobs).on

    def describe(self) -> str:
        s = self.s
        parts = self.parts.describe(s.ctx.nodes, s.w.params - s.persistent, s.p.param_bytes)
        return f"; ZeRO++ {parts}" if parts else ""

    # --- gathers ----------------------------------------------------------------------------

    def gather(self, keys: list[Key], phase: str, after_compute: bool) -> list[tuple[list[Key], int]]:
        """All-gather ``keys``: those with a secondary copy among its ``k`` ranks, the rest among all,
        one call each (``__all_gather_params_``); returns each call's keys and the op they wait on."""
        with_copy = [key for key in keys if key in self.secondary]
        without = [key for key in keys if key not in self.secondary]
        calls = []
        for part, group, ranks in ((with_copy, self.hpz_group, self.parts.hpz),
                                   (without, "world", self.s.n)):
            if part:
                calls.append((part, self._call(part, group, ranks, phase, after_compute)))
                after_compute = False
        return calls

    def _call(self, keys: list[Key], group: str, ranks: int, phase: str, after_compute: bool) -> int:
        s, b, pb = self.s, self.s.b, self.s.p.param_bytes
        numel = sum(s.size[key] for key in keys)
        layer = keys[0][0]
        name = layer_collective(ALL_GATHER, layer)
        if not self.parts.quantized_weights:
            return b.collective(ALL_GATHER, name, numel * pb, phase, group=group, layer=layer,
                                deps=s.room, alloc=((BUFFERS, numel * pb),), after_compute=after_compute)
        # Each rank quantizes what it holds of these weights: its shard, or its secondary slice.
        shard = sum(-(-s.size[key] // ranks) for key in keys)
        data, scales = quantized_gather_bytes(shard, ranks)
        seconds = s.ctx.compute.elementwise_time(quantize_weight_bytes(shard, pb))
        b.collective(ALL_GATHER, name, data, phase, group=group, layer=layer, alloc=((BUFFERS, int(data)),),
                     deps=s.room, after_compute=after_compute, seconds=seconds)  # ZeRO3Step.freed_room
        op = b.collective(ALL_GATHER, name, scales, phase, group=group, layer=layer,
                          alloc=((BUFFERS, int(scales)),), after_compute=False)
        self.quantized[op] = (numel, data + scales)
        return op

    def ready(self, ops: tuple[int, ...], phase: str, layer: int) -> None:
        """The first wait on a quantized call dequantizes its whole buffer on the compute stream,
        allocating the weights and freeing the int8 buffer."""
        s = self.s
        for op in ops:
            if op not in self.quantized:
                continue
            numel, held = self.quantized.pop(op)
            pb = s.p.param_bytes
            seconds = s.ctx.compute.elementwise_time(dequantize_weight_bytes(numel, pb))
            s.b.compute(dequantize(layer), phase, seconds, layer=layer, deps=(op,),
                        alloc=((BUFFERS, numel * pb),), free=((BUFFERS, int(held)),))

    # --- hpZ's secondary partition -------------------------------------------------------------

    def released(self, keys: list[Key], layer: int, phase: str) -> None:
        """Released weights without a secondary copy get one: a copy kernel, then the host waits."""
        if self.parts.hpz <= 1:
            return
        new = [key for key in keys if key not in self.secondary]
        if not new:
            return
        s, pb = self.s, self.s.p.param_bytes
        nbytes = sum(secondary_numel(s.size[key], self.parts.hpz) for key in new) * pb
        self.secondary.update(new)
        self.secondary_bytes += nbytes
        op = s.b.compute(secondary(layer), phase, s.ctx.compute.copy_time(2 * nbytes), layer=layer,
                         alloc=((PARAMS, nbytes),))
        s.b.sync(wait(secondary(layer)), phase, (op,))

    def optimizer(self, reduces: tuple[int, ...], update) -> None:
        """The update; after it the secondary copies are stale and dropped (freed when the host drops
        them)."""
        super().optimizer(reduces, update)
        if self.secondary_bytes:
            self.s.b.sync(wait("secondary partition dropped"), OPTIMIZER, (), host_s=0.0,
                          free=((PARAMS, self.secondary_bytes),))
        self.secondary, self.secondary_bytes = set(), 0

    # --- qgZ ------------------------------------------------------------------------------------

    def reduce(self, bucket: Bucket, index: int, layer: int, sizes: list[int],
               after_compute: bool) -> list[int]:
        """qgZ on more than one node: each gradient tensor of the bucket in turn
        (``all_to_all_quant_reduce``); gradients reduced from their own memory go with the last op."""
        if not (self.parts.quantized_gradients and self.s.n > self.r):
            return super().reduce(bucket, index, layer, sizes, after_compute)
        oversize = ((BUFFERS, bucket.oversize_bytes),) if bucket.oversize_bytes else ()
        calls = self._quantized_calls(bucket, index)
        if calls:
            calls[-1]["free"] = calls[-1]["free"] + oversize
        return [self.s.b.collective(c.pop("kind"), c.pop("name"), c.pop("nbytes"), BACKWARD, layer=layer,
                                    deps=(bucket.last_op,), after_compute=after_compute, **c) for c in calls]

    def _quantized_calls(self, bucket: Bucket, index: int) -> list[dict]:
        """Each tensor's four all-to-alls with their kernels, or a reduce-scatter of that tensor alone
        where DeepSpeed falls back to one."""
        s, gb = self.s, self.s.p.grad_bytes
        calls: list[dict] = []
        for numel, tensor in zip(bucket.sizes, bucket.names, strict=True):
            hops = () if is_vector(tensor) else quantized_reduction(numel, s.n, self.r, gb, self.width)
            if not hops:  # DeepSpeed's fallback: this tensor alone, reduce-scattered as without qgZ
                calls.append(dict(kind=REDUCE_SCATTER, name=bucket_collective(REDUCE_SCATTER, index),
                                  nbytes=numel * gb, free=()))
                continue
            work = int(reduction_buffers(numel, self.r))
            for i, hop in enumerate(hops):
                calls.append(dict(kind=ALL_TO_ALL, name=bucket_collective(ALL_TO_ALL, index),
                                  nbytes=hop.nbytes, group=hop.group,
                                  seconds=s.ctx.compute.elementwise_time(hop.kernel_bytes),
                                  alloc=((BUFFERS, work),) if i == 0 else (),
                                  free=((BUFFERS, work),) if i == len(hops) - 1 else ()))
        return calls
