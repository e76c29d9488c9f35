"""ZeRO-3 (DeepSpeed stage 3): shard the weights too; gather each layer just before use.

Each rank keeps ``1/N`` of every weight, gradient and optimizer state, ``(2+2+K) Psi / N``
bytes.  To compute a layer it needs the whole layer, so it all-gathers it, uses it, and
drops it again.  One step on one rank:

1. **Forward**, layer by layer: ``all_gather L<i>`` (plus up to ``prefetch`` layers
   ahead, so the next gather overlaps this layer's compute), then ``fwd L<i>``, then the
   gathered copy is freed.
2. **Backward**, last layer first: gather the layer *again* (it was freed after
   forward), ``bwd L<i>``, free it, and ``reduce_scatter L<i>`` its gradients so each
   rank keeps the sum of its own slice.  Three collectives of ``Psi`` elements per step
   in all: 1.5x the traffic of DDP or ZeRO-2.
3. **Optimizer** on the local slice only; nothing to gather afterwards (next forward does).

What seed 004 changed, each a knob here (with a ``--no-`` form):

* ``batch_collectives``: one flat all-gather / reduce-scatter per layer instead of one per
  tensor; every collective pays a launch and the ring's latency, so many small ones on
  a slow, high-latency network (EFA) waste most of the time;
* ``fine_grained_sync``: a layer's compute waits only on *its own* gather's event.
  Without it the host synchronises with the whole comm stream before every layer, which
  also waits for prefetched gathers and pending reduce-scatters, and the GPU starves
  while the host is blocked;
* ``precomputed_fetch``: the decision of what to fetch, keep or release is made once
  and replayed.  Without it Python walks the module tree before every layer, costing
  ``fetch_decision_us`` of host time per layer per pass, during which nothing is issued.

DeepSpeed's limits: ``param_persistence_threshold`` (tensors smaller than this many
elements stay whole on every rank and are never gathered), ``prefetch_bucket_mb`` (how
many MiB of weights may be gathered ahead) and ``max_live_params`` (elements gathered at
once, beyond which prefetch stops).  Gathered weights and unsharded gradients count as
``buffers``.
"""

from __future__ import annotations

from zero_sim.engine.program import Program, ProgramBuilder
from zero_sim.strategies.base import Context, Knob, Strategy, StrategyError, backward, forward, shard
from zero_sim.strategies.ddp import optimizer_ops
from zero_sim.system.workload import Layer
from zero_sim.vocabulary import (
    ALL_GATHER,
    BACKWARD,
    BUFFERS,
    COMM,
    FORWARD,
    GRADS,
    OPTIMIZER_STATE,
    PARAMS,
    REDUCE_SCATTER,
    fetch,
    layer_collective,
    wait,
)

MIB = 1024 * 1024


class ZeRO3(Strategy):
    name = "zero3"
    summary = "shard weights, gradients and optimizer state; all-gather each layer before use"
    knobs = (
        Knob("prefetch", 1, "layers gathered ahead of the one computing", int),
        Knob("prefetch_bucket_mb", 0.0, "cap on MiB of weights gathered ahead (0: no cap)"),
        Knob("max_live_params", 1_000_000_000, "cap on elements gathered at once (DeepSpeed default 1e9)", int),
        Knob("param_persistence_threshold", 100_000, "tensors below this many elements stay whole", int),
        Knob("batch_collectives", True, "one flat collective per layer instead of one per tensor", bool),
        Knob("fine_grained_sync", True, "wait on each gather's own event, not the whole comm stream", bool),
        Knob("precomputed_fetch", True, "fetch decisions computed once, not in Python every layer", bool),
        Knob("fetch_decision_us", 500.0, "host time per layer per pass when fetch decisions are not precomputed"),
    )

    def validate(self, ctx: Context) -> None:
        for name in ("prefetch", "prefetch_bucket_mb", "max_live_params", "param_persistence_threshold",
                     "fetch_decision_us"):
            if ctx.knob(name) < 0:
                raise StrategyError(f"--{name.replace('_', '-')} must not be negative for zero3, got {ctx.knob(name)}")

    def build(self, ctx: Context) -> Program:
        w, p, n = ctx.workload, ctx.precision, ctx.world_size
        threshold = ctx.knob("param_persistence_threshold")
        persistent = sum(t.numel for layer in w.layers for t in layer.tensors if t.numel < threshold)
        partitioned = w.params - persistent
        b = ProgramBuilder({
            PARAMS: p.param_bytes * (persistent + shard(partitioned, n)),
            GRADS: p.grad_bytes * shard(w.params, n),
            OPTIMIZER_STATE: p.optimizer_bytes * shard(w.params, n),
        })
        gathered = {layer.index: self._gathered_tensors(w, layer, threshold) for layer in w.layers}
        numel = {i: sum(gathered[i]) for i in gathered}
        fine = ctx.knob("fine_grained_sync")
        batch = ctx.knob("batch_collectives")
        issued_comm: list[int] = []

        def gather(layer_index: int, phase: str) -> list[int]:
            sizes = [sum(gathered[layer_index])] if batch else gathered[layer_index]
            ops = []
            for size in sizes:
                if size == 0:
                    continue
                nbytes = size * p.param_bytes
                ops.append(b.collective(ALL_GATHER, layer_collective(ALL_GATHER, layer_index), nbytes, phase,
                                        layer=layer_index, alloc=((BUFFERS, nbytes),)))
            issued_comm.extend(ops)
            return ops

        def run_pass(order: list[Layer], phase: str):
            """Returns hooks for forward()/backward(): gathers with prefetch, then the right wait."""
            position = {layer.index: k for k, layer in enumerate(order)}
            pending: dict[int, list[int]] = {}
            live: dict[int, int] = {}

            def ensure(layer: Layer) -> None:
                k = position[layer.index]
                for j in range(k, min(k + ctx.knob("prefetch") + 1, len(order))):
                    li = order[j].index
                    if li in pending or numel[li] == 0:
                        continue
                    if j > k:  # a prefetch: respect DeepSpeed's limits
                        ahead = sum(numel[x] for x in pending if position[x] > k) + numel[li]
                        cap = ctx.knob("prefetch_bucket_mb") * MIB / p.param_bytes
                        if cap and ahead > cap:
                            break
                        if sum(live.values()) + numel[li] > ctx.knob("max_live_params"):
                            break
                    pending[li] = gather(li, phase)
                    live[li] = numel[li]

            def before(layer: Layer) -> tuple[int, ...]:
                if not ctx.knob("precomputed_fetch"):
                    b.host(fetch(layer.index), phase, ctx.knob("fetch_decision_us") * 1e-6, layer=layer.index)
                ensure(layer)
                live.pop(layer.index, None)
                own = tuple(pending.get(layer.index, ()))
                if fine:
                    return own
                # Coarse: the host waits for everything on the comm stream so far.
                if issued_comm:
                    b.sync(wait(COMM), phase, tuple(issued_comm))
                return ()

            return before

        release = lambda layer: ((BUFFERS, numel[layer.index] * p.param_bytes),)  # noqa: E731
        reduces: list[int] = []
        for _micro in range(ctx.grad_accum):
            forward(b, ctx, before=run_pass(list(w.layers), FORWARD), frees=release)

            def after(layer, bwd_op):
                sizes = [layer.numel] if batch else [t.numel for t in layer.tensors]
                for size in sizes:
                    if size == 0:
                        continue
                    nbytes = size * p.grad_bytes
                    op = b.collective(REDUCE_SCATTER, layer_collective(REDUCE_SCATTER, layer.index), nbytes,
                                      BACKWARD, layer=layer.index, deps=(bwd_op,), free=((BUFFERS, nbytes),))
                    reduces.append(op)
                    issued_comm.append(op)

            backward(b, ctx, before=run_pass(list(reversed(w.layers)), BACKWARD), after=after,
                     grads=lambda layer: ((BUFFERS, layer.numel * p.grad_bytes),), frees=release)
        optimizer_ops(b, ctx, lambda layer: tuple(reduces), share=1.0 / n)
        prog = b.build()
        prog.model_flops = w.model_flops() * ctx.grad_accum
        prog.notes.append(
            f"{persistent:,} parameters persistent (< {threshold:,} elements per tensor); "
            f"{'batched' if batch else 'per-tensor'} collectives, "
            f"{'fine-grained' if fine else 'whole-stream'} sync, "
            f"fetch decisions {'precomputed' if ctx.knob('precomputed_fetch') else 'made in Python per layer'}")
        return prog

    @staticmethod
    def _gathered_tensors(w, layer: Layer, threshold: int) -> list[int]:
        """Sizes of the tensors layer ``layer`` must gather: its own, plus any it reads (tied weights)."""
        sizes = [t.numel for t in layer.tensors if t.numel >= threshold]
        if layer.reads_layer is not None:
            sizes += [t.numel for t in w.layers[layer.reads_layer].tensors if t.numel >= threshold]
        return sizes
