"""FSDP: ZeRO-3's idea with PyTorch's unit of sharding, the *wrap unit*.

Parameters are grouped into units (by default one per transformer block, plus a *root*
unit holding everything else: embedding, final norm, head).  A unit is the grain of
communication: one all-gather before it computes, one reduce-scatter of its gradients.
One step on one rank:

1. **Forward**: gather the root, then for each block unit: ``all_gather L<i>``,
   ``fwd L<i>``, and free the gathered copy if ``reshard_after_forward`` (the default,
   ZeRO-3-like; ``false`` keeps it until backward: more memory, no backward gather,
   ZeRO-2-like traffic).  ``forward_prefetch`` issues the next unit's gather before this
   unit's compute.  ``limit_all_gathers`` (FSDP1's rate limiter) lets at most two
   gathered units exist: before gathering unit ``u`` the host waits until unit ``u-2``
   has been freed.  Without it the host, running ahead of the GPU, would gather every
   unit at once.
2. **Backward**, last unit first: gather it again (when resharded), ``bwd``, free it,
   ``reduce_scatter L<i>`` its gradients.  ``backward_prefetch`` decides where the gather
   of the *next* unit (``u-1``) sits in the comm stream's FIFO queue:

   * ``pre``: issued before unit ``u``'s backward, so it overlaps that compute and is
     ahead of ``u``'s reduce-scatter (most overlap, most memory);
   * ``post``: issued once ``u``'s gradient computation is done, still ahead of its
     reduce-scatter;
   * ``none``: issued when unit ``u-1``'s backward starts, so it queues *behind* ``u``'s
     reduce-scatter and compute waits for both.

3. **Optimizer** on the local shard.

``hybrid``: shard within a node and replicate across nodes (HSDP): gathers and
reduce-scatters use the node's GPUs only, then each node's gradient shard is all-reduced
with the same shard on the other nodes (``comm:inter``, a second stream on another
process group, sharing links with the first).  Memory is sharded over ``G`` GPUs, not N.

Mixed precision: ``param_dtype`` sets the bytes gathered per element, ``reduce_dtype``
the bytes reduced (default: the precision's).
"""

from __future__ import annotations

from dataclasses import dataclass

from zero_sim.engine.program import Program, ProgramBuilder
from zero_sim.strategies.base import Context, Knob, Strategy, StrategyError, backward, forward, shard
from zero_sim.strategies.ddp import optimizer_ops
from zero_sim.vocabulary import (
    ALL_GATHER,
    ALL_REDUCE,
    BACKWARD,
    BUFFERS,
    FORWARD,
    GRADS,
    OPTIMIZER_STATE,
    PARAMS,
    REDUCE_SCATTER,
    layer_collective,
    wait,
)

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}


@dataclass
class Unit:
    index: int
    layers: tuple[int, ...]  # layer indices, forward order
    numel: int
    is_root: bool

    @property
    def label(self) -> int:
        """Collectives are named after the unit's first layer (root: layer 0)."""
        return self.layers[0]


def wrap_units(ctx: Context, wrap: str) -> list[Unit]:
    layers = ctx.workload.layers
    if wrap == "blocks":
        wrapped = [layer.index for layer in layers if layer.kind == "block"]
    elif wrap == "none":
        wrapped = []
    else:
        try:
            wrapped = sorted({int(x) for x in wrap.split(",") if x.strip()})
        except ValueError:
            raise StrategyError(f"--wrap must be 'blocks', 'none' or comma-separated layer indices, got {wrap!r}") \
                from None
        bad = [i for i in wrapped if not 0 <= i < len(layers)]
        if bad:
            raise StrategyError(f"--wrap names layer {bad[0]}, which does not exist: the model has layers "
                                f"0..{len(layers) - 1}")
    root_layers = tuple(layer.index for layer in layers if layer.index not in wrapped)
    units = []
    if root_layers:
        units.append(Unit(0, root_layers, sum(layers[i].numel for i in root_layers), True))
    for i in wrapped:
        units.append(Unit(len(units), (i,), layers[i].numel, False))
    return units


class FSDP(Strategy):
    name = "fsdp"
    summary = "PyTorch FSDP: shard per wrap unit; gather before use, reduce-scatter after backward"
    knobs = (
        Knob("wrap", "blocks", "wrap units: 'blocks' (one per block + root), 'none', or layer indices", str),
        Knob("reshard_after_forward", True, "free gathered weights after forward (re-gather in backward)", bool),
        Knob("backward_prefetch", "pre", "where the next unit's backward gather is issued", str, ("pre", "post", "none")),
        Knob("forward_prefetch", False, "issue the next unit's gather before this unit's forward", bool),
        Knob("limit_all_gathers", True, "at most two gathered units at once (FSDP1 rate limiter)", bool),
        Knob("hybrid", False, "shard within a node, all-reduce across nodes (HSDP)", bool),
        Knob("param_dtype", None, "dtype of gathered weights (default: the precision's)", str, ("bf16", "fp16", "fp32")),
        Knob("reduce_dtype", None, "dtype of reduced gradients (default: param_dtype)", str, ("bf16", "fp16", "fp32")),
    )

    def validate(self, ctx: Context) -> None:
        wrap_units(ctx, ctx.knob("wrap"))
        if ctx.knob("hybrid") and ctx.nodes < 2:
            raise StrategyError("--hybrid needs at least two nodes; raise --gpus or lower --gpus-per-node")

    def build(self, ctx: Context) -> Program:
        w, p = ctx.workload, ctx.precision
        hybrid = ctx.knob("hybrid")
        group = "intra" if hybrid else "world"
        shards = ctx.gpus_per_node if hybrid else ctx.world_size
        gather_bytes = DTYPE_BYTES[ctx.knob("param_dtype")] if ctx.knob("param_dtype") else p.param_bytes
        reduce_bytes = DTYPE_BYTES[ctx.knob("reduce_dtype")] if ctx.knob("reduce_dtype") else gather_bytes
        reshard = ctx.knob("reshard_after_forward")
        units = wrap_units(ctx, ctx.knob("wrap"))
        unit_of = {li: u for u in units for li in u.layers}
        b = ProgramBuilder({
            PARAMS: p.param_bytes * shard(w.params, shards),
            GRADS: p.grad_bytes * shard(w.params, shards),
            OPTIMIZER_STATE: p.optimizer_bytes * shard(w.params, shards),
        })
        gathers: dict[tuple[str, int], int] = {}  # (pass, unit) -> all-gather op
        freed_by: dict[tuple[str, int], int] = {}  # (pass, unit) -> op that frees its gathered copy
        blocks = [u for u in units if not u.is_root]
        roots = [u for u in units if u.is_root]

        def nbytes(u: Unit) -> int:
            return u.numel * gather_bytes

        def gather(u: Unit, phase: str, deps=()) -> None:
            key = (phase, u.index)
            if key in gathers or u.numel == 0:
                return
            if ctx.knob("limit_all_gathers"):
                order = blocks if phase == FORWARD else list(reversed(blocks))
                if u in order:
                    k = order.index(u)
                    older = (phase, order[k - 2].index) if k >= 2 else None
                    if older in freed_by:
                        b.sync(wait("free " + layer_collective(ALL_GATHER, order[k - 2].label)), phase,
                               (freed_by[older],))
            gathers[key] = b.collective(ALL_GATHER, layer_collective(ALL_GATHER, u.label), nbytes(u), phase,
                                        group=group, layer=u.label, deps=deps, alloc=((BUFFERS, nbytes(u)),))

        def landed(phase: str, u: Unit) -> tuple[int, ...]:
            """A prefetch starts once the unit about to compute has its own weights: on one NCCL
            stream that is the FIFO order anyway; gloo, with two calls in flight, would otherwise
            split the link between the two gathers (real_runs' ZeRO-3 waits, then prefetches)."""
            own = gathers.get((phase, u.index))
            return (own,) if own is not None else ()

        last_fwd_layer = {u.index: u.layers[-1] for u in units}
        first_bwd_layer = {u.index: u.layers[0] for u in units}

        def fwd_before(layer):
            u = unit_of[layer.index]
            if layer.index == u.layers[0]:
                gather(u, FORWARD)
                if ctx.knob("forward_prefetch"):  # the next unit to run forward: the first block after the root
                    k = blocks.index(u) + 1 if u in blocks else 0
                    if k < len(blocks):
                        gather(blocks[k], FORWARD, deps=landed(FORWARD, u))
            return (gathers[(FORWARD, u.index)],) if (FORWARD, u.index) in gathers else ()

        def fwd_frees(layer):
            u = unit_of[layer.index]
            if reshard and not u.is_root and layer.index == last_fwd_layer[u.index]:
                return ((BUFFERS, nbytes(u)),)
            return ()

        def fwd_after(layer, op):
            u = unit_of[layer.index]
            if reshard and not u.is_root and layer.index == last_fwd_layer[u.index]:
                freed_by[(FORWARD, u.index)] = op

        bwd_blocks = list(reversed(blocks))

        def needs_bwd_gather(u: Unit) -> bool:
            return reshard and not u.is_root

        def bwd_before(layer):
            u = unit_of[layer.index]
            deps = []
            if layer.index == u.layers[-1]:
                if needs_bwd_gather(u):
                    gather(u, BACKWARD)  # no-op when prefetched
                # 'pre': the next unit to run backward (after the root's head, the last block) is gathered now.
                k = bwd_blocks.index(u) + 1 if u in bwd_blocks else 0
                nxt = bwd_blocks[k] if k < len(bwd_blocks) else None
                if nxt is not None and ctx.knob("backward_prefetch") == "pre" and needs_bwd_gather(nxt):
                    gather(nxt, BACKWARD, deps=landed(BACKWARD, u))
            if (BACKWARD, u.index) in gathers:
                deps.append(gathers[(BACKWARD, u.index)])
            elif (FORWARD, u.index) in gathers:
                deps.append(gathers[(FORWARD, u.index)])
            return tuple(deps)

        def bwd_frees(layer):
            u = unit_of[layer.index]
            if layer.index == first_bwd_layer[u.index] and u.numel:
                return ((BUFFERS, nbytes(u)),)
            return ()

        reduces: list[int] = []

        def bwd_after(layer, op):
            u = unit_of[layer.index]
            if layer.index != first_bwd_layer[u.index] or u.numel == 0:
                return
            freed_by[(BACKWARD, u.index)] = op
            if not u.is_root and ctx.knob("backward_prefetch") == "post":
                k = bwd_blocks.index(u)
                if k + 1 < len(bwd_blocks) and needs_bwd_gather(bwd_blocks[k + 1]):
                    gather(bwd_blocks[k + 1], BACKWARD, deps=(op,))
            grad = u.numel * reduce_bytes
            rs = b.collective(REDUCE_SCATTER, layer_collective(REDUCE_SCATTER, u.label), grad, BACKWARD,
                              group=group, layer=u.label, deps=(op,), free=((BUFFERS, grad),))
            reduces.append(rs)
            if hybrid:
                reduces.append(b.collective(ALL_REDUCE, layer_collective(ALL_REDUCE, u.label),
                                            shard(u.numel, shards) * reduce_bytes, BACKWARD, group="inter",
                                            stream="comm:inter", layer=u.label, deps=(rs,)))

        def bwd_grads(layer):
            u = unit_of[layer.index]
            if layer.index == u.layers[-1] and u.numel:
                return ((BUFFERS, u.numel * reduce_bytes),)
            return ()

        for _micro in range(ctx.grad_accum):
            gathers.clear()
            freed_by.clear()
            reduces.clear()
            forward(b, ctx, before=fwd_before, after=fwd_after, frees=fwd_frees)
            backward(b, ctx, before=bwd_before, after=bwd_after, grads=bwd_grads, frees=bwd_frees)
        optimizer_ops(b, ctx, lambda layer: tuple(reduces), share=1.0 / shards)
        prog = b.build()
        prog.model_flops = w.model_flops() * ctx.grad_accum
        prog.notes.append(f"{len(units)} FSDP units ({len(roots)} root); reshard_after_forward={reshard}; "
                          f"backward_prefetch={ctx.knob('backward_prefetch')}; "
                          f"{'hybrid: shard in node, all-reduce across nodes' if hybrid else 'full shard'}")
        return prog
