"""What every strategy shares: the context it builds from, its knobs, and the skeleton of a
training step into which a strategy inserts its communication.

A strategy is a :class:`Strategy` with a ``name``, a ``summary``, the ``knobs`` it accepts
(each becomes a CLI flag and a ``simulate()`` keyword) and a :class:`Step` subclass.
``build(ctx)`` makes a fresh ``Step`` for the context and returns its :class:`Program`, so
nothing mutable is shared between builds.  Adding a strategy is adding a file under
``strategies/`` and one line in ``strategies/__init__.py``.

:class:`Step` owns the step of one rank, as ``real_runs/strategies/base.py`` does for real
training: ``grad_accum`` micro-steps of forward over the layers and backward over them in
reverse (with recompute), then the optimizer.  A strategy overrides a few hooks, called at
the same moments as the real runs' hooks:

* ``before_forward(layer)`` / ``before_backward(layer)``: issue what the layer needs
  (gathers) and return the ops its compute must wait for;
* ``after_forward(layer, op)``: the layer's forward op has been issued;
* ``after_backward(layer, op)``: the layer's gradients exist (post-accumulate-grad
  hooks fire here): launch their reduction;
* ``forward_frees`` / ``backward_allocs`` / ``backward_frees``: memory the layer's compute
  op releases or allocates besides activations;
* ``model_states()``: the states kept across steps, from the layer of states
  (zero_sim.strategies.states); ``optimizer()``: the update.

Also shared: :class:`Precision` (bytes per parameter of weights, gradients and optimizer
state; mixed-precision Adam is 2 + 2 + 12, the ZeRO paper's K = 12), from
:mod:`zero_sim.strategies.precision`.  A rank's padded share of a
buffer (``shard``) is the layer of states'.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from zero_sim.engine.program import Program, ProgramBuilder
from zero_sim.settings import Setting, settings_record
from zero_sim.strategies.capabilities import PYTORCH, Capabilities
from zero_sim.strategies.precision import DTYPE_BYTES, PRECISIONS, Precision  # noqa: F401 (re-exported)
from zero_sim.strategies.states import ModelStates, Placement, zero_states
from zero_sim.system.hardware import ComputeModel
from zero_sim.system.host_costs import HostCosts, MeasuredHostCosts
from zero_sim.system.workload import Layer, Workload
from zero_sim.vocabulary import (
    ACTIVATIONS,
    BACKWARD,
    BUFFERS,
    FORWARD,
    OPTIMIZER,
    amp_cast,
    bwd,
    fp8_cast,
    fwd,
    opt,
    recompute,
)

Alloc = tuple[tuple[str, int], ...]  # (memory category, bytes) pairs an op allocates or frees


class StrategyError(ValueError):
    """A knob value the strategy cannot use; the message says how to fix it."""


# A strategy's knob is a setting like any other: one schema (zero_sim.settings) checks both.
Knob = Setting


@dataclass
class Context:
    workload: Workload
    world_size: int
    gpus_per_node: int
    compute: ComputeModel
    precision: Precision
    grad_accum: int = 1
    host_overhead_s: float = 10e-6
    knobs: Any = None  # the strategy's knobs, a frozen dataclass read by attribute (Strategy.Knobs)
    # Host time to issue each layer's kernels (zero_sim.system.host_costs); None: the flat per-op figure.
    host: HostCosts | MeasuredHostCosts | None = None
    step_host_s: float = 0.0  # the training loop's own host work per step, ending in a sync
    optimizer_host_s_per_param: float | None = None  # measured host time to issue the update (traces)
    offload: Placement | None = None  # model states kept off the GPU (offload.py, nvme.py)

    def forward_host_s(self, layer: Layer) -> float | None:
        return self.host.forward_s(layer.kind) if self.host is not None else None

    def backward_host_s(self, layer: Layer) -> float | None:
        return self.host.backward_s(layer.kind) if self.host is not None else None

    def update_host_s(self, layer: Layer) -> float | None:
        """The host's launches of the layer's update by a per-tensor optimizer; None for a multi-tensor
        one."""
        if self.host is None:
            return None
        return self.host.update_s(sum(1 for t in layer.tensors if t.trainable))

    @property
    def nodes(self) -> int:
        return self.world_size // self.gpus_per_node

    def fwd_seconds(self, layer: Layer) -> float:
        tokens, work = self.workload.tokens_per_micro_batch, layer.work
        return self.compute.layer_time(layer.kind, "fwd", layer.fwd_flops, tokens, work)

    def bwd_seconds(self, layer: Layer) -> float:
        tokens, work = self.workload.tokens_per_micro_batch, layer.work
        return self.compute.layer_time(layer.kind, "bwd", layer.bwd_flops, tokens, work)

    def recompute_flops(self, layer: Layer) -> float:
        """Forward FLOPs re-run in backward: all of it (full), attention's core (selective), or the
        projections whose outputs op-level checkpointing drops (op)."""
        mode = self.workload.recompute
        if mode == "none" or layer.kind != "block":
            return 0.0
        if mode == "full":
            return layer.fwd_flops
        if mode == "op":
            return layer.work.unsaved_matmul_flops if layer.work else layer.fwd_flops / 2
        if layer.work is not None:  # the attention core as the shape has it (GQA, windows, cross-attention)
            return layer.work.attention_flops
        s, b = self.workload.seq_len, self.workload.micro_batch
        h = self.workload.shape.d_model if self.workload.shape else 0
        return 4.0 * b * s * s * h

    def fp8_cast_seconds(self, layer: Layer, direction: str, shard_ranks: int = 1) -> float:
        """The float8 casts before ``layer``'s ``direction`` under ``--precision fp8``
        (zero_sim.system.fp8): their bytes at the element-wise fraction of HBM bandwidth, as every
        memory-bound kernel of a layer; 0 for a layer that runs no FP8 GEMM."""
        fp8 = self.compute.fp8
        if fp8 is None:
            return 0.0
        nbytes = fp8.cast_bytes(layer, direction, shard_ranks, self.workload.recompute == "full")
        return self.compute.elementwise_time(nbytes)

    def amp_cast_numel(self, layer: Layer) -> int:
        """Elements autocast casts before ``layer``'s forward under ``--precision amp``: the weights of
        the GEMMs it runs (autocast's lower-precision list holds linear and matmul, not an embedding
        lookup or a norm), taken as every weight of a block or the head, a tied head's included."""
        if self.precision.compute_bytes is None or layer.kind not in ("block", "head"):
            return 0
        tied = self.workload.layers[layer.reads_layer].numel if layer.reads_layer is not None else 0
        return layer.numel + tied

    def recompute_seconds(self, layer: Layer) -> float:
        """The forward again (full), the attention core alone (selective), or half the
        projections and every memory-bound op (op)."""
        tokens = self.workload.tokens_per_micro_batch
        return self.compute.recompute_time(layer.kind, self.workload.recompute, layer.fwd_flops,
                                           self.recompute_flops(layer), tokens, layer.work)


class Step:
    """One rank's training step, built once per ``Strategy.build(ctx)``: the skeleton and its hooks.

    Subclasses keep their per-build state as attributes (made in :meth:`setup`) and override
    the hooks; each default does nothing, so this class alone is one GPU training locally."""

    def __init__(self, ctx: Context, stage: int = 0):
        self.ctx, self.w, self.p = ctx, ctx.workload, ctx.precision
        self.stage = stage  # the ZeRO stage its model states follow (the strategy's capabilities)
        self.n = ctx.world_size  # ranks the sharded model states are split over
        self.micro = 0  # the micro-step being built
        self.setup()
        self.states = self.model_states()
        if ctx.offload is not None:  # a placement: some states live in host memory
            self.states = ctx.offload.place(self.states)
        self.b = ProgramBuilder(self.states.on_gpu())
        self.b.program.host_resident = self.states.host
        self.b.program.nvme_resident = self.states.nvme
        # Copies between the GPU and where the placement keeps states, and the host's update.
        self.host_moves = ctx.offload.moves(self.b) if ctx.offload is not None else None

    # --- to override ------------------------------------------------------------------

    def setup(self) -> None:
        """Per-build state, before ``model_states()`` is asked for."""

    def shard_units(self) -> tuple[int, ...]:
        """Elements of each buffer the sharded states are cut from (one for the whole model by
        default).  Each buffer is padded to a multiple of ``n`` on its own, so that it splits
        into the equal chunks collectives need: a rank holds ``sum(shard(u, n))``."""
        return (self.w.params,)

    def trainable_units(self) -> tuple[int, ...]:
        """Elements of each buffer the optimizer state is cut from: the parameter buffers when every
        weight trains, else the trainable ones as one buffer (frozen weights have no optimizer state)."""
        w = self.w
        return self.shard_units() if w.trainable_params == w.params else (w.trainable_params,)

    def gradient_units(self) -> tuple[int, ...]:
        """Elements of each buffer the gradients are cut from: the trainable ones (frozen weights have
        no gradient), unless a strategy keeps gradients for frozen weights too."""
        return self.trainable_units()

    def model_states(self) -> ModelStates:
        """Model states per rank by the ZeRO rule for ``stage`` (zero_sim.strategies.states): each
        category whole below the stage that shards it, else ``n`` padded shards of each of its buffers
        (weights: :meth:`shard_units`; gradients and optimizer state: of what trains)."""
        p = self.p
        return zero_states(self.stage, self.n, self.shard_units(), self.trainable_units(),
                           self.gradient_units(), p.param_bytes, p.grad_bytes, p.optimizer_bytes,
                           self.w.weight_bytes(p.param_bytes), p.grad_copy_bytes)

    def resident(self) -> dict[str, int]:
        """Bytes per category the GPU holds across steps."""
        return self.states.on_gpu()

    def before_forward(self, layer: Layer) -> tuple[int, ...]:
        """Issue what the layer's forward needs (gathers); return the ops it must wait for."""
        return ()

    def forward_frees(self, layer: Layer) -> Alloc:
        """Memory the forward op releases: gathered parameters not kept for backward."""
        return ()

    def after_forward(self, layer: Layer, op: int) -> None:
        """The layer's forward op ``op`` has been issued."""

    def before_backward(self, layer: Layer) -> tuple[int, ...]:
        """Issue what the layer's backward needs; return the ops its first compute waits for."""
        return ()

    def backward_allocs(self, layer: Layer) -> Alloc:
        """Memory the backward op allocates: unsharded gradients waiting to be reduced."""
        return ()

    def backward_frees(self, layer: Layer) -> Alloc:
        """Memory the backward op releases besides activations: gathered parameters."""
        return ()

    def after_backward(self, layer: Layer, op: int) -> None:
        """The layer's gradients exist: where gradient communication is launched."""

    def optimizer(self) -> None:
        """Update every layer (compute-stream order already puts it after backward)."""
        self.update_layers(())

    def computed_weight_bytes(self) -> int:
        """Bytes an element of the weights a layer computes with, before autocast: as held (FSDP: as
        gathered, its ``param_dtype``)."""
        return self.p.param_bytes

    def note(self) -> str:
        """One line on the assumptions made, for reports."""
        return ""

    # --- the step -------------------------------------------------------------------------

    @property
    def last_micro(self) -> bool:
        return self.micro == self.ctx.grad_accum - 1

    def build(self) -> Program:
        """``grad_accum`` micro-steps, then the optimizer, as one program."""
        for micro in range(self.ctx.grad_accum):
            self.micro = micro
            self.b.program.micro_starts.append(len(self.b.program.ops))
            self.micro_step()
        self.optimizer()
        self.loop_overhead()
        prog = self.b.build()
        prog.model_flops = self.w.model_flops() * self.ctx.grad_accum
        if note := self.note():
            prog.notes.append(note)
        return prog

    def loop_overhead(self) -> None:
        """The training loop's own work after the update (clipping, scheduler, logging), then the
        host waits for the GPU (a loss read): the next step's kernels start from an empty queue."""
        if self.ctx.step_host_s <= 0:
            return
        ops = self.b.program.ops
        last_compute = next(op.index for op in reversed(ops) if op.kind == "compute")
        self.b.host("training loop", OPTIMIZER, self.ctx.step_host_s)
        self.b.sync("loss read", OPTIMIZER, (last_compute,), host_s=0.0)

    def micro_step(self) -> None:
        """Forward over the layers, then backward over them in reverse."""
        self.forward()
        self.backward()

    def forward(self) -> None:
        """``fwd L<i>`` for every layer, allocating the activations it saves for backward."""
        ctx = self.ctx
        for layer in self.w.layers:
            deps = self.fp8_casts(layer, FORWARD, self.before_forward(layer))
            deps, casts = self.amp_casts(layer, deps)
            op = self.b.compute(
                fwd(layer.index), FORWARD, ctx.fwd_seconds(layer), layer=layer.index, deps=deps,
                alloc=((ACTIVATIONS, layer.checkpointed_activation_bytes),), flops=layer.fwd_flops,
                free=self.forward_frees(layer) + casts, host_s=ctx.forward_host_s(layer))
            self.after_forward(layer, op)

    def backward(self) -> None:
        """``[recompute L<i>] bwd L<i>`` from the last layer to the first, freeing activations."""
        ctx, b = self.ctx, self.b
        for layer in reversed(self.w.layers):
            deps = self.fp8_casts(layer, BACKWARD, self.before_backward(layer))
            extra = layer.activation_bytes - layer.checkpointed_activation_bytes
            if ctx.workload.recompute != "none" and extra > 0:
                b.compute(recompute(layer.index), BACKWARD, ctx.recompute_seconds(layer), layer=layer.index,
                          deps=deps, alloc=((ACTIVATIONS, extra),), flops=ctx.recompute_flops(layer),
                          host_s=ctx.forward_host_s(layer))
                deps = ()
                freed = layer.activation_bytes
            else:
                freed = layer.checkpointed_activation_bytes
            op = b.compute(bwd(layer.index), BACKWARD, ctx.bwd_seconds(layer), layer=layer.index, deps=deps,
                           alloc=self.backward_allocs(layer),
                           free=((ACTIVATIONS, freed),) + self.backward_frees(layer), flops=layer.bwd_flops,
                           host_s=ctx.backward_host_s(layer))
            self.after_backward(layer, op)

    def fp8_casts(self, layer: Layer, phase: str, deps: tuple[int, ...]) -> tuple[int, ...]:
        """Under ``--precision fp8``, ``fp8_cast L<i>`` on the compute stream before the layer's pass,
        after what the pass waits for; the pass then follows it in stream order."""
        seconds = self.ctx.fp8_cast_seconds(layer, "fwd" if phase == FORWARD else "bwd", self.n)
        if not seconds:
            return deps
        self.b.compute(fp8_cast(layer.index), phase, seconds, layer=layer.index, deps=deps)
        return ()

    def amp_casts(self, layer: Layer, deps: tuple[int, ...]) -> tuple[tuple[int, ...], Alloc]:
        """Under ``--precision amp``, ``amp_cast L<i>`` on the compute stream before the layer's forward:
        one cast kernel per weight, reading fp32 and writing bf16; the bf16 copies are buffers until
        the forward is done (the memory they free).  Returns the forward's deps and that free."""
        numel, held = self.ctx.amp_cast_numel(layer), self.computed_weight_bytes()
        if not numel or held == self.p.compute_bytes:  # weights already in the compute dtype: no cast
            return deps, ()
        written = numel * self.p.compute_bytes
        seconds = self.ctx.compute.copy_time(numel * held + written)
        self.b.compute(amp_cast(layer.index), FORWARD, seconds, layer=layer.index, deps=deps,
                       alloc=((BUFFERS, written),))
        return (), ((BUFFERS, written),)

    def update_layers(self, deps: tuple[int, ...], share: float = 1.0, layers=None) -> list[int]:
        """One ``opt L<i>`` per layer (every layer by default) on the compute stream, updating
        ``share`` of its trainable weights after ``deps``."""
        seconds, host = self.ctx.compute.optimizer_time, self.ctx.optimizer_host_s_per_param
        ops = []
        for layer in layers or self.w.layers:
            updated = int(layer.trainable_numel * share)
            ops.append(self.b.compute(opt(layer.index), OPTIMIZER, seconds(updated), layer=layer.index,
                                      deps=deps, host_s=host * updated if host is not None
                                      else self.ctx.update_host_s(layer)))
        return ops


class Strategy:
    """What the CLI and ``simulate()`` see: ``name``, ``summary``, ``knobs``, ``validate``, ``build``.

    Instances are shared singletons (``STRATEGIES``); each build makes a fresh ``Step``.  The
    ``knobs`` declarations are the one schema of the strategy's settings; ``Knobs`` is the frozen
    dataclass built from them that the step reads (``ctx.knobs.bucket_mb``)."""

    name: str = ""
    label: str = ""  # the strategy's name in figures (ZeRO-3)
    summary: str = ""
    can: Capabilities = Capabilities(stage=0, library=PYTORCH)  # what it can do (capabilities.py)
    knobs: tuple[Knob, ...] = ()
    Step: type[Step] = Step
    Knobs: type = settings_record("Knobs", ())

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.Knobs = settings_record(f"{cls.__name__}Knobs", cls.knobs, module=cls.__module__)

    def knob_values(self, values: dict[str, object]) -> object:
        """The strategy's typed knobs from checked values (defaults for those missing)."""
        return self.Knobs(**({k.name: k.default for k in self.knobs} | values))

    def step(self, ctx: Context) -> Step:
        """The step's builder, its model states placed and no op built yet."""
        return self.Step(ctx, self.can.stage)

    def build(self, ctx: Context) -> Program:
        return self.step(ctx).build()

    def validate(self, ctx: Context) -> None:
        """Refuse impossible knob values with one sentence (override to add checks)."""
