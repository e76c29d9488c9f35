"""How a sharded step's bytes travel: the gathers of weights, the reductions of gradients, and the
update, as plain collectives; the features that change them are subclasses (plug-ins).

A ZeRO-3 step decides *when* to move bytes (which tensors to fetch, when to release them, when a
reduce bucket is full); it asks a :class:`WeightTransfers` *how*:

* ``gather(keys)``: one all-gather of the tensors ``keys`` over all ranks;
* ``ready(ops)``: the compute is about to wait on those gathers (nothing to do, plainly);
* ``released(keys)``: gathered tensors were freed (nothing to do, plainly);
* ``reduce(bucket)``: reduce-scatter a bucket of gradients, as one collective or one per tensor;
* ``optimizer(...)``: the update of the rank's slice once every reduction has landed.

A feature overrides some of these and keeps the rest: offloading copies slices between GPU and
host around them and updates on the CPU (:mod:`zero_sim.strategies.offload`); ZeRO++ quantizes
gathers and reductions and keeps a secondary copy of the weights (:mod:`zero_sim.strategies.zeropp`).
:mod:`zero_sim.strategies.features` chooses the one a build uses.  A plug-in reads the build
through :class:`ShardedWeights`, never the step itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from zero_sim.engine.program import ProgramBuilder
from zero_sim.strategies.base import Context, Precision
from zero_sim.strategies.states import HostMoves
from zero_sim.system.workload import Workload
from zero_sim.vocabulary import ALL_GATHER, BACKWARD, BUFFERS, REDUCE_SCATTER, layer_collective

Key = tuple[int, int]  # a partitioned tensor: (layer that owns it, its index in that layer)
Update = Callable[[tuple[int, ...], float], object]  # the step's update of its layers: (deps, share)


@dataclass
class Bucket:
    """DeepSpeed's reduce (ipg) bucket: gradients waiting for one reduce-scatter."""

    sizes: list[int] = field(default_factory=list)
    names: list[str] = field(default_factory=list)  # each gradient's tensor (a plug-in may reduce some apart)
    oversize_bytes: int = 0  # gradients too big to be copied in, reduced from their own memory
    last_op: int | None = None  # the backward that produced the last gradient added

    @property
    def elements(self) -> int:
        return sum(self.sizes)


@dataclass
class ShardedWeights:
    """What a transfer plug-in reads of one build: the program builder, the context, the ranks the
    weights are sharded over, each partitioned tensor's elements and those held whole."""

    b: ProgramBuilder
    ctx: Context
    n: int
    size: dict[Key, int]
    persistent: int  # elements of the tensors held whole on every rank
    host: HostMoves | None = None  # the placement's copies, when states live off the GPU
    # The compute whose release last freed gathered memory: a gather's buffer is that memory, so it
    # starts after it (ZeRO3Step.freed_room, docs/memory.md).
    room: tuple[int, ...] = ()

    @property
    def p(self) -> Precision:
        return self.ctx.precision

    @property
    def w(self) -> Workload:
        return self.ctx.workload


class WeightTransfers:
    """The plain ways: all-gathers over all ranks, reduce-scatters, the update on the GPU."""

    def __init__(self, s: ShardedWeights):
        self.s = s

    @classmethod
    def applies(cls, ctx: Context) -> bool:
        """Whether this way of moving bytes is the one the context asks for."""
        return True

    def gather(self, keys: list[Key], phase: str, after_compute: bool) -> list[tuple[list[Key], int]]:
        """All-gather ``keys`` in one call; returns each call's keys and the op they wait on."""
        s, layer = self.s, keys[0][0]
        nbytes = sum(s.size[key] for key in keys) * s.p.param_bytes
        op = s.b.collective(ALL_GATHER, layer_collective(ALL_GATHER, layer), nbytes, phase, layer=layer,
                            deps=s.room + self.before_gather(keys, phase), alloc=((BUFFERS, nbytes),),
                            after_compute=after_compute)
        return [(keys, op)]

    def before_gather(self, keys: list[Key], phase: str) -> tuple[int, ...]:
        """What a gather of ``keys`` must wait for besides the comm stream (nothing, plainly)."""
        return ()

    def ready(self, ops: tuple[int, ...], phase: str, layer: int) -> None:
        """The layer's compute is about to wait on the gathers ``ops``."""

    def released(self, keys: list[Key], layer: int, phase: str) -> None:
        """The gathered tensors ``keys`` were freed after ``layer`` computed."""

    def reduce(self, bucket: Bucket, index: int, layer: int, sizes: list[int],
               after_compute: bool) -> list[int]:
        """Reduce-scatter the bucket ``B<index>`` as collectives of ``sizes`` elements, after the backward
        that filled it; gradients reduced from their own memory are freed by the last."""
        s, name = self.s, f"{REDUCE_SCATTER} B{index}"
        ops = []
        for k, size in enumerate(sizes):
            last = k == len(sizes) - 1
            free = ((BUFFERS, bucket.oversize_bytes),) if bucket.oversize_bytes and last else ()
            ops.append(s.b.collective(REDUCE_SCATTER, name, size * s.p.travel_bytes, BACKWARD, layer=layer,
                                      deps=(bucket.last_op,), free=free, after_compute=after_compute))
        return ops

    def optimizer(self, reduces: tuple[int, ...], update: Update) -> None:
        """The rank's ``1/N`` of every layer, once every reduction has landed."""
        update(reduces, 1.0 / self.s.n)

    def describe(self) -> str:
        """What this way of moving bytes adds to the step's note ("" plainly)."""
        return ""
