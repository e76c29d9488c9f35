"""FSDP2's float8 all-gather (``--fp8-all-gather``), a plug-in of the transfers: how many bytes a wrap
unit's gather moves, and the amax all-reduce torchao adds after the update.

Under ``--precision fp8`` with the float8 all-gather, a unit's float8 linear weights are cast
before the gather and travel at one byte an element, the rest at the param dtype's
(:mod:`zero_sim.system.fp8` holds the bytes and their sources).  After the update torchao's
``precompute_float8_dynamic_scale_for_fsdp`` reads every float8 weight's fp32 shard for its amax
and all-reduces the amaxes over the shard group, so the next step's casts have their scales.
Plainly (:class:`UnitGathers`) a unit gathers its elements at the param dtype and adds nothing.
"""

from __future__ import annotations

from zero_sim.engine.program import ProgramBuilder
from zero_sim.strategies.base import Context
from zero_sim.strategies.states import shard
from zero_sim.system.fp8 import FP32_SHARD_BYTES, Fp8Training
from zero_sim.system.workload import Layer
from zero_sim.vocabulary import ALL_REDUCE, OPTIMIZER, opt


class UnitGathers:
    """The plain way: a unit's weights gathered at the param dtype's bytes; nothing after the update."""

    def __init__(self, ctx: Context, gather_bytes: int):
        self.ctx, self.gather_bytes = ctx, gather_bytes

    def nbytes(self, layers: list[Layer], numel: int) -> int:
        """Bytes a unit of ``layers`` (``numel`` elements) gathers and holds gathered."""
        return numel * self.gather_bytes

    def after_update(self, b: ProgramBuilder, deps: tuple[int, ...], n: int, group: str) -> None:
        """What runs after the update of the rank's shards (``deps``)."""


class Float8AllGather(UnitGathers):
    """Float8 linear weights gathered at one byte an element, and the amax all-reduce after the update."""

    def __init__(self, ctx: Context, gather_bytes: int):
        super().__init__(ctx, gather_bytes)
        assert ctx.compute.fp8 is not None, "chosen only under --precision fp8"
        self.fp8: Fp8Training = ctx.compute.fp8

    @classmethod
    def applies(cls, ctx: Context) -> bool:
        return ctx.compute.fp8 is not None and ctx.compute.fp8.all_gather

    def nbytes(self, layers: list[Layer], numel: int) -> int:
        return self.fp8.gathered_bytes(layers, self.gather_bytes)

    def after_update(self, b: ProgramBuilder, deps: tuple[int, ...], n: int, group: str) -> None:
        """torchao's ``precompute_float8_dynamic_scale_for_fsdp``: every float8 weight's amax over its
        fp32 shard (one read of the shards), then one all-reduce of the amaxes over the shard group."""
        w = self.ctx.workload
        nbytes, _ = self.fp8.amax_bytes(w)
        shards = sum(shard(self.fp8.linears.weights, n) for layer in w.layers
                     if self.fp8.runs_gemms(layer.kind))
        seconds = self.ctx.compute.copy_time(shards * FP32_SHARD_BYTES)
        norm = b.compute(opt("amax"), OPTIMIZER, seconds, deps=deps)
        b.collective(ALL_REDUCE, f"{ALL_REDUCE} amax", nbytes, OPTIMIZER, group=group, deps=(norm,))


def unit_gathers(ctx: Context, gather_bytes: int) -> UnitGathers:
    """How this build's wrap units travel: as float8 where the settings turn it on, else plainly."""
    return (Float8AllGather if Float8AllGather.applies(ctx) else UnitGathers)(ctx, gather_bytes)
