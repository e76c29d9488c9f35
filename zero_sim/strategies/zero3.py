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
* **the gather window** (what bounds memory; docs/memory.md): the prefetch budget above is
  ``max_live_params`` minus the elements gathered (``__n_available_params``, counted on the host).
  The GPU keeps to that count because a released tensor's memory is reused only after the compute
  that used it (``free_param``, ``partition_parameters.py``, ``record_stream`` on the compute
  stream), so here a gather starts after the compute whose release last freed gathered memory
  (``freed_room``): the layer computing plus the prefetch window, not the whole model.
* **persistence** (``persistence_threshold``, read by the parameter coordinator's constructor,
  ``DeepSpeedZeRoOffload.__init__`` in ``parameter_offload.py``): tensors of at most
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

* an all-gather runs from DeepSpeed's allgather stream (the parameter coordinator's constructor;
  ``partitioned_param_coordinator.py``, ``__all_gather_params``),
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
  ``DeepSpeedZeroOptimizer_Stage3.__init__``; the parameter coordinator's constructor): every
  collective follows the compute
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

*How* the bytes travel is asked of the build's transfers (:mod:`zero_sim.strategies.transfers`):
plain all-gathers and reduce-scatters, or those of a feature the strategy accepts and the settings
turn on (:mod:`zero_sim.strategies.features`), which may change the gathers, the releases, the
reductions and the update.  This module decides *when*.
"""

from __future__ import annotations

from collections import deque
from dataclasses import replace

from zero_sim.strategies.base import Alloc, Context, Knob, Step, Strategy
from zero_sim.strategies.capabilities import DEEPSPEED, ZEROPP, Capabilities, PlacementRule
from zero_sim.strategies.features import feature_knobs, refuse_features, transfers
from zero_sim.strategies.states import ModelStates
from zero_sim.strategies.transfers import Bucket, Key, ShardedWeights
from zero_sim.system.workload import Layer
from zero_sim.vocabulary import (
    BACKWARD,
    BUFFERS,
    COMM,
    FORWARD,
    fetch,
    wait,
)

MAX_ONGOING_FETCH_EVENTS = 2  # partitioned_param_coordinator.py, __max_ongoing_fetch_events
MAX_PARAM_REDUCE_EVENTS = 2  # stage3.py, __max_param_reduce_events


class ZeRO3Step(Step):
    """Fetch each layer before it computes (prefetching by DeepSpeed's element limits), release it
    unless reused soon, reduce-scatter gradients in buckets; the optimizer updates the local slice."""


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
        self.released: list[Key] = []  # what the last release freed (a feature may act on it)

    def __init__(self, ctx: Context, stage: int = 0):
        super().__init__(ctx, stage)
        # How this build's bytes travel: plainly, or as a feature the settings turn on has them.
        self.shared = ShardedWeights(self.b, ctx, self.n, self.size, self.persistent, self.host_moves)
        self.moves = transfers(self.shared)

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

    def model_states(self) -> ModelStates:
        """Stage 3's shards, except that persistent tensors are held whole on every rank (only the
        rest of the weights is sharded); plus the reduce bucket, allocated once (stage3.py,
        DeepSpeedZeroOptimizer_Stage3.__init__)."""
        states = super().model_states()
        sharded = self.w.params - self.persistent
        states.weights = replace(states.weights, units=(sharded,), whole=self.persistent)
        states.buffers = self.cap * self.p.grad_bytes
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
        self.moves.released(self.released, layer.index, FORWARD)

    def freed_room(self, op: int) -> None:
        """The memory a release frees is handed to a later gather only once the compute that used it
        has run: ``free_param`` records the gathered tensor on the compute stream (``record_stream``),
        so the caching allocator reuses the block after that compute.  Gathers issued from here on
        start after ``op``: what is gathered at once stays the window DeepSpeed counts."""
        if self.released:
            self.shared.room = (op,)

    def after_backward(self, layer: Layer, op: int) -> None:
        """Each gradient goes into the bucket; one that would overflow it first reduces the bucket."""
        self.freed_room(op)
        self.moves.released(self.released, layer.index, BACKWARD)
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
        layer = self.b.program.ops[bucket.last_op].layer
        ops = self.moves.reduce(bucket, self.buckets, layer, sizes, not self.overlap)
        self.buckets += 1
        self.reduce_events.append(ops[-1])
        self.micro_reduces += ops
        self.reduces += ops
        self.issued += ops
        if not self.overlap:
            self.blocking += tuple(ops)

    def optimizer(self) -> None:
        """The local ``1/N`` of every layer, once every reduce-scatter has landed; nothing to gather
        afterwards (the next forward does).  Where the update runs is the transfers' to say."""
        self.moves.optimizer(tuple(self.reduces), self.update_layers)

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
        self.moves.ready(own, phase, li)
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
            for part, op in self.moves.gather(group, self.phase, after_compute):
                for key in part:
                    self.available[key] = op
                    self.inflight.add(key)
                    self.n_available += self.size[key]
                self.issued.append(op)

    def note(self) -> str:
        decided = "precomputed" if self.ctx.knobs.precomputed_fetch else "made in Python per layer"
        note = (f"{self.persistent:,} parameters persistent (<= {self.threshold:,} elements per tensor); "
                f"{'batched' if self.batch else 'per-tensor'} collectives, "
                f"{'fine-grained' if self.fine else 'whole-stream'} sync, "
                f"fetch decisions {decided}")
        return note + self.moves.describe()


class ZeRO3(Strategy):
    name = "zero3"
    label = "ZeRO-3"
    summary = "shard weights, gradients and optimizer state; all-gather each layer before use"
    can = Capabilities(stage=3, library=DEEPSPEED, features=frozenset({ZEROPP}),
                       placement=PlacementRule(params="with_optimizer", nvme=True))
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
    ) + feature_knobs(can)
    Step = ZeRO3Step

    def validate(self, ctx: Context) -> None:
        refuse_features(ctx, self.can)
