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

3. **Optimizer** on the local shard.  ``update`` says when: ``after_backward`` (torch's FSDP:
   backward's final callback waits for every reduce-scatter, then ``optimizer.step()`` runs
   over all parameters) or ``per_unit`` (each unit's shard updated once its own reduction
   lands, in the order they were launched, so updates overlap the last reductions).

``root``: torch's FSDP flattens the root's layers into one parameter, padded to a multiple
of N as a whole, gathered once and reduce-scattered after the embedding's backward, the last.
``per_layer`` keeps each of those layers a flat buffer of its own (``real_runs``' fsdp): each
padded on its own, gathered where its layer sits in the prefetch order (with
``forward_prefetch``, the head during the last block), and the head's gradients
reduce-scattered right after its backward, overlapping the blocks', instead of waiting for
the embedding's.  Either way the root is kept gathered from forward to backward.

``hybrid``: shard within a node and replicate across nodes (HSDP): gathers and
reduce-scatters use the node's GPUs only, then each node's gradient shard is all-reduced
with the same shard on the other nodes (``comm:inter``, a second stream on another
process group, sharing links with the first).  Memory is sharded over ``G`` GPUs, not N.

Mixed precision: ``param_dtype`` sets the bytes gathered per element; the bytes reduced are
``--reduce-dtype``'s (a setting of every strategy, held by the precision), by default
``param_dtype``'s, as ``MixedPrecision`` defaults its ``reduce_dtype`` to its ``param_dtype``.

``copies``: the memory-bound copies torch's FSDP makes on the compute stream, beside the
collectives.  ``fsdp1`` (the default, ``FullyShardedDataParallel``): gathers land in the
flat parameter's storage and the layers use views of it, so the only copy is autograd's: the
backward of those views concatenates the unit's gradients into the flat gradient
(``copy_in L<i>``, every gradient byte read and written; ``flat_param.split`` in
``_flat_param.py`` ``_get_unflat_views_unaligned``, whose backward is a ``cat``).  Its cast
to ``reduce_dtype`` and its pre-/post-divide run on the post-backward stream
(``_runtime_utils.py`` ``_post_backward_hook``, ``_reduce_grad``) and are not modelled.
``fsdp2`` (``fully_shard``, per-parameter sharding):

* ``copy_out L<i>`` after each all-gather, before the unit computes: the gathered buffer is
  split into the parameters, reading and writing every gathered byte
  (``_fully_shard/_fsdp_param_group.py`` ``wait_for_unshard`` -> ``foreach_all_gather_copy_out``,
  which first makes the current stream wait on the gather);
* ``copy_in L<i>`` after the unit's backward, before its reduce-scatter: the gradients
  (param dtype) are concatenated and cast into the reduce-scatter input (reduce dtype) by
  ``chunk_cat`` on the current stream (``_fsdp_collectives.py`` ``foreach_reduce``, the
  copy-in before ``reduce_scatter_stream.wait_stream(current_stream)``).

``none`` makes no copy (hand-written flat buffers, as ``real_runs``' fsdp).  While a copy
runs both its source and its destination exist, so each holds its destination's bytes as
a transient buffer.

What each collective waits for (torch 2.13.0, ``torch/distributed/fsdp/_runtime_utils.py``):

* **all-gathers** run on FSDP's unshard stream (``_unshard``), which waits on
  the computation stream only once per forward, in the root's pre-forward
  (``_root_pre_forward`` -> ``_wait_for_computation_stream``):
  the first gather of a forward follows the compute before it (the optimizer, or the last
  micro-step's backward); every other gather waits only for its explicit dependencies, the
  rate limiter's host wait (``_unshard``'s ``event.synchronize()``) and the collectives ahead
  of it on the process group's stream.  So with the host running ahead, unit ``u+1``'s
  gather overlaps unit ``u``'s forward even without ``forward_prefetch``.  FSDP2 is alike:
  its all-gather streams wait on the current stream only in the root's pre-forward
  (``_fully_shard/_fsdp_state.py``, ``FSDPState._root_pre_forward``).
* **reduce-scatters** run on the post-backward stream, which waits on the computation stream
  right before each one (``_post_backward_hook``): it follows the unit's
  backward.  FSDP2's reduce-scatter stream does the same (``_fsdp_collectives.py``, ``foreach_reduce``).
* **HSDP's all-reduce** runs on its own stream after waiting on the post-backward stream only
  (``_reduce_grad``): it follows its reduce-scatter, not the compute.
"""

from __future__ import annotations

from zero_sim.strategies.base import DTYPE_BYTES, Alloc, Context, Knob, Step, Strategy, StrategyError
from zero_sim.strategies.capabilities import FP8_ALL_GATHER, PYTORCH, Capabilities, PlacementRule
from zero_sim.strategies.float8_gather import unit_gathers
from zero_sim.strategies.fsdp_units import Unit, wrap_units
from zero_sim.strategies.states import shard
from zero_sim.system.workload import Layer
from zero_sim.vocabulary import (
    ALL_GATHER,
    ALL_REDUCE,
    BACKWARD,
    BUFFERS,
    FORWARD,
    REDUCE_SCATTER,
    copy_in,
    copy_out,
    layer_collective,
    wait,
)


class FSDPStep(Step):
    """Gather a unit when its first layer computes, free it after its last, reduce-scatter its
    gradients once its backward is done; the optimizer updates the local shard."""


    def setup(self) -> None:
        ctx, p = self.ctx, self.p
        self.hybrid = ctx.knobs.hybrid
        self.group = "intra" if self.hybrid else "world"
        if self.hybrid:  # HSDP: states are sharded over the node's G GPUs and replicated across nodes
            self.n = ctx.gpus_per_node
        param_dtype = ctx.knobs.param_dtype
        self.gather_bytes = DTYPE_BYTES[param_dtype] if param_dtype else p.param_bytes
        # MixedPrecision's reduce_dtype defaults to its param_dtype; --reduce-dtype sets it (Precision).
        self.reduce_bytes = self.gather_bytes if p.reduce_bytes is None else p.reduce_bytes
        self.reshard = ctx.knobs.reshard_after_forward
        self.copies = ctx.knobs.copies
        self.units = wrap_units(ctx, ctx.knobs.wrap, ctx.knobs.root)
        # How a unit's weights travel: at the param dtype, or as a plug-in has them (float8_gather.py).
        self.travel = unit_gathers(ctx, self.gather_bytes)
        layers = ctx.workload.layers
        self.gathered = {u.index: self.travel.nbytes([layers[i] for i in u.layers], u.numel)
                         for u in self.units}
        self.unit_of = {li: u for u in self.units for li in u.layers}
        self.blocks = [u for u in self.units if not u.is_root]  # forward order
        self.bwd_blocks = list(reversed(self.blocks))
        # Prefetch order over every unit: a unit computes forward from its first layer and
        # backward from its last, so a root split per layer is fetched where its layer sits.
        self.fwd_units = sorted(self.units, key=lambda u: u.layers[0])
        self.bwd_units = sorted(self.units, key=lambda u: -u.layers[-1])

    def shard_units(self) -> tuple[int, ...]:
        """Each unit's flat parameter is sharded on its own (FSDP pads each to a multiple of N)."""
        return tuple(u.numel for u in self.units)

    def trainable_units(self) -> tuple[int, ...]:
        """The optimizer holds state for each unit's trainable weights, sharded as the unit is."""
        return tuple(u.trained for u in self.units)

    def gradient_units(self) -> tuple[int, ...]:
        return tuple(self.grad_numel(u) for u in self.units)

    def grad_numel(self, u: Unit) -> int:
        """Gradient elements of a unit.  FSDP1 (``copies`` fsdp1) keeps one flat parameter per
        unit: a unit with any trainable weight gets a gradient as large as the whole flat
        parameter, frozen parts as zeros (torch's FSDP docs for ``use_orig_params``: mixing
        frozen and trainable weights in a unit costs the gradient memory of training them all),
        and a wholly frozen unit none.  FSDP2 shards per parameter: the trainable ones alone."""
        if self.copies == "fsdp1":
            return u.numel if u.trained else 0
        return u.trained

    def micro_step(self) -> None:
        """Gathers and frees are per micro-step; the optimizer waits for the last one's reductions."""
        self.gathers: dict[tuple[str, int], int] = {}  # (pass, unit) -> all-gather op
        self.copied: dict[tuple[str, int], int] = {}  # (pass, unit) -> its copy-out (copies fsdp2)
        self.freed_by: dict[tuple[str, int], int] = {}  # (pass, unit) -> op that frees its gathered copy
        self.reduces: list[int] = []
        self.reduced: list[tuple[Unit, int]] = []  # (unit, the op its update waits for), in launch order
        super().micro_step()

    # --- forward ------------------------------------------------------------------------------

    def before_forward(self, layer: Layer) -> tuple[int, ...]:
        """A unit is gathered when its first layer is about to compute (and the next one with
        ``forward_prefetch``); every layer of the unit waits for that gather."""
        u = self.unit_of[layer.index]
        if layer.index == u.layers[0]:
            self.gather(u, FORWARD)
            nxt = self.next_unit(u, self.fwd_units)
            if self.ctx.knobs.forward_prefetch and nxt is not None:
                self.gather(nxt, FORWARD, deps=self.landed(FORWARD, u))
            self.copy_out(u, FORWARD)
        return self.ready(FORWARD, u)

    def resharded_by(self, layer: Layer) -> bool:
        """With ``reshard_after_forward`` a block's gathered copy goes once its last layer has run;
        the root stays gathered until backward."""
        u = self.unit_of[layer.index]
        return self.reshard and not u.is_root and layer.index == u.layers[-1]

    def forward_frees(self, layer: Layer) -> Alloc:
        return ((BUFFERS, self.nbytes(self.unit_of[layer.index])),) if self.resharded_by(layer) else ()

    def after_forward(self, layer: Layer, op: int) -> None:
        if self.resharded_by(layer):
            self.freed_by[(FORWARD, self.unit_of[layer.index].index)] = op

    # --- backward -----------------------------------------------------------------------------

    def regathered(self, u: Unit) -> bool:
        """Resharded blocks are gathered again for backward; the root, and blocks kept whole, are not."""
        return self.reshard and not u.is_root

    def before_backward(self, layer: Layer) -> tuple[int, ...]:
        """At a unit's first backward layer: gather it again, and with ``pre`` the next unit to run
        backward too (after the root's head, the last block).  Wait for the latest gather."""
        u = self.unit_of[layer.index]
        if layer.index == u.layers[-1]:
            if self.regathered(u):
                self.gather(u, BACKWARD)  # no-op when prefetched
            nxt = self.next_unit(u, self.bwd_units)
            if nxt is not None and self.ctx.knobs.backward_prefetch == "pre" and self.regathered(nxt):
                self.gather(nxt, BACKWARD, deps=self.landed(BACKWARD, u))
            self.copy_out(u, BACKWARD)
        return self.ready(BACKWARD, u) or self.ready(FORWARD, u)

    def backward_allocs(self, layer: Layer) -> Alloc:
        """The unit's unsharded gradients, from its first backward layer until its reduce-scatter."""
        u = self.unit_of[layer.index]
        if layer.index == u.layers[-1] and self.grad_numel(u):
            return ((BUFFERS, self.grad_numel(u) * self.reduce_bytes),)
        return ()

    def backward_frees(self, layer: Layer) -> Alloc:
        """The gathered copy goes once the unit's last backward layer has run."""
        u = self.unit_of[layer.index]
        return ((BUFFERS, self.nbytes(u)),) if layer.index == u.layers[0] and u.numel else ()

    def after_backward(self, layer: Layer, op: int) -> None:
        """The unit's gradients are complete: with ``post`` gather the next unit now (ahead of this
        reduce-scatter in the FIFO), then reduce-scatter the gradients."""
        u = self.unit_of[layer.index]
        if layer.index != u.layers[0] or u.numel == 0:
            return
        self.freed_by[(BACKWARD, u.index)] = op
        if not u.is_root and self.ctx.knobs.backward_prefetch == "post":
            nxt = self.next_unit(u, self.bwd_blocks)
            if nxt is not None and self.regathered(nxt):
                self.gather(nxt, BACKWARD, deps=(op,))
        self.reduce(u, op)

    def computed_weight_bytes(self) -> int:
        return self.gather_bytes  # MixedPrecision's param_dtype: bf16 gathers leave autocast nothing to cast

    def reduce(self, u: Unit, op: int) -> None:
        """Reduce-scatter within the group, after the unit's backward (the post-backward stream waits
        on the compute stream); with ``hybrid`` the shard is then all-reduced across nodes on a
        second stream that waits on the reduce-scatter only."""
        numel = self.grad_numel(u)
        if numel == 0:  # a frozen unit: no gradient, nothing to reduce
            return
        grad = numel * self.reduce_bytes
        if self.copies != "none":  # read the param-dtype gradients, write the flat or reduce-dtype buffer
            held = numel * self.gather_bytes
            written = grad if self.copies == "fsdp2" else held
            op = self.b.compute(copy_in(u.label), BACKWARD, self.ctx.compute.copy_time(held + written),
                                layer=u.label, deps=(op,), alloc=((BUFFERS, held),), free=((BUFFERS, held),))
        rs = self.b.collective(REDUCE_SCATTER, layer_collective(REDUCE_SCATTER, u.label), grad, BACKWARD,
                               group=self.group, layer=u.label, deps=(op,), free=((BUFFERS, grad),))
        self.reduces.append(rs)
        if self.hybrid:
            self.reduces.append(self.b.collective(
                ALL_REDUCE, layer_collective(ALL_REDUCE, u.label), shard(numel, self.n) * self.reduce_bytes,
                BACKWARD, group="inter", stream="comm:inter", layer=u.label, deps=(rs,), after_compute=False))
        if self.host_moves is not None:  # CPUOffloadPolicy: the reduced shard is copied to the host
            self.reduces.append(self.host_moves.grads_down(u.label, shard(numel, self.n), self.reduce_bytes,
                                                        (self.reduces[-1],), BACKWARD, u.label))
        self.reduced.append((u, self.reduces[-1]))

    def optimizer(self) -> None:
        """The local shard of every layer, once the last micro-step's reductions have landed
        (``after_backward``), or unit by unit as each one's reduction lands (``per_unit``); offloaded,
        on the host's CPU tensors; then whatever the units' way of travelling adds (float8_gather.py)."""
        if self.host_moves is not None:  # optimizer.step() on the host's CPU tensors
            self.host_moves.update_on_cpu(sum(shard(u.trained, self.n) for u in self.units))
            return
        if self.ctx.knobs.update == "after_backward":
            updates = self.update_layers(tuple(self.reduces), share=1.0 / self.n)
        else:
            updates = []
            for u, reduced in self.reduced:
                updates += self.update_layers((reduced,), share=1.0 / self.n,
                                              layers=[self.w.layers[li] for li in u.layers])
        self.travel.after_update(self.b, tuple(updates), self.n, self.group)

    # --- gathering ----------------------------------------------------------------------------

    def nbytes(self, u: Unit) -> int:
        """Bytes the unit gathers (and holds gathered), as the unit's way of travelling says."""
        return self.gathered[u.index]

    @staticmethod
    def next_unit(u: Unit, order: list[Unit]) -> Unit | None:
        """The unit that computes after ``u`` in a pass over units in ``order``, if any."""
        k = order.index(u) + 1
        return order[k] if k < len(order) else None

    def gather(self, u: Unit, phase: str, deps: tuple[int, ...] = ()) -> None:
        """All-gather a unit once per pass (a prefetched unit is not gathered again), on the unshard
        stream: only the first gather of a forward waits for the compute issued before it (the root's
        pre-forward makes the unshard stream wait on the computation stream once)."""
        key = (phase, u.index)
        if key in self.gathers or u.numel == 0:
            return
        if self.ctx.knobs.limit_all_gathers:
            self.rate_limit(u, phase)
        deps += self.copied_out(phase)
        first_of_forward = phase == FORWARD and not any(p == FORWARD for p, _ in self.gathers)
        if self.host_moves is not None:  # CPUOffloadPolicy: the shard is copied up before it is gathered
            deps += (self.host_moves.params_up(u.label, shard(u.numel, self.n), self.gather_bytes, phase,
                                            layer=u.label),)
        self.gathers[key] = self.b.collective(
            ALL_GATHER, layer_collective(ALL_GATHER, u.label), self.nbytes(u), phase, group=self.group,
            layer=u.label, deps=deps, alloc=((BUFFERS, self.nbytes(u)),), after_compute=first_of_forward)

    def rate_limit(self, u: Unit, phase: str) -> None:
        """FSDP1's limiter: at most two gathered blocks, so the host waits until the block two
        before ``u`` in this pass has been freed; else, running ahead, it would gather them all."""
        order = self.blocks if phase == FORWARD else self.bwd_blocks
        if u not in order:
            return
        k = order.index(u)
        older = (phase, order[k - 2].index) if k >= 2 else None
        if older in self.freed_by:
            self.b.sync(wait("free " + layer_collective(ALL_GATHER, order[k - 2].label)), phase,
                        (self.freed_by[older],))

    def copied_out(self, phase: str) -> tuple[int, ...]:
        """FSDP2's prefetch depth (``_fully_shard/_fsdp_param_group.py``, ``wait_for_unshard``): the
        all-gather streams wait on the event recorded after a unit's copy-out
        (``_wait_all_gather_streams_on_event``).  In forward that event is kept in the
        ``AllGatherState`` and waited on by the next unit's ``wait_for_unshard``, after that unit's
        own gather was issued: a gather follows the copy-out of the unit before the previous one.  In
        backward the wait comes at once, before the prefetch: a gather follows the last copy-out.
        FSDP1 has no such wait; ``limit_all_gathers`` is its bound."""
        if self.copies != "fsdp2":
            return ()
        done = [op for (p, _), op in self.copied.items() if p == phase]
        back = 2 if phase == FORWARD else 1
        return (done[-back],) if len(done) >= back else ()

    def copy_out(self, u: Unit, phase: str) -> None:
        """Under ``fsdp2``, split the unit's gather of this pass into its parameters on the compute
        stream, once, right before the unit computes: every gathered byte read and written."""
        key = (phase, u.index)
        if self.copies != "fsdp2" or key not in self.gathers or key in self.copied:
            return
        n = self.nbytes(u)
        self.copied[key] = self.b.compute(copy_out(u.label), phase, self.ctx.compute.copy_time(2 * n),
                                          layer=u.label, deps=(self.gathers[key],),
                                          alloc=((BUFFERS, n),), free=((BUFFERS, n),))

    def ready(self, phase: str, u: Unit) -> tuple[int, ...]:
        """What the unit's compute waits for in this pass: its copy-out, else its gather."""
        own = self.copied.get((phase, u.index))
        return (own,) if own is not None else self.landed(phase, u)

    def landed(self, phase: str, u: Unit) -> tuple[int, ...]:
        """The unit's own gather in this pass, if any.  A prefetch starts once the unit about to
        compute has its own weights: on one NCCL stream that is the FIFO order anyway; gloo, with two
        calls in flight, would otherwise split the link between the two gathers (real_runs' fsdp
        waits, then prefetches)."""
        own = self.gathers.get((phase, u.index))
        return (own,) if own is not None else ()

    def note(self) -> str:
        roots = [u for u in self.units if u.is_root]
        return (f"{len(self.units)} FSDP units ({len(roots)} root); reshard_after_forward={self.reshard}; "
                f"backward_prefetch={self.ctx.knobs.backward_prefetch}; copies={self.copies}; "
                f"{'hybrid: shard in node, all-reduce across nodes' if self.hybrid else 'full shard'}")


class FSDP(Strategy):
    name = "fsdp"
    label = "FSDP"
    summary = "PyTorch FSDP: shard per wrap unit; gather before use, reduce-scatter after backward"
    can = Capabilities(stage=3, library=PYTORCH, placement=PlacementRule(params="required"),
                       features=frozenset({FP8_ALL_GATHER}))
    knobs = (
        Knob("wrap", "blocks", "wrap units: 'blocks' (one per block + root), 'none', or layer indices", str),
        Knob("root", "one", "the layers no wrap unit holds: one flat parameter (torch's root unit) or one "
             "per layer, each padded, gathered and reduced on its own (real_runs' fsdp)", str,
             ("one", "per_layer")),
        Knob("reshard_after_forward", True, "free gathered weights after forward (re-gather in backward)",
             bool),
        Knob("backward_prefetch", "pre", "where the next unit's backward gather is issued", str,
             ("pre", "post", "none")),
        Knob("forward_prefetch", False, "issue the next unit's gather before this unit's forward", bool),
        Knob("limit_all_gathers", True, "at most two gathered units at once (FSDP1 rate limiter)", bool),
        Knob("hybrid", False, "shard within a node, all-reduce across nodes (HSDP)", bool),
        Knob("param_dtype", None, "dtype of gathered weights (default: the precision's)", str,
             tuple(DTYPE_BYTES)),
        Knob("copies", "fsdp1", "copies on the compute stream: fsdp1 (gradients into the flat gradient), "
             "fsdp2 (each gather out into the parameters, gradients into the reduce-scatter input) or none",
             str, ("fsdp1", "fsdp2", "none")),
        Knob("update", "after_backward", "when shards are updated: after every reduction "
             "(torch's FSDP) or per unit as its reduction lands", str, ("after_backward", "per_unit")),
    )

    Step = FSDPStep

    def validate(self, ctx: Context) -> None:
        wrap_units(ctx, ctx.knobs.wrap, ctx.knobs.root)
        if ctx.knobs.hybrid and ctx.nodes < 2:
            raise StrategyError("--hybrid needs at least two nodes; raise --gpus or lower --gpus-per-node")
