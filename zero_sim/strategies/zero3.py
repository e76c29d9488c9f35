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

from zero_sim.strategies.base import Alloc, Context, Knob, Step, Strategy, StrategyError, shard
from zero_sim.system.workload import Layer
from zero_sim.vocabulary import (
    ALL_GATHER,
    BACKWARD,
    BUFFERS,
    COMM,
    FORWARD,
    PARAMS,
    REDUCE_SCATTER,
    fetch,
    layer_collective,
    wait,
)

MIB = 1024 * 1024


class Pass:
    """One pass over the layers (forward, or backward) in the order they compute."""

    def __init__(self, order: list[Layer], phase: str):
        self.order, self.phase = order, phase
        self.position = {layer.index: k for k, layer in enumerate(order)}
        self.pending: dict[int, list[int]] = {}  # layer -> its gather ops, once issued in this pass
        self.live: dict[int, int] = {}  # layer -> elements gathered ahead and not yet computing


class ZeRO3Step(Step):
    """Gather each layer before it computes (prefetching ahead), free it after, reduce-scatter its
    gradients; the optimizer updates the local slice."""

    stage = 3

    def setup(self) -> None:
        ctx, w = self.ctx, self.w
        self.threshold = ctx.knob("param_persistence_threshold")
        self.persistent = sum(t.numel for layer in w.layers for t in layer.tensors
                              if t.numel < self.threshold)
        self.gathered = {layer.index: self.gathered_tensors(layer) for layer in w.layers}
        self.numel = {i: sum(sizes) for i, sizes in self.gathered.items()}
        self.fine = ctx.knob("fine_grained_sync")
        self.batch = ctx.knob("batch_collectives")
        self.issued: list[int] = []  # every comm op of every micro-step so far: what a coarse sync waits for
        self.reduces: list[int] = []  # every micro-step's reduce-scatters: what the optimizer waits for
        self.pass_: Pass | None = None

    def gathered_tensors(self, layer: Layer) -> list[int]:
        """Sizes of the tensors ``layer`` must gather: its own, plus any it reads (tied weights),
        except those small enough to persist whole on every rank."""
        sizes = [t.numel for t in layer.tensors if t.numel >= self.threshold]
        if layer.reads_layer is not None:
            sizes += [t.numel for t in self.w.layers[layer.reads_layer].tensors if t.numel >= self.threshold]
        return sizes

    def resident(self) -> dict[str, int]:
        """Stage 3's shards, except that persistent tensors are held whole on every rank:
        only the rest of the weights is sharded."""
        states = super().resident()
        psi, n, persistent = self.w.params, self.n, self.persistent
        states[PARAMS] += self.p.param_bytes * (persistent + shard(psi - persistent, n) - shard(psi, n))
        return states

    # --- forward and backward: gather before, free after ------------------------------------

    def forward(self) -> None:
        self.pass_ = Pass(list(self.w.layers), FORWARD)
        super().forward()

    def backward(self) -> None:
        self.pass_ = Pass(list(reversed(self.w.layers)), BACKWARD)
        super().backward()

    def before_forward(self, layer: Layer) -> tuple[int, ...]:
        return self.fetch(layer)

    def before_backward(self, layer: Layer) -> tuple[int, ...]:
        """Gathered again: forward freed it."""
        return self.fetch(layer)

    def forward_frees(self, layer: Layer) -> Alloc:
        return self.release(layer)

    def backward_frees(self, layer: Layer) -> Alloc:
        return self.release(layer)

    def release(self, layer: Layer) -> Alloc:
        """The gathered copy is dropped as soon as the layer has computed."""
        return ((BUFFERS, self.numel[layer.index] * self.p.param_bytes),)

    def backward_allocs(self, layer: Layer) -> Alloc:
        """The layer's unsharded gradients, until their reduce-scatter lands."""
        return ((BUFFERS, layer.numel * self.p.grad_bytes),)

    def after_backward(self, layer: Layer, op: int) -> None:
        """Reduce-scatter the layer's gradients (one flat collective, or one per tensor)."""
        sizes = [layer.numel] if self.batch else [t.numel for t in layer.tensors]
        for size in sizes:
            if size == 0:
                continue
            nbytes = size * self.p.grad_bytes
            rs = self.b.collective(REDUCE_SCATTER, layer_collective(REDUCE_SCATTER, layer.index), nbytes,
                                   BACKWARD, layer=layer.index, deps=(op,), free=((BUFFERS, nbytes),))
            self.reduces.append(rs)
            self.issued.append(rs)

    def optimizer(self) -> None:
        """The local ``1/N`` of every layer, once every reduce-scatter has landed; nothing to gather
        afterwards (the next forward does)."""
        self.update_layers(tuple(self.reduces), share=1.0 / self.n)

    # --- fetching ----------------------------------------------------------------------------

    def fetch(self, layer: Layer) -> tuple[int, ...]:
        """Before a layer computes: decide what to fetch, gather it and what may be prefetched,
        and return what its compute waits for."""
        ctx, ps = self.ctx, self.pass_
        if not ctx.knob("precomputed_fetch"):  # Python walks the module tree, issuing nothing meanwhile
            self.b.host(fetch(layer.index), ps.phase, ctx.knob("fetch_decision_us") * 1e-6, layer=layer.index)
        self.gather_ahead(layer)
        ps.live.pop(layer.index, None)
        own = tuple(ps.pending.get(layer.index, ()))
        if self.fine:  # wait on the gather's own event
            return own
        if self.issued:  # coarse: the host waits for everything on the comm stream so far
            self.b.sync(wait(COMM), ps.phase, tuple(self.issued))
        return ()

    def gather_ahead(self, layer: Layer) -> None:
        """Gather ``layer`` and up to ``prefetch`` layers after it, stopping at DeepSpeed's limits."""
        ps = self.pass_
        k = ps.position[layer.index]
        for j in range(k, min(k + self.ctx.knob("prefetch") + 1, len(ps.order))):
            li = ps.order[j].index
            if li in ps.pending or self.numel[li] == 0:
                continue
            if j > k and not self.may_prefetch(li, k):
                break
            ps.pending[li] = self.gather(li)
            ps.live[li] = self.numel[li]

    def may_prefetch(self, li: int, k: int) -> bool:
        """DeepSpeed's limits on a prefetch of layer ``li`` while position ``k`` computes: MiB of
        weights gathered ahead (``prefetch_bucket_mb``), elements gathered at once (``max_live_params``)."""
        ps, numel = self.pass_, self.numel
        ahead = sum(numel[x] for x in ps.pending if ps.position[x] > k) + numel[li]
        cap = self.ctx.knob("prefetch_bucket_mb") * MIB / self.p.param_bytes
        if cap and ahead > cap:
            return False
        return sum(ps.live.values()) + numel[li] <= self.ctx.knob("max_live_params")

    def gather(self, li: int) -> list[int]:
        """All-gather layer ``li``'s partitioned tensors: one flat collective, or one per tensor."""
        sizes = [sum(self.gathered[li])] if self.batch else self.gathered[li]
        ops = []
        for size in sizes:
            if size == 0:
                continue
            nbytes = size * self.p.param_bytes
            ops.append(self.b.collective(ALL_GATHER, layer_collective(ALL_GATHER, li), nbytes,
                                         self.pass_.phase, layer=li, alloc=((BUFFERS, nbytes),)))
        self.issued.extend(ops)
        return ops

    def note(self) -> str:
        decided = "precomputed" if self.ctx.knob("precomputed_fetch") else "made in Python per layer"
        return (f"{self.persistent:,} parameters persistent (< {self.threshold:,} elements per tensor); "
                f"{'batched' if self.batch else 'per-tensor'} collectives, "
                f"{'fine-grained' if self.fine else 'whole-stream'} sync, "
                f"fetch decisions {decided}")


class ZeRO3(Strategy):
    name = "zero3"
    summary = "shard weights, gradients and optimizer state; all-gather each layer before use"
    knobs = (
        Knob("prefetch", 1, "layers gathered ahead of the one computing", int),
        Knob("prefetch_bucket_mb", 0.0, "cap on MiB of weights gathered ahead (0: no cap)"),
        Knob("max_live_params", 1_000_000_000, "cap on elements gathered at once (DeepSpeed default 1e9)",
             int),
        Knob("param_persistence_threshold", 100_000, "tensors below this many elements stay whole", int),
        Knob("batch_collectives", True, "one flat collective per layer instead of one per tensor", bool),
        Knob("fine_grained_sync", True, "wait on each gather's own event, not the whole comm stream", bool),
        Knob("precomputed_fetch", True, "fetch decisions computed once, not in Python every layer", bool),
        Knob("fetch_decision_us", 500.0,
             "host time per layer per pass when fetch decisions are not precomputed"),
    )
    Step = ZeRO3Step

    def validate(self, ctx: Context) -> None:
        for name in ("prefetch", "prefetch_bucket_mb", "max_live_params", "param_persistence_threshold",
                     "fetch_decision_us"):
            if ctx.knob(name) < 0:
                flag = "--" + name.replace("_", "-")
                raise StrategyError(f"{flag} must not be negative for zero3, got {ctx.knob(name)}")
