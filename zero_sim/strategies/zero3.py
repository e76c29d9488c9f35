"""ZeRO-3 (DeepSpeed stage 3): shard the weights too; gather each layer just before use.

Each rank keeps ``1/N`` of every weight, gradient and optimizer state, ``(2+2+K) Psi / N``
bytes.  To compute a layer it needs the whole layer, so it all-gathers it, uses it, and
drops it again.  One step on one rank:

1. **Forward**, layer by layer: fetch the layer (``all_gather`` of what is not already
   gathered), prefetch what comes next, ``fwd L<i>``, then release the gathered copy unless
   it is used again soon.
2. **Backward**, last layer first: fetch the layer again if forward released it,
   ``bwd L<i>``, release it, and put its gradients in the reduce bucket; a full bucket is
   ``reduce_scatter B<k>``-ed so each rank keeps the sum of its own slice.  Without reuse,
   three collectives of ``Psi`` elements per step in all: 1.5x the traffic of ZeRO-2.
3. **Optimizer** on the local slice only; nothing to gather afterwards (next forward does).

DeepSpeed's rules, as its stage 3 runs them (DeepSpeed commit edaa722, ``deepspeed/runtime/zero/``;
the defaults are ``config.py``'s, ``DeepSpeedZeroConfig``):

* **fetch** (``partitioned_param_coordinator.py``, ``fetch_sub_module``):
  DeepSpeed fetches per submodule.  It all-gathers the submodule's parameters that are not
  available, waits for them, then **prefetches**: it walks the parameter trace from where it
  stands and adds parameters (each whole, the last one may overshoot) while the elements
  added are fewer than ``min(max_live_params - elements available, prefetch_bucket_size)``
  (the prefetch loop of ``fetch_sub_module``); one coalesced all-gather per call.
  ``prefetch_bucket_size`` 0 turns
  prefetch off.  The simulator's grain is a layer; its fetch makes one such call per
  gathered tensor of the layer (a transformer layer's weights sit in one submodule each),
  counting as available the layer's tensors from that call on (DeepSpeed releases a
  layer's submodules one by one as they compute) plus everything gathered ahead or kept.
* **release** (``release_sub_module`` and ``__params_to_release``): after a layer computes, its gathered
  tensors are freed unless the trace reuses
  them within ``max_reuse_distance`` elements; with DeepSpeed's default (1e9) a model whose
  forward and backward together gather fewer elements than that keeps every layer from
  forward to backward and gathers nothing in backward.
* **host throttle** (``fetch_sub_module``, its wait on outstanding events): after waiting on a gathered
  tensor the host records an
  event on the allgather stream; with more than two outstanding it blocks on the oldest.  That
  event follows the gather, not the compute, so it does not bound what is gathered ahead.
* **the gather window** (what bounds memory): DeepSpeed counts gathered elements on the host
  (``__n_available_params``: raised in ``__all_gather_params_``, lowered in ``__release_param``),
  and the prefetch budget above is ``max_live_params`` minus that count.  The host runs ahead of
  the GPU, so that count is kept in host order; the GPU keeps to it because a released tensor's
  memory is reused only after the compute that used it (``free_param`` in
  ``partition_parameters.py`` calls ``record_stream`` on the compute stream, and the caching
  allocator hands the block out again once that stream has passed).  Here a gather starts no
  earlier than the compute whose release last freed gathered memory (``freed_room``): what is
  gathered at once is the current layer plus the prefetch window, not the whole model.
* **persistence** (``parameter_offload.py``, ``persistence_threshold`` in ``DeepSpeedZeRoOffload``):
  tensors of at most
  ``param_persistence_threshold`` elements stay whole on every rank and are never gathered.
* **reduce** (``stage3.py``, ``reduce_independent_p_g_buckets_and_remove_grads`` and
  ``__add_grad_to_ipg_bucket``): gradients are copied into a resident bucket
  of ``reduce_bucket_size`` elements (``DeepSpeedZeroOptimizer_Stage3.__init__``); when the next gradient
  would overflow it,
  the bucket is reduce-scattered (one coalesced collective).  A gradient bigger than the
  bucket is reduced on its own, from its own memory.  More than two reductions outstanding
  block the host on the oldest (``__reduce_and_partition_ipg_grads``).  At the end of every backward the rest
  is reduced and the host synchronises with the reduce stream (``independent_gradient_
  partition_epilogue``).

What each collective waits for (``overlap_comm``, default True for stage 3, ``config.py``,
``DeepSpeedZeroConfig.overlap_comm_valid``):

* an all-gather runs from DeepSpeed's allgather stream (``parameter_offload.py``,
  ``DeepSpeedZeRoOffload.__init__``; ``partitioned_param_coordinator.py``, ``__all_gather_params``),
  which never waits on the compute
  stream: it waits only for the collectives ahead of it on the process group's stream.  The
  first gather of a forward still follows the optimizer: ``_post_step`` all-gathers the
  persistent parameters on the compute stream after the update (``stage3.py``,
  ``_post_step``), and the next gathers queue behind that call;
* a reduce-scatter runs on ``reduce_and_partition_stream``, which waited on the compute
  stream when the bucket's last gradient was added (``stage3.py``,
  ``__add_grad_to_ipg_bucket``): it follows the backward that produced that gradient, not
  the compute issued since.
* with ``overlap_comm`` off both streams are the compute stream itself (``stage3.py``,
  ``DeepSpeedZeroOptimizer_Stage3.__init__``; ``parameter_offload.py``,
  ``DeepSpeedZeRoOffload.__init__``): every collective follows the compute
  before it, and the compute after a reduce-scatter waits for it.

What the Amazon Science article 'Making DeepSpeed ZeRO run efficiently on more-affordable
hardware' changed, each a knob here (with a ``--no-`` form):

* ``batch_collectives``: one flat all-gather / reduce-scatter per call instead of one per
  tensor; every collective pays a launch and the ring's latency, so many small ones on
  a slow, high-latency network (EFA) waste most of the time;
* ``fine_grained_sync``: a layer's compute waits only on *its own* gather's event.
  Without it the host synchronises with the whole comm stream before every layer, which
  also waits for prefetched gathers and pending reduce-scatters, and the GPU starves
  while the host is blocked;
* ``precomputed_fetch``: the decision of what to fetch, keep or release is made once
  and replayed.  Without it Python walks the module tree before every layer, costing
  ``fetch_decision_us`` of host time per layer per pass, during which nothing is issued.

``prefetch`` (not a DeepSpeed setting) caps how many layers ahead a prefetch may reach; by
default there is no cap and DeepSpeed's element limits alone decide.  Gathered weights,
gradients waiting for their reduction and the reduce bucket count as ``buffers``.

ZeRO++ (``zero_quantized_weights``, ``zero_hpz_partition_size``, ``zero_quantized_gradients``,
DeepSpeed's keys) changes the gathers, the releases and the reductions above; the piece that
does it is :mod:`zero_sim.strategies.zeropp`, its model :mod:`zero_sim.system.zeropp`
(docs/zeropp.md).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from zero_sim.strategies.base import Alloc, Context, Knob, Step, Strategy, shard
from zero_sim.strategies.zeropp import ZEROPP_KNOBS, ZeroPlusPlus, refuse_zeropp
from zero_sim.system.workload import Layer
from zero_sim.vocabulary import (
    ALL_GATHER,
    BACKWARD,
    BUFFERS,
    COMM,
    FORWARD,
    OPTIMIZER,
    PARAMS,
    REDUCE_SCATTER,
    fetch,
    layer_collective,
    wait,
)

Key = tuple[int, int]  # a partitioned tensor: (layer that owns it, its index in that layer)
MAX_ONGOING_FETCH_EVENTS = 2  # partitioned_param_coordinator.py, __max_ongoing_fetch_events
MAX_PARAM_REDUCE_EVENTS = 2  # stage3.py, __max_param_reduce_events


@dataclass
class Bucket:
    """DeepSpeed's reduce (ipg) bucket: gradients waiting for one reduce-scatter."""

    sizes: list[int] = field(default_factory=list)
    names: list[str] = field(default_factory=list)  # each gradient's tensor (qgZ reduces 1-D ones apart)
    oversize_bytes: int = 0  # gradients too big to be copied in, reduced from their own memory
    last_op: int | None = None  # the backward that produced the last gradient added

    @property
    def elements(self) -> int:
        return sum(self.sizes)


class ZeRO3Step(Step):
    """Fetch each layer before it computes (prefetching by DeepSpeed's element limits), release it
    unless reused soon, reduce-scatter gradients in buckets; the optimizer updates the local slice."""

    stage = 3

    def setup(self) -> None:
        ctx, w = self.ctx, self.w
        self.threshold = ctx.knobs.param_persistence_threshold
        self.persistent = sum(t.numel for layer in w.layers for t in layer.tensors
                              if t.numel <= self.threshold)
        self.size: dict[Key, int] = {(layer.index, i): t.numel for layer in w.layers
                                     for i, t in enumerate(layer.tensors) if t.numel > self.threshold}
        self.uses = {layer.index: self.gathered_keys(layer) for layer in w.layers}
        self.fine = ctx.knobs.fine_grained_sync
        self.batch = ctx.knobs.batch_collectives
        self.overlap = ctx.knobs.overlap_comm
        self.cap = ctx.knobs.reduce_bucket_size
        # The parameter trace of one forward and backward: module positions, and every use of a
        # partitioned tensor in order (DeepSpeed's prefetch queue).
        self.trace = [layer.index for layer in w.layers] + [layer.index for layer in reversed(w.layers)]
        self.queue = [(pos, key) for pos, li in enumerate(self.trace) for key in self.uses[li]]
        self.kept = [self.kept_after(pos) for pos in range(len(self.trace))]
        self.issued: list[int] = []  # every comm op of every micro-step so far: what a coarse sync waits for
        self.reduces: list[int] = []  # every micro-step's reduce-scatters: what the optimizer waits for
        self.pp = ZeroPlusPlus(self)
        self.released: list[Key] = []  # what the last release freed (hpZ copies it first)
        self.room: tuple[int, ...] = ()  # the compute whose release last freed gathered memory

    def gathered_keys(self, layer: Layer) -> list[Key]:
        """The partitioned tensors ``layer`` uses: its own, plus any it reads (tied weights)."""
        keys = [(layer.index, i) for i in range(len(layer.tensors)) if (layer.index, i) in self.size]
        if layer.reads_layer is not None:
            other = self.w.layers[layer.reads_layer]
            keys += [(other.index, i) for i in range(len(other.tensors)) if (other.index, i) in self.size]
        return keys

    def module_numel(self, li: int) -> int:
        """Elements of every tensor the layer uses, persistent ones too (what the reuse walk counts)."""
        layer = self.w.layers[li]
        read = self.w.layers[layer.reads_layer].numel if layer.reads_layer is not None else 0
        return layer.numel + read

    def kept_after(self, pos: int) -> set[Key]:
        """Tensors the layer at trace position ``pos`` does not release: those the trace uses again
        within ``max_reuse_distance`` elements (``__params_to_release``)."""
        limit, traversed, kept = self.ctx.knobs.max_reuse_distance, 0, set()
        mine = set(self.uses[self.trace[pos]])
        for li in self.trace[pos + 1:]:
            if traversed >= limit:
                break
            kept |= mine & set(self.uses[li])
            traversed += self.module_numel(li)
        return kept

    def resident(self) -> dict[str, int]:
        """Stage 3's shards, except that persistent tensors are held whole on every rank (only the
        rest of the weights is sharded); plus the reduce bucket, allocated once (stage3.py,
        DeepSpeedZeroOptimizer_Stage3.__init__)."""
        states = super().resident()
        psi, n, persistent = self.w.params, self.n, self.persistent
        states[PARAMS] += self.p.param_bytes * (persistent + shard(psi - persistent, n) - shard(psi, n))
        states[BUFFERS] = states.get(BUFFERS, 0) + self.cap * self.p.grad_bytes
        return states

    # --- a micro-step: forward, backward, reductions ------------------------------------------

    def micro_step(self) -> None:
        """What is gathered, and the reduce bucket, live for one forward and backward (one trace)."""
        self.available: dict[Key, int] = {}  # gathered (or in flight) -> the all-gather carrying it
        self.inflight: set[Key] = set()  # gathered, not yet waited on
        self.events: deque[int] = deque()  # all-gathers the host recorded an event after
        self.n_available = 0
        self.next_in_queue = 0
        self.first_gather = True
        self.bucket, self.buckets = Bucket(), 0
        self.reduce_events: deque[int] = deque()
        self.micro_reduces: list[int] = []
        self.blocking: tuple[int, ...] = ()  # without overlap_comm: reductions the next compute waits for
        super().micro_step()

    def forward(self) -> None:
        self.pos, self.phase = -1, FORWARD
        super().forward()

    def backward(self) -> None:
        self.phase = BACKWARD
        super().backward()
        self.flush()  # the epilogue: reduce the rest, then wait for the reduce stream
        if self.micro_reduces:
            self.b.sync(wait("reduce_and_partition_stream"), BACKWARD, tuple(self.micro_reduces))

    def before_forward(self, layer: Layer) -> tuple[int, ...]:
        self.pos += 1
        return self.fetch(layer)

    def before_backward(self, layer: Layer) -> tuple[int, ...]:
        self.pos += 1
        deps = self.fetch(layer) + self.blocking
        self.blocking = ()
        return deps

    def forward_frees(self, layer: Layer) -> Alloc:
        return self.release(layer)

    def backward_frees(self, layer: Layer) -> Alloc:
        return self.release(layer)

    def release(self, layer: Layer) -> Alloc:
        """Free the layer's gathered tensors once it has computed, except those reused soon."""
        freed, self.released = 0, []
        for key in self.uses[layer.index]:
            if key in self.available and key not in self.kept[self.pos]:
                del self.available[key]
                self.n_available -= self.size[key]
                freed += self.size[key]
                self.released.append(key)
        return ((BUFFERS, freed * self.p.param_bytes),) if freed else ()

    def backward_allocs(self, layer: Layer) -> Alloc:
        """Gradients bigger than the bucket keep their own memory until reduced; the rest are copied
        into the resident bucket."""
        oversize = sum(t.numel for t in layer.tensors if t.trainable and t.numel > self.cap)
        return ((BUFFERS, oversize * self.p.grad_bytes),) if oversize else ()

    def after_forward(self, layer: Layer, op: int) -> None:
        self.freed_room(op)
        self.pp.released(self.released, layer.index, FORWARD)

    def freed_room(self, op: int) -> None:
        """The memory a release frees is handed to a later gather only once the compute that used it
        has run: ``free_param`` records the gathered tensor on the compute stream (``record_stream``),
        so the caching allocator reuses the block after that compute.  Gathers issued from here on
        start after ``op``: what is gathered at once stays the window DeepSpeed counts."""
        if self.released:
            self.room = (op,)

    def after_backward(self, layer: Layer, op: int) -> None:
        """Each gradient goes into the bucket; one that would overflow it first reduces the bucket."""
        self.freed_room(op)
        self.pp.released(self.released, layer.index, BACKWARD)
        for t in reversed(layer.tensors):
            if t.numel == 0 or not t.trainable:  # a frozen weight has no gradient to reduce
                continue
            if self.bucket.elements + t.numel > self.cap and self.bucket.elements > 0:
                self.flush()
            self.bucket.sizes.append(t.numel)
            self.bucket.names.append(t.name)
            if t.numel > self.cap:
                self.bucket.oversize_bytes += t.numel * self.p.grad_bytes
            self.bucket.last_op = op

    def flush(self) -> None:
        """Reduce-scatter the bucket on the reduce stream, after the backward that filled it."""
        bucket = self.bucket
        if not bucket.sizes:
            return
        self.bucket = Bucket()
        if len(self.reduce_events) > MAX_PARAM_REDUCE_EVENTS:
            oldest = self.reduce_events.popleft()
            self.b.sync(wait(self.b.program.ops[oldest].name), BACKWARD, (oldest,))
        sizes = [bucket.elements] if self.batch else bucket.sizes
        name = f"{REDUCE_SCATTER} B{self.buckets}"
        self.buckets += 1
        layer = self.b.program.ops[bucket.last_op].layer
        ops = []
        if self.pp.reduces():  # qgZ: each tensor by quantized all-to-alls (zeropp.py)
            sizes = []
            oversize = ((BUFFERS, bucket.oversize_bytes),) if bucket.oversize_bytes else ()
            ops = self.pp.reduce(bucket.sizes, bucket.names, self.buckets - 1, layer, (bucket.last_op,),
                                 oversize, not self.overlap)
        for k, size in enumerate(sizes):
            last = k == len(sizes) - 1
            free = ((BUFFERS, bucket.oversize_bytes),) if bucket.oversize_bytes and last else ()
            ops.append(self.b.collective(REDUCE_SCATTER, name, size * self.p.grad_bytes, BACKWARD,
                                         layer=layer, deps=(bucket.last_op,), free=free,
                                         after_compute=not self.overlap))
        if self.offload is not None:  # ZeRO-Offload: each reduced slice goes to the host's fp32 buffer
            ops = [self.offload.grads_down(name.split()[-1], shard(size, self.n), self.p.grad_bytes, (op,),
                                           BACKWARD, layer) for op, size in zip(ops, sizes, strict=True)]
        self.reduce_events.append(ops[-1])
        self.micro_reduces += ops
        self.reduces += ops
        self.issued += ops
        if not self.overlap:
            self.blocking += tuple(ops)

    def optimizer(self) -> None:
        """The local ``1/N`` of every layer, once every reduce-scatter has landed; nothing to gather
        afterwards (the next forward does).  Offloaded, the CPU updates the slice once its gradients
        are on the host; the updated weights are copied up unless they live on the host
        (``offload_param``: each gather copies them up)."""
        if self.offload is None:
            self.update_layers(tuple(self.reduces), share=1.0 / self.n)
        else:
            self.offload.update_on_cpu(shard(self.w.trainable_params, self.n))
            if not self.offload.params:
                sharded = shard(self.w.params - self.persistent, self.n)
                up = self.offload.params_up("params", sharded, self.p.param_bytes, OPTIMIZER)
                self.b.sync(wait(self.b.program.ops[up].name), OPTIMIZER, (up,))
        self.pp.step_end()

    def persistent_param_bytes(self) -> int:
        return self.p.param_bytes * self.persistent

    # --- fetching ----------------------------------------------------------------------------

    def fetch(self, layer: Layer) -> tuple[int, ...]:
        """Before a layer computes: decide what to fetch, gather what is missing, wait for it,
        prefetch, and return what its compute waits for."""
        ctx, li, phase = self.ctx, layer.index, self.phase
        if not ctx.knobs.precomputed_fetch:  # Python walks the module tree, issuing nothing meanwhile
            self.b.host(fetch(li), phase, ctx.knobs.fetch_decision_us * 1e-6, layer=li)
        missing = [key for key in self.uses[li] if key not in self.available]
        if missing:
            self.gather(missing)
        own = tuple(dict.fromkeys(self.available[key] for key in self.uses[li]))
        self.pp.dequantize(own, phase, li)
        self.throttle(li)
        while self.next_in_queue < len(self.queue) and self.queue[self.next_in_queue][0] <= self.pos:
            self.next_in_queue += 1
        gathered = self.uses[li]
        for call in range(max(1, len(gathered))):
            live = self.n_available - sum(self.size[key] for key in gathered[:call])
            self.prefetch(live)
        if self.fine:  # wait on the gathers' own events
            return own
        if self.issued:  # coarse: the host waits for everything on the comm stream so far
            self.b.sync(wait(COMM), phase, tuple(self.issued))
        return ()

    def throttle(self, li: int) -> None:
        """After waiting on each gathered tensor the host records an event; with more than two
        outstanding it blocks on the oldest (``__max_ongoing_fetch_events``)."""
        for key in self.uses[li]:
            if key not in self.inflight:
                continue
            self.inflight.discard(key)
            if len(self.events) > MAX_ONGOING_FETCH_EVENTS:
                oldest = self.events.popleft()
                self.b.sync(wait(self.b.program.ops[oldest].name), self.phase, (oldest,))
            self.events.append(self.available[key])

    def prefetch(self, live: int) -> None:
        """One prefetch call: walk the trace, adding tensors not yet gathered until the elements added
        reach ``min(max_live_params - live, prefetch_bucket_size)``; gather them together."""
        bucket_size = self.ctx.knobs.prefetch_bucket_size
        if bucket_size <= 0:
            return
        budget = min(self.ctx.knobs.max_live_params - live, bucket_size)
        depth = self.ctx.knobs.prefetch
        chosen: list[Key] = []
        added = 0
        while self.next_in_queue < len(self.queue) and added < budget:
            pos, key = self.queue[self.next_in_queue]
            if depth is not None and pos - self.pos > depth:
                break
            self.next_in_queue += 1
            if key not in self.available and key not in chosen:
                chosen.append(key)
                added += self.size[key]
        if chosen:
            self.gather(chosen)

    def gather(self, keys: list[Key]) -> None:
        """All-gather ``keys``: one coalesced collective, or one per tensor."""
        groups = [keys] if self.batch else [[key] for key in keys]
        for group in groups:
            # The first gather of a forward queues behind _post_step's persistent-parameter gather,
            # which follows the optimizer; every other one waits on no compute (overlap_comm).
            after_compute = not self.overlap or self.first_gather
            self.first_gather = False
            for part, op in self.calls(group, after_compute):
                for key in part:
                    self.available[key] = op
                    self.inflight.add(key)
                    self.n_available += self.size[key]
                self.issued.append(op)

    def calls(self, group: list[Key], after_compute: bool) -> list[tuple[list[Key], int]]:
        """One all-gather of ``group`` among all ranks; ZeRO++ may split and shrink it (zeropp.py).
        With ``offload_param`` the rank's slice is copied up from the host first."""
        if self.pp.parts.on:
            return self.pp.gather(group, self.phase, after_compute)
        nbytes = sum(self.size[key] for key in group) * self.p.param_bytes
        deps = self.room  # its buffer is memory an earlier release freed (freed_room)
        if self.offload is not None and self.offload.params:
            elements = sum(shard(self.size[key], self.n) for key in group)
            deps = (self.offload.params_up(group[0][0], elements, self.p.param_bytes, self.phase,
                                           layer=group[0][0], deps=deps),)
        op = self.b.collective(ALL_GATHER, layer_collective(ALL_GATHER, group[0][0]), nbytes, self.phase,
                               layer=group[0][0], deps=deps, alloc=((BUFFERS, nbytes),),
                               after_compute=after_compute)
        return [(group, op)]

    def note(self) -> str:
        decided = "precomputed" if self.ctx.knobs.precomputed_fetch else "made in Python per layer"
        note = (f"{self.persistent:,} parameters persistent (<= {self.threshold:,} elements per tensor); "
                f"{'batched' if self.batch else 'per-tensor'} collectives, "
                f"{'fine-grained' if self.fine else 'whole-stream'} sync, "
                f"fetch decisions {decided}")
        parts = self.pp.parts.describe(self.ctx.nodes, self.w.params - self.persistent, self.p.param_bytes)
        return note + (f"; ZeRO++ {parts}" if parts else "")


class ZeRO3(Strategy):
    name = "zero3"
    summary = "shard weights, gradients and optimizer state; all-gather each layer before use"
    knobs = (
        Knob("prefetch", None, "cap on layers a prefetch reaches ahead (default: none, DeepSpeed's element "
             "limits decide; 0: no prefetch)", int, ge=0, le=100_000),
        Knob("prefetch_bucket_size", 50_000_000, "elements one prefetch call adds at most (DeepSpeed "
             "stage3_prefetch_bucket_size, default 5e7; 0: no prefetch)", int, ge=0, le=10**13),
        Knob("max_live_params", 1_000_000_000, "elements gathered at once beyond which prefetch stops "
             "(DeepSpeed stage3_max_live_parameters, default 1e9)", int, ge=0, le=10**13),
        Knob("max_reuse_distance", 1_000_000_000, "a gathered tensor used again within this many elements "
             "of the trace is kept (DeepSpeed stage3_max_reuse_distance, default 1e9)", int, ge=0, le=10**13),
        Knob("param_persistence_threshold", 100_000, "tensors of at most this many elements stay whole "
             "(DeepSpeed stage3_param_persistence_threshold, default 1e5)", int, ge=0, le=10**13),
        Knob("reduce_bucket_size", 500_000_000, "elements of gradients per reduce-scatter (DeepSpeed "
             "reduce_bucket_size, default 5e8)", int, gt=0, le=10**13),
        Knob("overlap_comm", True, "collectives on DeepSpeed's own streams, overlapping compute (DeepSpeed "
             "default for stage 3)", bool),
        Knob("batch_collectives", True, "one flat collective per call instead of one per tensor", bool),
        Knob("fine_grained_sync", True, "wait on each gather's own event, not the whole comm stream", bool),
        Knob("precomputed_fetch", True, "fetch decisions computed once, not in Python every layer", bool),
        Knob("fetch_decision_us", 500.0,
             "host time per layer per pass when fetch decisions are not precomputed", ge=0, le=1e6),
    ) + ZEROPP_KNOBS
    Step = ZeRO3Step

    def validate(self, ctx: Context) -> None:
        refuse_zeropp(ctx)
