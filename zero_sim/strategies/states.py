"""The layer of model states: where each state of one rank lives, and how many bytes it holds.

A training step keeps three model states across steps, weights, gradients and optimizer state,
each cut from some buffers (the whole model, FSDP's wrap units, ZeRO-1/2's gradient buckets),
held in one dtype, and either whole on every rank or sharded over a group of ranks.  A
:class:`State` says all of that for one of them; :class:`ModelStates` holds the three, the
buffers a strategy keeps resident besides them, and where each lives (GPU or host, see
:mod:`zero_sim.strategies.offload`).

The ZeRO rule itself, which stage shards which state and what a rank holds of a sharded buffer,
is :mod:`zero_sim.vocabulary.model_states` (``sharded`` and ``held_elements``), the one place
the calculator and the real runs read as well; here it is applied to the buffers a strategy
really cuts, padded as collectives need (:func:`shard`).

A strategy's step says *which* buffers (``shard_units``, ``trainable_units``,
``gradient_units``) and *when* bytes move (its hooks); the ways bytes travel, and the features
that change them (offload, ZeRO++, the float8 all-gather), are plug-ins of this layer
(:mod:`zero_sim.strategies.transfers`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Protocol

from zero_sim.engine.program import ProgramBuilder
from zero_sim.system.workload import ceil_div
from zero_sim.vocabulary import BUFFERS, GRADS, OPTIMIZER_STATE, PARAMS
from zero_sim.vocabulary.model_states import held_elements, sharded

GPU, HOST = "gpu", "host"


def shard(numel: int, world_size: int) -> int:
    """Elements per rank when ``numel`` is split evenly, padding the last shard."""
    return ceil_div(numel, world_size)


@dataclass(frozen=True)
class State:
    """One model state of one rank: the buffers it is cut from and how a rank holds them."""

    category: str  # PARAMS, GRADS or OPTIMIZER_STATE
    units: tuple[int, ...]  # elements of each buffer the state is cut from
    dtype_bytes: int
    ranks: int  # the group a sharded state is split over
    is_sharded: bool
    whole: int = 0  # elements held whole on every rank although the state is sharded (persistent)
    padded: bool = False  # held whole in flat buffers padded to a multiple of ``ranks`` (ZeRO-1/2)
    stored_bytes: float = 0.0  # bytes held whole outside the buffers, as stored (frozen, 4-bit weights)
    device: str = GPU

    @property
    def elements(self) -> int:
        """Elements a rank holds: the vocabulary's rule over padded shards."""
        if self.padded and not self.is_sharded:
            return sum(shard(u, self.ranks) * self.ranks for u in self.units)
        return held_elements(self.units, self.ranks, self.is_sharded, shard, self.whole)

    @property
    def sharded_elements(self) -> int:
        """Elements of this rank's slice, the part a placement may move (persistent ones stay)."""
        return self.elements - self.whole

    @property
    def nbytes(self) -> int:
        return int(self.dtype_bytes * self.elements + self.stored_bytes)


@dataclass
class ModelStates:
    """A rank's model states by category, and the buffers kept resident beside them."""

    weights: State
    grads: State
    optimizer: State
    buffers: int = 0  # resident buffers (a reduce bucket, DDP's bucket copy of the gradients)
    host: dict[str, int] = field(default_factory=dict)  # bytes a placement moved to host memory
    nvme: dict[str, int] = field(default_factory=dict)  # bytes a placement moved on to NVMe drives

    @property
    def states(self) -> tuple[State, State, State]:
        return self.weights, self.grads, self.optimizer

    def on_gpu(self) -> dict[str, int]:
        """Bytes per category on the GPU (what ``Program.resident`` starts from)."""
        # An offloaded state leaves on the GPU only what is held whole (ZeRO-3's persistent weights).
        held = {s.category: (s.nbytes if s.device == GPU else s.dtype_bytes * s.whole) for s in self.states}
        return held | ({BUFFERS: self.buffers} if self.buffers else {})


def zero_states(stage: int, n: int, weights: tuple[int, ...], trained: tuple[int, ...],
                grads: tuple[int, ...], param_bytes: int, grad_bytes: int, optimizer_bytes: int,
                whole_weight_bytes: float, grad_copy_bytes: int = 0) -> ModelStates:
    """The states the ZeRO rule gives ``stage`` over ``n`` ranks: weights cut from ``weights``
    buffers (held as stored, ``whole_weight_bytes``, below the stage that shards them), gradients
    from ``grads`` and optimizer state from the ``trained`` buffers.

    Gradients held whole carry ``grad_copy_bytes`` more an element: the copy in the weights' dtype
    a framework keeps beside gradients it accumulates in fp32 (:class:`~zero_sim.strategies.base.Precision`);
    sharded, that copy is the unsharded buffer waiting for its reduction, a transient."""
    def state(category: str, units: tuple[int, ...], nbytes: int) -> State:
        return State(category, units, nbytes, n, sharded(stage, category))

    w = state(PARAMS, weights, param_bytes)
    if not w.is_sharded:  # weights held whole are stored as they are (a QLoRA base in 4-bit)
        w = replace(w, units=(), stored_bytes=whole_weight_bytes)
    g = state(GRADS, grads, grad_bytes)
    if not g.is_sharded and grad_copy_bytes:
        g = replace(g, dtype_bytes=grad_bytes + grad_copy_bytes)
    return ModelStates(w, g, state(OPTIMIZER_STATE, trained, optimizer_bytes))


class HostMoves(Protocol):
    """The ops a placement adds to one build: copies between GPU and host, and the host's update."""

    params: bool  # the weights live off the GPU too: each gather copies the rank's slice up first

    def grads_down(self, target: str | int, elements: int, grad_bytes: int, deps: tuple[int, ...],
                   phase: str, layer: int | None = None) -> int: ...

    def params_up(self, target: str | int, elements: int, param_bytes: int, phase: str,
                  layer: int | None = None, deps: tuple[int, ...] = ()) -> int: ...

    def update_on_cpu(self, params: int) -> None: ...


class Placement(Protocol):
    """A plug-in that keeps some model states off the GPU (offload.py, nvme.py)."""

    def place(self, states: ModelStates) -> ModelStates: ...

    def moves(self, b: ProgramBuilder) -> HostMoves: ...
