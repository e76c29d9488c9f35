"""What every strategy shares: the context it builds from, its knobs, and the pieces of a
training step that do not depend on how state is sharded.

A strategy is one class with a ``name``, the ``knobs`` it accepts (each becomes a CLI
flag and a ``simulate()`` keyword), and ``build(ctx) -> Program``.  Adding a strategy is
adding a file under ``strategies/`` and one line in ``strategies/__init__.py``.

Shared pieces, so no strategy re-derives them:

* :class:`Precision`: bytes per parameter of weights, gradients and optimizer state
  (mixed-precision Adam: 2 + 2 + 12, the ZeRO paper's K = 12);
* :func:`forward` / :func:`backward`: per-layer compute ops with activation memory and
  recompute, with hooks before/after each layer where a strategy inserts communication;
* :func:`buckets`: tensors grouped in reverse order under a size cap, as DDP and
  DeepSpeed fill gradient buckets;
* :func:`shard`: a rank's share of ``n`` elements, padded as collectives require.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from zero_sim.engine.program import Program, ProgramBuilder
from zero_sim.system.hardware import ComputeModel
from zero_sim.system.workload import Layer, Workload, ceil_div
from zero_sim.vocabulary import (
    ACTIVATIONS,
    BACKWARD,
    FORWARD,
    bwd,
    fwd,
    recompute,
)
from zero_sim.vocabulary.buckets import fill_buckets


class StrategyError(ValueError):
    """A knob value the strategy cannot use; the message says how to fix it."""


@dataclass(frozen=True)
class Precision:
    name: str
    param_bytes: int
    grad_bytes: int
    optimizer_bytes: int  # K: bytes of optimizer state per parameter (fp32 master + Adam m, v)


PRECISIONS = {
    "mixed": Precision("mixed", 2, 2, 12),  # bf16 weights and grads, fp32 master/m/v (ZeRO paper)
    "fp32": Precision("fp32", 4, 4, 8),  # fp32 everything, Adam m and v (what CPU runs use)
}


@dataclass(frozen=True)
class Knob:
    """A strategy-specific setting: a CLI flag ``--name-with-dashes`` and a keyword ``name``."""

    name: str
    default: Any
    help: str
    kind: type = float
    choices: tuple | None = None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


@dataclass
class Context:
    workload: Workload
    world_size: int
    gpus_per_node: int
    compute: ComputeModel
    precision: Precision
    grad_accum: int = 1
    host_overhead_s: float = 10e-6
    knobs: dict[str, Any] = field(default_factory=dict)

    @property
    def nodes(self) -> int:
        return self.world_size // self.gpus_per_node

    def knob(self, name: str) -> Any:
        return self.knobs[name]

    def fwd_seconds(self, layer: Layer) -> float:
        return self.compute.layer_time(layer.kind, "fwd", layer.fwd_flops, self.workload.tokens_per_micro_batch)

    def bwd_seconds(self, layer: Layer) -> float:
        return self.compute.layer_time(layer.kind, "bwd", layer.bwd_flops, self.workload.tokens_per_micro_batch)

    def recompute_flops(self, layer: Layer) -> float:
        """Forward FLOPs re-run in backward: all of it (full), or attention's core (selective)."""
        mode = self.workload.recompute
        if mode == "none" or layer.kind != "block":
            return 0.0
        if mode == "full":
            return layer.fwd_flops
        s, b = self.workload.seq_len, self.workload.micro_batch
        h = self.workload.shape.d_model if self.workload.shape else 0
        return 4.0 * b * s * s * h

    def recompute_seconds(self, layer: Layer) -> float:
        flops = self.recompute_flops(layer)
        if not flops:
            return 0.0
        full = self.fwd_seconds(layer)
        return full if self.workload.recompute == "full" else full * flops / max(layer.fwd_flops, 1.0)


class Strategy:
    """Base class: subclasses set ``name``, ``knobs``, ``summary`` and implement ``build``."""

    name: str = ""
    summary: str = ""
    knobs: tuple[Knob, ...] = ()

    def build(self, ctx: Context) -> Program:
        raise NotImplementedError

    def validate(self, ctx: Context) -> None:
        """Refuse impossible knob values with one sentence (override to add checks)."""


def forward(b: ProgramBuilder, ctx: Context, *,
            before: Callable[[Layer], tuple[int, ...]] | None = None,
            after: Callable[[Layer, int], None] | None = None,
            frees: Callable[[Layer], tuple] | None = None) -> list[int]:
    """Emit ``fwd L<i>`` for every layer; ``before(layer)`` returns ops the layer must wait for.

    Each forward op allocates the activations the layer saves for backward (under the
    workload's recompute mode); :func:`backward` frees them.
    """
    ops = []
    for layer in ctx.workload.layers:
        deps = before(layer) if before else ()
        op = b.compute(
            fwd(layer.index), FORWARD, ctx.fwd_seconds(layer), layer=layer.index, deps=deps,
            alloc=((ACTIVATIONS, layer.checkpointed_activation_bytes),), flops=layer.fwd_flops,
            free=frees(layer) if frees else (),
        )
        ops.append(op)
        if after:
            after(layer, op)
    return ops


def backward(b: ProgramBuilder, ctx: Context, *,
             before: Callable[[Layer], tuple[int, ...]] | None = None,
             after: Callable[[Layer, int], None] | None = None,
             grads: Callable[[Layer], tuple] | None = None,
             frees: Callable[[Layer], tuple] | None = None) -> list[int]:
    """Emit ``[recompute L<i>] bwd L<i>`` from the last layer to the first.

    ``after(layer, op)`` is where gradient communication is launched: the layer's
    gradients exist once its backward op has run (post-accumulate-grad hooks fire there).
    ``grads(layer)`` lists memory the backward op allocates (unsharded gradients waiting
    to be reduced); ``frees(layer)`` memory it releases besides activations (gathered
    parameters).
    """
    ops = []
    for layer in reversed(ctx.workload.layers):
        deps = before(layer) if before else ()
        extra = layer.activation_bytes - layer.checkpointed_activation_bytes
        if ctx.workload.recompute != "none" and extra > 0:
            b.compute(recompute(layer.index), BACKWARD, ctx.recompute_seconds(layer), layer=layer.index,
                      deps=deps, alloc=((ACTIVATIONS, extra),), flops=ctx.recompute_flops(layer))
            deps = ()
            freed = layer.activation_bytes
        else:
            freed = layer.checkpointed_activation_bytes
        op = b.compute(bwd(layer.index), BACKWARD, ctx.bwd_seconds(layer), layer=layer.index, deps=deps,
                       alloc=grads(layer) if grads else (),
                       free=((ACTIVATIONS, freed),) + (frees(layer) if frees else ()), flops=layer.bwd_flops)
        ops.append(op)
        if after:
            after(layer, op)
    return ops


@dataclass(frozen=True)
class Bucket:
    index: int
    layers: tuple[int, ...]  # layer indices with tensors in this bucket, in the order they fill
    numel: int
    ready_after_layer: int  # the bucket is full once this layer's backward has run


def buckets(workload: Workload, cap_bytes: float, bytes_per_elem: int,
            first_cap_bytes: float | None = None) -> list[Bucket]:
    """The workload's tensors in gradient buckets by the shared rule
    (:func:`zero_sim.vocabulary.buckets.fill_buckets`), taken in reverse parameter order."""
    order = [(layer.index, tensor.numel) for layer in reversed(workload.layers) for tensor in reversed(layer.tensors)]
    plan = fill_buckets([numel * bytes_per_elem for _, numel in order], cap_bytes, first_cap_bytes)
    result = []
    for index, positions in enumerate(plan):
        layers = tuple(dict.fromkeys(order[i][0] for i in positions))  # in the order they fill
        result.append(Bucket(index, layers, sum(order[i][1] for i in positions), layers[-1]))
    return result


def shard(numel: int, world_size: int) -> int:
    """Elements per rank when ``numel`` is split evenly, padding the last shard."""
    return ceil_div(numel, world_size)

